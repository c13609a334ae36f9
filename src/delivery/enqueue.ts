/**
 * The statements that put a verified notification on the delivery queue: its event and its
 * delivery, in one statement (so one transaction), one notification at a time or a batch of them
 * (docs/architecture.md, "Group-commit ingest"). The receivers prepare the rows
 * (`events/ingest.ts`, `events/ingest_batch.ts`); where each delivery goes and whether it is
 * wanted is decided here, in SQL, from the tenant's row as the statement reads it.
 *
 * A tenant without a callback URL, or whose event filter leaves the event out, still gets its
 * event and a delivery, stored `failed` so that `deliveries retry` can send it later. A duplicate
 * (same tenant, source and key) stores nothing: the event's unique key drops it.
 */
import type postgres from "postgres";
import type { Sql } from "../db/connect.ts";
import {
  leasesHeld,
  routedCallbackUrl,
  type SealedTarget,
  sealedTargetColumns,
  sealedTargetOf,
} from "./targets.ts";

/** An event to store with its delivery. */
export interface EventRow {
  eventId: string;
  deliveryId: string;
  tenantId: string;
  source: string;
  /** The key duplicates share (the `external_id` column). */
  dedupKey: string;
  event: string;
  platformEvent: string;
  payload: string;
  receivedAt: Date;
  /** A store A Sandbox notification: it goes to the sandbox callback URL when there is one. */
  sandbox: boolean;
  /** Its payload waits for the purchase's state, when the tenant lets the service fetch it. */
  needsState: boolean;
  /** SHA-256 hex of a store B event's subject key (its purchase token); null otherwise. */
  subjectHash: string | null;
}

/** What became of a row that was stored (not a duplicate). */
export interface StoredRow {
  eventId: string;
  /** `pending`, or `failed` at once when it had nowhere to go or was filtered out. */
  status: "pending" | "failed";
  /** Committed leased to the hand-over's owner (see {@linkcode BatchHandOver}). */
  handed: boolean;
  statePending: boolean;
  /** The tenant's target as the statement read it, its secrets still sealed. */
  target: SealedTarget;
}

/**
 * How a batch may lease new deliveries to this process's dispatcher (docs/architecture.md,
 * "Handing over the first attempt"): a row with a rank above 0 is leased to `owner` when its
 * tenant's leases plus its rank fit `cap`, and only while the tenant's callback is healthy and
 * nothing of the tenant's is waiting.
 */
export interface BatchHandOver {
  owner: string;
  leaseMs: number;
  cap: number;
}

/** Why a delivery was stored as failed at once: there was nowhere to send it. */
export const NO_CALLBACK_ERROR =
  "no callback URL was configured when the event arrived; set one, then run deliveries retry";

/** Why a delivery was stored as failed at once: the tenant's event filter leaves its event out. */
export const FILTERED_OUT_ERROR =
  "the tenant's event filter did not include this event when it arrived (tenant set-events); " +
  "deliveries retry sends it anyway";

/**
 * Stores one event with its delivery. Its delivery's status, or null when the event was a
 * duplicate and nothing was stored.
 */
export async function insertEvent(sql: Sql, row: EventRow): Promise<"pending" | "failed" | null> {
  // One statement, so one atomic transaction without a client-side BEGIN: npm:postgres 3.4.9
  // can send a BEGIN without reserving its connection under load (porsager/postgres#1189).
  const [stored] = await sql`
    WITH event AS (
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                          received_at, subject_hash)
      VALUES (${row.eventId}, ${row.tenantId}, ${row.source}, ${row.dedupKey}, ${row.event},
              ${row.platformEvent}, ${row.payload}, ${row.receivedAt}, ${row.subjectHash})
      ON CONFLICT (tenant_id, source, external_id) DO NOTHING
      RETURNING id, tenant_id
    ), delivery AS (
      INSERT INTO deliveries (id, event_id, tenant_id, sandbox, state_pending, status,
                              next_attempt_at, last_error)
      SELECT ${row.deliveryId}, event.id, event.tenant_id, ${row.sandbox},
             ${row.needsState} AND t.storeb_state_fetch,
             ${newDeliveryState(sql, sql`${row.receivedAt}::timestamptz`)}
      FROM event JOIN tenants t ON t.id = event.tenant_id
      ${deliveryRoute(sql, { event: sql`${row.event}::text`, sandbox: sql`${row.sandbox}` })}
      RETURNING status
    )
    SELECT (SELECT status FROM delivery) AS status`;
  return stored.status;
}

/**
 * Stores a batch of events with their deliveries in one statement, in the order given (callers
 * sort by key, so that two batches never wait on each other's unique keys in opposite orders).
 * `handRanks[i]` is row i's rank among its tenant's rows reserved for the hand-over, 0 when not
 * reserved. Returns the rows stored, by event id; a row missing from it was a duplicate.
 */
export async function insertEvents(
  sql: Sql,
  rows: readonly EventRow[],
  handRanks: readonly number[],
  handOver: BatchHandOver | null,
): Promise<Map<string, StoredRow>> {
  const cap = handOver?.cap ?? 0;
  // One parameter per value (not arrays): a 16 KB payload is not escaped into an array literal.
  const values = rows.map((row, ord) => [
    row.eventId,
    row.tenantId,
    row.source,
    row.dedupKey,
    row.event,
    row.platformEvent,
    row.payload,
    row.receivedAt.toISOString(),
    row.deliveryId,
    String(ord),
    // 0: not reserved (the values of a VALUES list cannot be null here).
    String(handRanks[ord] ?? 0),
    row.sandbox ? "1" : "0",
    row.needsState ? "1" : "0",
    row.subjectHash ?? "",
  ]);
  if (sql.options.prepare) {
    // A client that prepares its statements makes one per VALUES length, each planned afresh at
    // its first runs: padded to a power of two, a connection keeps nine plans, not 256
    // (docs/architecture.md, "Group-commit ingest"). Blank rows are skipped by their empty id;
    // every value stays a string, so the parameter types, part of the statement's name, stay.
    const blank = ["", "", "", "", "", "", "", BLANK_TIME, "", "0", "0", "0", "0", ""];
    while (values.length & (values.length - 1)) values.push(blank);
  }
  const stored = await sql`
    WITH input AS (
      SELECT id, tenant_id, source, external_id, event, platform_event, payload,
             received_at::timestamptz AS received_at, delivery_id, ord::int AS ord,
             hand_rank::int AS hand_rank, sandbox = '1' AS sandbox,
             needs_state = '1' AS needs_state, nullif(subject_hash, '') AS subject_hash
      FROM (VALUES ${sql(values)}) AS i(id, tenant_id, source, external_id, event,
                                        platform_event, payload, received_at, delivery_id, ord,
                                        hand_rank, sandbox, needs_state, subject_hash)
      WHERE id <> ''
    ), event AS (
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                          received_at, subject_hash)
      SELECT id, tenant_id, source, external_id, event, platform_event, payload, received_at,
             subject_hash
      FROM input ORDER BY ord
      ON CONFLICT (tenant_id, source, external_id) DO NOTHING
      RETURNING id, tenant_id
    ), delivery AS (
      INSERT INTO deliveries (id, event_id, tenant_id, sandbox, state_pending, status,
                              next_attempt_at, last_error, lease_owner, lease_expires_at)
      SELECT input.delivery_id, event.id, event.tenant_id, input.sandbox,
             input.needs_state AND t.storeb_state_fetch,
             ${newDeliveryState(sql, sql`input.received_at`)},
             CASE WHEN hand.over THEN ${handOver?.owner ?? null}::text END,
             CASE WHEN hand.over
                  THEN now() + ${handOver?.leaseMs ?? 0} * interval '1 millisecond' END
      FROM event JOIN input ON input.id = event.id JOIN tenants t ON t.id = event.tenant_id
      ${deliveryRoute(sql, { event: sql`input.event`, sandbox: sql`input.sandbox` })}
      -- The statement's snapshot does not see the rows it inserts: the leases and the waiting
      -- deliveries counted here are those committed before it (see DeliveryHandOver).
      CROSS JOIN LATERAL (
        SELECT input.hand_rank > 0
           AND t.active AND route.url IS NOT NULL AND route.wanted
           AND t.delivery_failure_streak = 0
           AND input.hand_rank + ${leasesHeld(sql, cap)} <= ${cap}
           -- No delivery of the tenant waits: an ordered probe of the pending index, which stops
           -- at the first. As NOT EXISTS, statistics taken during a backlog made it a scan of
           -- the whole table once the backlog had drained
           -- (docs/architecture.md, "Queue statements and stale statistics").
           AND (SELECT w.id FROM deliveries w
                WHERE w.tenant_id = t.id AND w.status = 'pending'
                  AND w.next_attempt_at <= now()
                  AND (w.lease_expires_at IS NULL OR w.lease_expires_at <= now())
                ORDER BY w.next_attempt_at
                LIMIT 1) IS NULL AS over
      ) hand
      RETURNING event_id, tenant_id, sandbox, state_pending, status,
                lease_owner IS NOT NULL AS handed
    )
    SELECT d.event_id, d.status, d.handed, d.state_pending,
           ${sealedTargetColumns(sql, sql`d.sandbox`)}
    FROM delivery d JOIN tenants t ON t.id = d.tenant_id`;
  return new Map(stored.map((row) => [row.event_id as string, {
    eventId: row.event_id,
    status: row.status,
    handed: row.handed,
    statePending: row.state_pending,
    target: sealedTargetOf(row),
  }]));
}

/** The receipt time of a blank row, which is never stored. */
const BLANK_TIME = new Date(0).toISOString();

/**
 * Where a new delivery of the tenant aliased `t` goes, and whether it is wanted, as a lateral
 * subquery `route(url, wanted)`: its routed callback URL (null: nowhere) and whether the
 * tenant's event filter lets `event` through.
 */
function deliveryRoute(sql: Sql, row: { event: postgres.Fragment; sandbox: postgres.Fragment }) {
  return sql`CROSS JOIN LATERAL (
    SELECT ${routedCallbackUrl(sql, row.sandbox)} AS url,
           ${eventFilterMatch(sql, row.event)} AS wanted
  ) route`;
}

/**
 * A new delivery's status, first due time and error, from its `route` ({@linkcode deliveryRoute}):
 * pending when it has somewhere to go and is wanted, else failed at once with the reason.
 */
function newDeliveryState(sql: Sql, receivedAt: postgres.Fragment) {
  return sql`
    CASE WHEN route.url IS NOT NULL AND route.wanted THEN 'pending' ELSE 'failed' END,
    CASE WHEN route.url IS NOT NULL AND route.wanted THEN ${receivedAt} END,
    CASE WHEN route.url IS NULL THEN ${NO_CALLBACK_ERROR}
         WHEN NOT route.wanted THEN ${FILTERED_OUT_ERROR} END`;
}

/**
 * Whether the event `event` passes the filter of the tenant aliased `t`: the SQL of
 * `matchesEventFilter` (`events/filter.ts`); change both together.
 */
function eventFilterMatch(sql: Sql, event: postgres.Fragment) {
  return sql`(t.event_filter IS NULL OR EXISTS (
    SELECT FROM unnest(t.event_filter) AS f(pattern)
    WHERE f.pattern = ${event}
       OR (f.pattern LIKE '%.*' AND starts_with(${event}, left(f.pattern, -1)))))`;
}
