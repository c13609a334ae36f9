/**
 * Ingest: a verified notification becomes an event and its delivery, committed together in one
 * statement (so one transaction, `delivery/enqueue.ts`) before the receiver answers 200, so an
 * acknowledged notification is never lost. Deduplication is the database's:
 * `UNIQUE (tenant_id, source, external_id)`.
 */
import { sha256Hex } from "../lib/sha256.ts";
import type { Sql } from "../db/connect.ts";
import { type EventRow, insertEvent } from "../delivery/enqueue.ts";
import { newId } from "../lib/ids.ts";
import type { CatalogEntry } from "./catalog.ts";
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

/**
 * Why the notification cannot be stored, or null: its keys and platform event are text columns,
 * which cannot hold U+0000 (the database refuses the row) nor keep an unpaired surrogate (two
 * ids would become one). The payload is safe: JSON escapes both. A receiver refuses such a
 * notification 400; a recovery counts it invalid.
 */
export function unstorableColumn(notification: VerifiedNotification): string | null {
  const columns = [
    ["id", notification.externalId],
    ["id", dedupKeyOf(notification)],
    ["type", notification.entry.platformEvent],
  ];
  for (const [what, value] of columns) {
    if (value.includes("\u0000") || !value.isWellFormed()) {
      return `the notification's ${what} holds a NUL or an unpaired surrogate`;
    }
  }
  return null;
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

/** The row `insertEvent` and `insertEvents` store for a prepared notification. */
export function eventRowOf(prepared: PreparedIngest): EventRow {
  const { notification } = prepared;
  return {
    eventId: prepared.eventId,
    deliveryId: prepared.deliveryId,
    tenantId: notification.tenantId,
    source: notification.source,
    dedupKey: dedupKeyOf(notification),
    event: notification.entry.event,
    platformEvent: notification.entry.platformEvent,
    payload: prepared.payload,
    receivedAt: prepared.receivedAt,
    sandbox: notification.sandbox === true,
    needsState: notification.needsState === true,
    subjectHash: prepared.subjectHash,
  };
}

/** Stores one prepared notification on its own (one statement, so one transaction). */
export async function ingestPrepared(sql: Sql, prepared: PreparedIngest): Promise<Receipt> {
  const { eventId, deliveryId } = prepared;
  const { tenantId, source, externalId } = prepared.notification;
  const status = await insertEvent(sql, eventRowOf(prepared));
  if (status !== null) {
    return {
      eventId,
      externalId,
      isNew: true,
      enqueuedDelivery: status === "pending",
      deliveryId,
      handedOver: false,
    };
  }
  // A duplicate answers with the first receipt's event id and creates nothing.
  const [first] = await sql`
    SELECT id FROM events
    WHERE tenant_id = ${tenantId} AND source = ${source}
      AND external_id = ${dedupKeyOf(prepared.notification)}`;
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
