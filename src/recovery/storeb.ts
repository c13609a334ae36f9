/**
 * Store B's voided purchases read back (docs/recovery.md, "Recovering missed notifications"):
 * Google lists every purchase it voided (refunded, canceled, charged back) for 30 days, while its
 * voided-purchase notification may never have arrived. Each listed purchase becomes the event its
 * notification would have made: `refund.issued`, `storeb.voided_purchase`, a developer
 * notification in Google's shape as `data`, the resource as Google returned it as `raw`, known by
 * its order id (`voided:<orderId>`), so that the notification and the list, whichever comes
 * second, are one event.
 */
import type { Sql } from "../db/connect.ts";
import type { Logger } from "../observability/log.ts";
import type { StorebCredentials } from "../storeb/credentials.ts";
import { objectOrEmpty, objectOrNull } from "../lib/json.ts";
import type { StorebVerifier } from "../storeb/verify.ts";
import { upstreamFailure } from "../storeb/lookup.ts";
import { googleApiError, parseJsonBody } from "../storeb/upstream.ts";
import { storebEvent, voidedPurchaseKey } from "../events/store_events.ts";
import { unstorableColumn } from "../events/ingest.ts";
import { sha256Hex } from "../lib/sha256.ts";
import {
  PageTokenRefused,
  type RecoveryStoring,
  type RecoveryTally,
  type RecoveryWindow,
  storeRecovered,
  type WindowEnd,
} from "./window.ts";

/** Voided purchases per page: the most Google sends. */
export const VOIDED_PAGE_SIZE = 1000;
/** Google's `voidedReason` of a purchase voided because it was not acknowledged in time. */
const UNACKNOWLEDGED_PURCHASE = 8;

/** What reading store B's voided purchases needs. */
export interface StorebRecoveryContext extends RecoveryStoring {
  storeb: StorebVerifier;
  /** For what earlier events say of a purchase token. */
  sql: Sql;
  /** One call's deadline, retries and the token included (`UPSTREAM_TIMEOUT`). */
  timeoutMs: number;
  /** Voided purchases per page; default {@linkcode VOIDED_PAGE_SIZE} (tests ask for fewer). */
  pageSize?: number;
}

/** A window of one tenant's voided purchases. */
export interface StorebWindow extends RecoveryWindow {
  credentials: StorebCredentials;
}

/** A voided purchase Google voided because it was not acknowledged in time. */
export interface UnacknowledgedVoid {
  orderId: string;
  eventId: string;
  voidedAt: string | null;
}

/** Says, once per order, that Google refunded a purchase nobody acknowledged. */
export function warnUnacknowledgedVoid(
  log: Logger,
  tenantId: string,
  voided: UnacknowledgedVoid,
): void {
  log.warn("purchase_voided_unacknowledged", {
    tenantId,
    orderId: voided.orderId,
    eventId: voided.eventId,
    voidedAt: voided.voidedAt,
    hint: "Google refunded this purchase because it was not acknowledged within 3 days: " +
      "the tenant's backend must acknowledge purchases (POST /v1/storeb/acknowledge)",
  });
}

/**
 * Reads `window` of the tenant's voided purchases, at most `window.maxPages` pages, adding what it
 * found to `tally` as it goes and each purchase voided for want of an acknowledgement to
 * `unacknowledged`.
 * @throws {ServiceError} 429 `RATE_LIMITED` (with Google's `Retry-After`), 502
 * `GOOGLE_API_ERROR`.
 * @throws {PageTokenRefused} when Google refuses `window.pageToken` or a later one.
 */
export async function readVoidedPurchases(
  context: StorebRecoveryContext,
  window: StorebWindow,
  tally: RecoveryTally,
  unacknowledged: UnacknowledgedVoid[],
): Promise<WindowEnd> {
  let token = window.pageToken;
  for (let page = 0; page < window.maxPages; page++) {
    window.signal.throwIfAborted();
    tally.storeCalls++;
    const answer = await context.storeb.voidedPurchases(window.credentials, {
      startTime: window.startMs,
      endTime: window.endMs,
      maxResults: context.pageSize ?? VOIDED_PAGE_SIZE,
      ...(token === null ? {} : { token }),
    }, { timeoutMs: context.timeoutMs, signal: window.signal });
    window.signal.throwIfAborted();
    if (answer.status === 400 && token !== null) {
      throw new PageTokenRefused("Google refused the page token (400)");
    }
    if (answer.status !== 200) throw upstreamFailure(answer);
    const body = objectOrNull(parseJsonBody(answer.text));
    const listed = body?.voidedPurchases ?? [];
    if (body === null || !Array.isArray(listed)) {
      throw googleApiError("the store B API answered a voided purchases list of the wrong shape", {
        status: 200,
        upstreamCode: null,
      });
    }
    tally.pages++;
    const productTypes = await productTypesOf(context.sql, window.tenantId, listed);
    for (const resource of listed) {
      window.signal.throwIfAborted();
      tally.checked++;
      await recoverOne(context, window, resource, productTypes, tally, unacknowledged);
    }
    const next = objectOrEmpty(body.tokenPagination).nextPageToken;
    token = typeof next === "string" && next !== "" ? next : null;
    await window.afterPage?.(token);
    if (token === null) return { nextPageToken: null };
  }
  return { nextPageToken: token };
}

/** One voided purchase as the event of its notification, stored unless known. */
async function recoverOne(
  context: StorebRecoveryContext,
  window: StorebWindow,
  resource: unknown,
  productTypes: Map<string, 1 | 2>,
  tally: RecoveryTally,
  unacknowledged: UnacknowledgedVoid[],
): Promise<void> {
  const { tenantId } = window;
  const refuse = (message: string) => {
    tally.invalid++;
    context.log.warn("recovery_notification_invalid", {
      tenantId,
      store: "storeb",
      via: context.via,
      error: "INVALID_REQUEST",
      message,
    });
  };
  const voided = objectOrNull(resource);
  const orderId = voided?.orderId;
  const purchaseToken = voided?.purchaseToken;
  const voidedTime = voided?.voidedTimeMillis;
  if (
    voided === null || typeof orderId !== "string" || orderId === "" ||
    typeof purchaseToken !== "string" || purchaseToken === "" ||
    !/^\d{1,16}$/.test(String(voidedTime))
  ) {
    refuse("a voided purchase without orderId, purchaseToken or voidedTimeMillis");
    return;
  }
  const notification = {
    version: "1.0",
    packageName: window.credentials.packageName,
    eventTimeMillis: String(voidedTime),
    voidedPurchaseNotification: {
      purchaseToken,
      orderId,
      productType: productTypes.get(purchaseToken) ?? null,
      refundType: voided.voidedQuantity === undefined ? 1 : 2,
    },
  };
  const key = voidedPurchaseKey(orderId);
  const event = storebEvent(tenantId, notification, { messageId: key, envelope: voided });
  const unstorable = unstorableColumn(event);
  if (unstorable !== null) {
    refuse(unstorable);
    return;
  }
  const receipt = await storeRecovered(context, event, tally, { source: "storeb" });
  if (voided.voidedReason === UNACKNOWLEDGED_PURCHASE) {
    unacknowledged.push({ orderId, eventId: receipt.eventId, voidedAt: event.occurredAt });
  }
}

/**
 * Google's `productType` (1 subscription, 2 one-time product) of each listed purchase token whose
 * latest earlier event of the tenant says it, in one statement per page: the voided purchase
 * does not say. A token without such an event is not in the map.
 */
export async function productTypesOf(
  sql: Sql,
  tenantId: string,
  listed: unknown[],
): Promise<Map<string, 1 | 2>> {
  const tokens = new Map<string, string>();
  for (const resource of listed) {
    const token = objectOrNull(resource)?.purchaseToken;
    if (typeof token === "string" && token !== "") tokens.set(sha256Hex(token), token);
  }
  const types = new Map<string, 1 | 2>();
  if (tokens.size === 0) return types;
  const rows = await sql`
    SELECT DISTINCT ON (subject_hash) subject_hash, platform_event FROM events
    WHERE tenant_id = ${tenantId} AND source = 'storeb'
      AND subject_hash = ANY(${[...tokens.keys()]}::text[])
    ORDER BY subject_hash, received_at DESC`;
  for (const row of rows) {
    const platformEvent = String(row.platform_event);
    const type = platformEvent.startsWith("storeb.subscription.")
      ? 1
      : platformEvent.startsWith("storeb.one_time_product.")
      ? 2
      : null;
    if (type !== null) types.set(tokens.get(String(row.subject_hash))!, type);
  }
  return types;
}
