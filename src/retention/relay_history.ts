/**
 * Retention of the relay's history (`EVENT_RETENTION_DAYS`): finished deliveries (`delivered` or
 * `failed`) untouched for that many days are deleted with their attempts, and so is their event
 * unless a store may still send its notification again: then only the event's payload goes, and its
 * row keeps the key that recognises the notification as a duplicate, until it is older than
 * `keyDays` (docs/relay.md, "Retention"). A `pending` delivery is never deleted, and so
 * neither is its event: the foreign key from `deliveries` would refuse to delete an event in use.
 *
 * Each batch is one statement (one short transaction) that takes up to a batch of one tenant's
 * old deliveries with `FOR UPDATE SKIP LOCKED`, so replicas pruning at the same time share the
 * rows instead of waiting on each other, and a delivery being requeued at that moment is either
 * left alone or seen as `pending` and skipped. It finds them on `deliveries_tenant`
 * (tenant, status, creation time), so no index had to be built on the grown table.
 */
import type { Sql } from "../db/connect.ts";
import { BatchPacer, type PruneOptions } from "./batches.ts";

/**
 * The longest a store sends a notification again, in days: a Pub/Sub subscription's `seek` replays
 * as far back as its topic keeps messages, 31 days at most (docs/relay.md, "Retention").
 */
export const STORE_REDELIVERY_DAYS = 31;

/**
 * Days an event's key is kept once its delivery is deleted: past the stores' redeliveries, and past
 * the age at which the store A receiver refuses a notification (`STOREA_NOTIFICATION_MAX_AGE`), so
 * that a genuine notification is never accepted twice however short the retention.
 */
export function eventKeyDays(storeaNotificationMaxAgeMs: number): number {
  return Math.max(STORE_REDELIVERY_DAYS, Math.ceil(storeaNotificationMaxAgeMs / 86_400_000));
}

/** What a prune of the relay's history deleted. */
export interface RelayPruneResult {
  deliveries: number;
  attempts: number;
  events: number;
  /** Events whose payload was deleted and whose key is kept, for now, against duplicates. */
  eventKeysKept: number;
  /** False when it was stopped (shutdown) before it ran out of rows to delete. */
  complete: boolean;
}

/** Options of {@linkcode pruneRelayHistory}. */
export interface RelayPruneOptions extends PruneOptions {
  /**
   * Days an event's key is kept after its delivery was deleted, so that a notification a store
   * sends again is still a duplicate: at least as long as any store redelivers.
   */
  keyDays: number;
}

/**
 * Deletes the finished deliveries and attempts older than `retentionDays`, with their events, or
 * only their events' payloads while the events are younger than `options.keyDays`; and the
 * emptied events once they are older.
 */
export async function pruneRelayHistory(
  sql: Sql,
  retentionDays: number,
  options: RelayPruneOptions,
): Promise<RelayPruneResult> {
  const result = { deliveries: 0, attempts: 0, events: 0, eventKeysKept: 0, complete: true };
  if (retentionDays <= 0) return result;
  const pacer = new BatchPacer(options);
  const [{ cutoff, keyCutoff }] = await sql`
    SELECT now() - make_interval(days => ${retentionDays}) AS cutoff,
           now() - make_interval(days => ${options.keyDays}) AS "keyCutoff"`;
  const tenants = await sql`SELECT id FROM tenants ORDER BY id`;
  for (const { id: tenantId } of tenants) {
    for (const status of FINISHED) {
      while (true) {
        const batch = await pacer.run(() =>
          deleteBatch(sql, { tenantId, status, cutoff, keyCutoff, limit: pacer.batchSize })
        );
        if (batch === null) return { ...result, complete: false };
        result.deliveries += batch.deliveries;
        result.attempts += batch.attempts;
        result.events += batch.events;
        result.eventKeysKept += batch.eventKeysKept;
        if (batch.deliveries < pacer.batchSize) break;
      }
    }
  }
  while (true) {
    const deleted = await pacer.run(() => deleteEmptiedEvents(sql, keyCutoff, pacer.batchSize));
    if (deleted === null) return { ...result, complete: false };
    result.events += deleted;
    if (deleted < pacer.batchSize) break;
  }
  return result;
}

/**
 * The states a delivery ends in. One at a time, so that a batch reads `deliveries_tenant` in
 * order and stops at its limit (with both, PostgreSQL scans every old row of the tenant).
 */
const FINISHED = ["delivered", "failed"] as const;

/**
 * One batch: up to `limit` of one tenant's deliveries in `status` last changed before `cutoff`,
 * oldest first, with their attempts, and their events: deleted when received before `keyCutoff`,
 * else emptied of their payload. One statement; the foreign keys are checked at its end, once
 * every delete is done.
 */
async function deleteBatch(
  sql: Sql,
  batch: { tenantId: string; status: string; cutoff: Date; keyCutoff: Date; limit: number },
): Promise<{ deliveries: number; attempts: number; events: number; eventKeysKept: number }> {
  // created_at walks the index; updated_at spares deliveries retried since.
  const [row] = await sql`
    WITH chosen AS (
      SELECT id FROM deliveries
      WHERE tenant_id = ${batch.tenantId}
        AND status = ${batch.status}
        AND created_at < ${batch.cutoff}
        AND updated_at < ${batch.cutoff}
      ORDER BY created_at
      LIMIT ${batch.limit}
      FOR UPDATE SKIP LOCKED
    ), attempts AS (
      DELETE FROM delivery_attempts a USING chosen
      WHERE a.delivery_id = chosen.id
      RETURNING a.id
    ), deliveries AS (
      DELETE FROM deliveries d USING chosen
      WHERE d.id = chosen.id
      RETURNING d.event_id
    ), events AS (
      DELETE FROM events e USING deliveries
      WHERE e.id = deliveries.event_id AND e.received_at < ${batch.keyCutoff}
      RETURNING e.id
    ), emptied AS (
      UPDATE events e SET payload = '' FROM deliveries
      WHERE e.id = deliveries.event_id AND e.received_at >= ${batch.keyCutoff}
      RETURNING e.id
    )
    SELECT (SELECT count(*)::int FROM deliveries) AS deliveries,
           (SELECT count(*)::int FROM attempts) AS attempts,
           (SELECT count(*)::int FROM events) AS events,
           (SELECT count(*)::int FROM emptied) AS "eventKeysKept"`;
  return {
    deliveries: row.deliveries,
    attempts: row.attempts,
    events: row.events,
    eventKeysKept: row.eventKeysKept,
  };
}

/**
 * Up to `limit` events emptied by an earlier prune and received before `keyCutoff`, deleted in one
 * statement: their keys have outlived every redelivery. An emptied event has no delivery left;
 * the check says so to the foreign key rather than trusting it.
 */
async function deleteEmptiedEvents(sql: Sql, keyCutoff: Date, limit: number): Promise<number> {
  const [row] = await sql`
    WITH chosen AS (
      SELECT id FROM events e
      WHERE payload = '' AND received_at < ${keyCutoff}
        AND NOT EXISTS (SELECT FROM deliveries d WHERE d.event_id = e.id)
      ORDER BY received_at
      LIMIT ${limit}
      FOR UPDATE SKIP LOCKED
    ), deleted AS (
      DELETE FROM events e USING chosen WHERE e.id = chosen.id RETURNING e.id
    )
    SELECT count(*)::int AS deleted FROM deleted`;
  return row.deleted;
}
