/**
 * Ingest: a verified notification becomes an event and its delivery, committed together in one
 * statement (so one transaction) before the receiver answers 200, so an acknowledged notification
 * is never lost. Deduplication is the database's: `UNIQUE (tenant_id, source, external_id)`.
 */
import type { Sql } from "../db/connect.ts";
import { newId } from "../ids.ts";
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
  entry: CatalogEntry;
  /** The decoded notification: store A's signed payload, store B's developer notification. */
  data: unknown;
  /** The original decoded JWS payload, or the push envelope. */
  raw: unknown;
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

/**
 * Stores `notification` as an event with its delivery, or finds the event it duplicates.
 * A tenant without a callback URL still gets its event and a delivery, stored `failed` so that
 * `deliveries retry` can send it once a callback is set.
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
  });
  return { notification, eventId, deliveryId: newId("dlv"), receivedAt, payload };
}

/** Stores one prepared notification on its own (one statement, so one transaction). */
export async function ingestPrepared(sql: Sql, prepared: PreparedIngest): Promise<Receipt> {
  const { eventId, deliveryId, receivedAt, payload } = prepared;
  const { tenantId, source, externalId, entry } = prepared.notification;
  // One statement, so one atomic transaction without a client-side BEGIN: npm:postgres 3.4.9
  // can send a BEGIN without reserving its connection under load (porsager/postgres#1189).
  const [stored] = await sql`
    WITH event AS (
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                          received_at)
      VALUES (${eventId}, ${tenantId}, ${source}, ${externalId}, ${entry.event},
              ${entry.platformEvent}, ${payload}, ${receivedAt})
      ON CONFLICT (tenant_id, source, external_id) DO NOTHING
      RETURNING id, tenant_id
    ), delivery AS (
      INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at, last_error)
      SELECT ${deliveryId}, event.id, event.tenant_id,
             CASE WHEN t.callback_url IS NULL THEN 'failed' ELSE 'pending' END,
             CASE WHEN t.callback_url IS NULL THEN NULL ELSE ${receivedAt}::timestamptz END,
             CASE WHEN t.callback_url IS NULL THEN ${NO_CALLBACK_ERROR} END
      FROM event JOIN tenants t ON t.id = event.tenant_id
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
    WHERE tenant_id = ${tenantId} AND source = ${source} AND external_id = ${externalId}`;
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
