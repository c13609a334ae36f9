/**
 * Ingest: a verified notification becomes an event and its delivery, committed together in one
 * statement (so one transaction) before the receiver answers 200, so an acknowledged notification
 * is never lost. Deduplication is the database's: `UNIQUE (tenant_id, source, external_id)`.
 */
import type postgres from "postgres";
import { createHash } from "node:crypto";
import type { Sql } from "../db/connect.ts";
import { routedCallbackUrl } from "../db/tenants.ts";
import { newId } from "../lib/ids.ts";
import type { CatalogEntry } from "./catalog.ts";
import { eventFilterMatch } from "./filter.ts";
import { serializePayload } from "./payload.ts";

/** Where a notification came from: the delivery's `source`. */
export type EventSource = "storea" | "storeb";

/** A verified, classified notification ready to be stored. */
export interface VerifiedNotification {
  tenantId: string;
  source: EventSource;
  /** Store A notification UUID or store B message id: the deduplication key. */
  externalId: string;
  /**
   * The deduplication key when it is not `externalId`: store B voided purchases are known by their
   * order id, whether a notification or Google's voided purchases list brought them.
   */
  dedupKey?: string;
  entry: CatalogEntry;
  /** The decoded notification: store A's signed payload, store B's developer notification. */
  data: unknown;
  /** The original decoded JWS payload, or the push envelope. */
  raw: unknown;
  /**
   * A store A Sandbox notification: its delivery goes to the tenant's sandbox callback URL when
   * there is one (docs/configuration.md, "Routing deliveries").
   */
  sandbox?: boolean;
  /** The store's own time of the event, ISO-8601, or null when it did not say. */
  occurredAt: string | null;
  /** The purchase's state the notification itself carries (store A), or null. */
  state: unknown;
  /**
   * The state is to be fetched from the store before the first attempt (store B purchases),
   * unless the tenant turned that off (docs/deliveries.md, "State on every delivery").
   */
  needsState?: boolean;
}

/** The key that makes a notification a duplicate: its dedup key, or its external id. */
export function dedupKeyOf(notification: VerifiedNotification): string {
  return notification.dedupKey ?? notification.externalId;
}

/** The receiver's 200 answer, plus the delivery created (null for a duplicate). */
export interface Receipt {
  eventId: string;
  externalId: string;
  isNew: boolean;
  enqueuedDelivery: boolean;
  deliveryId: string | null;
  /**
   * The delivery was committed leased to this process's dispatcher, which was handed its first
   * attempt in memory: nothing needs to claim it (docs/architecture.md, "Handing over the first
   * attempt").
   */
  handedOver: boolean;
}

/** Why a delivery was stored as failed at once: there was nowhere to send it. */
export const NO_CALLBACK_ERROR =
  "no callback URL was configured when the event arrived; set one, then run deliveries retry";

/** Why a delivery was stored as failed at once: the tenant's event filter leaves its event out. */
export const FILTERED_OUT_ERROR =
  "the tenant's event filter did not include this event when it arrived (tenant set-events); " +
  "deliveries retry sends it anyway";

/**
 * Where a new delivery of the tenant aliased `t` goes, and whether it is wanted, as a lateral
 * subquery `route(url, wanted)`: its routed callback URL (null: nowhere) and whether the
 * tenant's event filter lets `event` through.
 */
export function deliveryRoute(
  sql: Sql,
  row: { event: postgres.Fragment; sandbox: postgres.Fragment },
) {
  return sql`CROSS JOIN LATERAL (
    SELECT ${routedCallbackUrl(sql, row.sandbox)} AS url,
           ${eventFilterMatch(sql, row.event)} AS wanted
  ) route`;
}

/**
 * A new delivery's status, first due time and error, from its `route` ({@linkcode deliveryRoute}):
 * pending when it has somewhere to go and is wanted, else failed at once with the reason.
 */
export function newDeliveryState(sql: Sql, receivedAt: postgres.Fragment) {
  return sql`
    CASE WHEN route.url IS NOT NULL AND route.wanted THEN 'pending' ELSE 'failed' END,
    CASE WHEN route.url IS NOT NULL AND route.wanted THEN ${receivedAt} END,
    CASE WHEN route.url IS NULL THEN ${NO_CALLBACK_ERROR}
         WHEN NOT route.wanted THEN ${FILTERED_OUT_ERROR} END`;
}

/**
 * Stores `notification` as an event with its delivery, or finds the event it duplicates.
 * A tenant without a callback URL, or whose event filter leaves the event out, still gets its
 * event and a delivery, stored `failed` so that `deliveries retry` can send it later.
 */
export async function ingestNotification(
  sql: Sql,
  notification: VerifiedNotification,
): Promise<Receipt> {
  return await ingestPrepared(sql, prepareIngest(notification));
}

/** A notification with its ids, receipt time and serialized payload, ready for the INSERT. */
export interface PreparedIngest {
  notification: VerifiedNotification;
  eventId: string;
  deliveryId: string;
  receivedAt: Date;
  payload: string;
  /** SHA-256 hex of a store B event's subject key (its purchase token); null otherwise. */
  subjectHash: string | null;
}

/** Gives a notification its event and delivery ids and serializes the payload sent. */
export function prepareIngest(notification: VerifiedNotification): PreparedIngest {
  const { tenantId, source, externalId, entry } = notification;
  const eventId = newId("evt");
  const receivedAt = new Date();
  const payload = serializePayload({
    ...entry,
    eventId,
    externalId,
    timestamp: receivedAt.toISOString(),
    tenantId,
    source,
    data: notification.data,
    raw: notification.raw,
    occurredAt: notification.occurredAt,
    state: notification.state,
  });
  const subjectKey = source === "storeb" ? entry.subject?.key ?? null : null;
  return {
    notification,
    eventId,
    deliveryId: newId("dlv"),
    receivedAt,
    payload,
    subjectHash: subjectKey === null ? null : sha256Hex(subjectKey),
  };
}

/** SHA-256 of `text` in hex: how a store B purchase token is found among events. */
export function sha256Hex(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

/** Stores one prepared notification on its own (one statement, so one transaction). */
export async function ingestPrepared(sql: Sql, prepared: PreparedIngest): Promise<Receipt> {
  const { eventId, deliveryId, receivedAt, payload, subjectHash } = prepared;
  const { tenantId, source, externalId, entry } = prepared.notification;
  const dedupKey = dedupKeyOf(prepared.notification);
  const sandbox = prepared.notification.sandbox === true;
  const needsState = prepared.notification.needsState === true;
  // One statement, so one atomic transaction without a client-side BEGIN: npm:postgres 3.4.9
  // can send a BEGIN without reserving its connection under load (porsager/postgres#1189).
  const [stored] = await sql`
    WITH event AS (
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                          received_at, subject_hash)
      VALUES (${eventId}, ${tenantId}, ${source}, ${dedupKey}, ${entry.event},
              ${entry.platformEvent}, ${payload}, ${receivedAt}, ${subjectHash})
      ON CONFLICT (tenant_id, source, external_id) DO NOTHING
      RETURNING id, tenant_id
    ), delivery AS (
      INSERT INTO deliveries (id, event_id, tenant_id, sandbox, state_pending, status,
                              next_attempt_at, last_error)
      SELECT ${deliveryId}, event.id, event.tenant_id, ${sandbox},
             ${needsState} AND t.storeb_state_fetch,
             ${newDeliveryState(sql, sql`${receivedAt}::timestamptz`)}
      FROM event JOIN tenants t ON t.id = event.tenant_id
      ${deliveryRoute(sql, { event: sql`${entry.event}::text`, sandbox: sql`${sandbox}` })}
      RETURNING status
    )
    SELECT (SELECT status FROM delivery) AS status`;
  if (stored.status !== null) {
    const enqueued = stored.status === "pending";
    return {
      eventId,
      externalId,
      isNew: true,
      enqueuedDelivery: enqueued,
      deliveryId,
      handedOver: false,
    };
  }
  // A duplicate answers with the first receipt's event id and creates nothing.
  const [first] = await sql`
    SELECT id FROM events
    WHERE tenant_id = ${tenantId} AND source = ${source} AND external_id = ${dedupKey}`;
  return duplicateReceipt(first.id, externalId);
}

/** The receipt of a duplicate: the first receipt's event id, nothing created. */
export function duplicateReceipt(eventId: string, externalId: string): Receipt {
  return {
    eventId,
    externalId,
    isNew: false,
    enqueuedDelivery: false,
    deliveryId: null,
    handedOver: false,
  };
}
