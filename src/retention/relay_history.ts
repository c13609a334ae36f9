/**
 * Retention of the relay's history (`EVENT_RETENTION_DAYS`): finished deliveries (`delivered` or
 * `failed`) untouched for that many days are deleted with their attempts and their event. A
 * `pending` delivery is never deleted, and so neither is its event: each event has exactly one
 * delivery, and the foreign key from `deliveries` would refuse to delete an event still in use.
 *
 * Each batch is one statement (one short transaction) that takes up to a batch of one tenant's
 * old deliveries with `FOR UPDATE SKIP LOCKED`, so replicas pruning at the same time share the
 * rows instead of waiting on each other, and a delivery being requeued at that moment is either
 * left alone or seen as `pending` and skipped. It finds them on `deliveries_tenant`
 * (tenant, status, creation time), so no index had to be built on the grown table.
 */
import type { Sql } from "../db/connect.ts";
import { BatchPacer, type PruneOptions } from "./batches.ts";

/** What a prune of the relay's history deleted. */
export interface RelayPruneResult {
  deliveries: number;
  attempts: number;
  events: number;
  /** False when it was stopped (shutdown) before it ran out of rows to delete. */
  complete: boolean;
}

/** Deletes the finished deliveries, attempts and events older than `retentionDays`. */
export async function pruneRelayHistory(
  sql: Sql,
  retentionDays: number,
  options: PruneOptions = {},
): Promise<RelayPruneResult> {
  const result = { deliveries: 0, attempts: 0, events: 0, complete: true };
  if (retentionDays <= 0) return result;
  const pacer = new BatchPacer(options);
  const [{ cutoff }] = await sql`
    SELECT now() - make_interval(days => ${retentionDays}) AS cutoff`;
  const tenants = await sql`SELECT id FROM tenants ORDER BY id`;
  for (const { id: tenantId } of tenants) {
    for (const status of FINISHED) {
      while (true) {
        const batch = await pacer.run(() =>
          deleteBatch(sql, { tenantId, status, cutoff, limit: pacer.batchSize })
        );
        if (batch === null) return { ...result, complete: false };
        result.deliveries += batch.deliveries;
        result.attempts += batch.attempts;
        result.events += batch.events;
        if (batch.deliveries < pacer.batchSize) break;
      }
    }
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
 * oldest first, with their attempts and events, in one statement. The foreign keys are checked
 * at its end, once all three deletes are done.
 */
async function deleteBatch(
  sql: Sql,
  batch: { tenantId: string; status: string; cutoff: Date; limit: number },
): Promise<{ deliveries: number; attempts: number; events: number }> {
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
      WHERE e.id = deliveries.event_id
      RETURNING e.id
    )
    SELECT (SELECT count(*)::int FROM deliveries) AS deliveries,
           (SELECT count(*)::int FROM attempts) AS attempts,
           (SELECT count(*)::int FROM events) AS events`;
  return { deliveries: row.deliveries, attempts: row.attempts, events: row.events };
}
