/**
 * The recovery's checkpoints (`recovery_checkpoints`): per tenant, store and environment, where
 * the last run ended, a window left unfinished, the schedule and its backoff, and the lease of the
 * process reading it now (docs/recovery.md, "Recovering missed notifications").
 *
 * One replica at a time reads a checkpoint: a claim takes one due row `FOR UPDATE SKIP LOCKED` and
 * leases it to its process, in one statement; every later write names the owner, so a process
 * whose lease ran out (and was taken over) writes nothing. A lease rather than a session advisory
 * lock: through a transaction pooler a session is not the same from one statement to the next.
 */
import type { Sql } from "../db/connect.ts";
import type { RecoveryEnvironment, RecoveryStore } from "./window.ts";

/** The most order ids kept as already reported (`purchase_voided_unacknowledged`). */
const WARNED_ORDERS_KEPT = 1000;

/** Which checkpoint. */
export interface CheckpointKey {
  tenantId: string;
  store: RecoveryStore;
  environment: RecoveryEnvironment;
}

/** A claimed checkpoint. */
export interface Checkpoint extends CheckpointKey {
  /** Epoch ms: the end of the last window read to its end; null before the first. */
  checkedUntil: number | null;
  /** A window left unfinished, with the page to go on from; null when there is none. */
  unfinished: { startMs: number; endMs: number; pageToken: string } | null;
  /** Runs that failed in a row. */
  failures: number;
  /** Epoch ms: store A's failed send attempts up to this time were reported. */
  sendFailuresUntil: number | null;
  /** Order ids reported voided for want of an acknowledgement. */
  warnedOrders: string[];
}

/**
 * Adds the checkpoints that active tenants' credentials call for and lack: store A in each
 * environment its setting covers (`auto`: both), store B once. A new one is due `firstRunInMs`
 * from now: one interval after the credentials were set (or this version first ran), its first
 * run looks back over what the stores may have failed to deliver meanwhile.
 */
export async function ensureCheckpoints(sql: Sql, firstRunInMs: number): Promise<void> {
  const due = sql`now() + ${firstRunInMs} * interval '1 millisecond'`;
  await sql`
    INSERT INTO recovery_checkpoints (tenant_id, store, environment, next_run_at)
    SELECT a.tenant_id, 'storea', e.environment, ${due}
    FROM storea_credentials a
    JOIN tenants t ON t.id = a.tenant_id AND t.active
    CROSS JOIN (VALUES ('production'), ('sandbox')) AS e(environment)
    WHERE a.environment IN ('auto', e.environment)
    UNION ALL
    SELECT b.tenant_id, 'storeb', 'production', ${due}
    FROM storeb_credentials b
    JOIN tenants t ON t.id = b.tenant_id AND t.active
    ON CONFLICT DO NOTHING`;
}

/**
 * Leases to `owner`, for `leaseMs`, the checkpoint due longest ago whose lease (if any) ran out,
 * of an active tenant whose credentials still call for it; null when none is due.
 */
export async function claimCheckpoint(
  sql: Sql,
  owner: string,
  leaseMs: number,
): Promise<Checkpoint | null> {
  const [row] = await sql`
    UPDATE recovery_checkpoints c
    SET lease_owner = ${owner},
        lease_until = now() + ${leaseMs} * interval '1 millisecond',
        last_run_at = now()
    FROM (
      SELECT r.tenant_id, r.store, r.environment
      FROM recovery_checkpoints r
      JOIN tenants t ON t.id = r.tenant_id AND t.active
      WHERE r.next_run_at <= now()
        AND (r.lease_until IS NULL OR r.lease_until < now())
        AND CASE WHEN r.store = 'storea' THEN EXISTS (
              SELECT 1 FROM storea_credentials a
              WHERE a.tenant_id = r.tenant_id AND a.environment IN ('auto', r.environment))
            ELSE EXISTS (SELECT 1 FROM storeb_credentials b WHERE b.tenant_id = r.tenant_id)
            END
      ORDER BY r.next_run_at
      LIMIT 1
      FOR UPDATE OF r SKIP LOCKED
    ) due
    WHERE c.tenant_id = due.tenant_id AND c.store = due.store
      AND c.environment = due.environment
    RETURNING c.*`;
  return row ? checkpointOf(row) : null;
}

/**
 * Saves where the window's reading stands (an unfinished window, or none once read to its end)
 * and extends the lease. False when `owner` no longer holds the lease.
 */
export async function saveProgress(
  sql: Sql,
  key: CheckpointKey,
  owner: string,
  progress: { startMs: number; endMs: number; pageToken: string | null },
  leaseMs: number,
): Promise<boolean> {
  const unfinished = progress.pageToken !== null;
  const rows = await sql`
    UPDATE recovery_checkpoints
    SET window_start = ${unfinished ? new Date(progress.startMs) : null},
        window_end = ${unfinished ? new Date(progress.endMs) : null},
        page_token = ${progress.pageToken},
        checked_until = CASE WHEN ${unfinished} THEN checked_until
                             ELSE ${new Date(progress.endMs)}::timestamptz END,
        lease_until = now() + ${leaseMs} * interval '1 millisecond'
    WHERE ${whereOwned(sql, key, owner)}
    RETURNING 1`;
  return rows.length > 0;
}

/** What a run leaves for the next one. */
export interface RunEnd {
  /** When the next run is due, from now. */
  nextRunInMs: number;
  /** Set when the window was read to its end (or there was nothing to read): where it ended. */
  checkedUntil?: number;
  /** Forget an unfinished window (its page token was refused): the next run starts afresh. */
  dropUnfinished?: boolean;
  sendFailuresUntil: number | null;
  warnedOrders: string[];
}

/**
 * Ends `owner`'s run successfully: the schedule, what was reported, failures back to zero, the
 * lease released. False when the lease was lost meanwhile.
 */
export async function finishRun(
  sql: Sql,
  key: CheckpointKey,
  owner: string,
  end: RunEnd,
): Promise<boolean> {
  const checkedUntil = end.checkedUntil === undefined ? null : new Date(end.checkedUntil);
  const drop = end.dropUnfinished === true || checkedUntil !== null;
  const rows = await sql`
    UPDATE recovery_checkpoints
    SET checked_until = coalesce(${checkedUntil}::timestamptz, checked_until),
        window_start = CASE WHEN ${drop} THEN NULL ELSE window_start END,
        window_end = CASE WHEN ${drop} THEN NULL ELSE window_end END,
        page_token = CASE WHEN ${drop} THEN NULL ELSE page_token END,
        send_failures_until = ${toDate(end.sendFailuresUntil)},
        warned_orders = ${end.warnedOrders.slice(-WARNED_ORDERS_KEPT)}::text[],
        failures = 0,
        last_error = NULL,
        next_run_at = now() + ${end.nextRunInMs} * interval '1 millisecond',
        lease_owner = NULL,
        lease_until = NULL
    WHERE ${whereOwned(sql, key, owner)}
    RETURNING 1`;
  return rows.length > 0;
}

/**
 * Ends `owner`'s run as failed: one more failure, the next run `nextRunInMs` from now, what was
 * reported so far kept, the lease released. False when the lease was lost meanwhile.
 */
export async function failRun(
  sql: Sql,
  key: CheckpointKey,
  owner: string,
  failure: {
    error: string;
    nextRunInMs: number;
    sendFailuresUntil: number | null;
    warnedOrders: string[];
  },
): Promise<boolean> {
  const rows = await sql`
    UPDATE recovery_checkpoints
    SET failures = failures + 1,
        last_error = ${failure.error},
        send_failures_until = ${toDate(failure.sendFailuresUntil)},
        warned_orders = ${failure.warnedOrders.slice(-WARNED_ORDERS_KEPT)}::text[],
        next_run_at = now() + ${failure.nextRunInMs} * interval '1 millisecond',
        lease_owner = NULL,
        lease_until = NULL
    WHERE ${whereOwned(sql, key, owner)}
    RETURNING 1`;
  return rows.length > 0;
}

/** Gives up `owner`'s lease (a stopping process), so that another replica may go on at once. */
export async function releaseLease(sql: Sql, key: CheckpointKey, owner: string): Promise<void> {
  await sql`
    UPDATE recovery_checkpoints SET lease_owner = NULL, lease_until = NULL
    WHERE ${whereOwned(sql, key, owner)}`;
}

function whereOwned(sql: Sql, key: CheckpointKey, owner: string) {
  return sql`tenant_id = ${key.tenantId} AND store = ${key.store}
    AND environment = ${key.environment} AND lease_owner = ${owner}`;
}

function toDate(ms: number | null): Date | null {
  return ms === null ? null : new Date(ms);
}

// deno-lint-ignore no-explicit-any
function checkpointOf(row: any): Checkpoint {
  const time = (value: unknown) => value === null ? null : new Date(value as string).getTime();
  const unfinished = row.page_token !== null && row.window_start !== null &&
      row.window_end !== null
    ? {
      startMs: time(row.window_start)!,
      endMs: time(row.window_end)!,
      pageToken: row.page_token as string,
    }
    : null;
  return {
    tenantId: row.tenant_id,
    store: row.store,
    environment: row.environment,
    checkedUntil: time(row.checked_until),
    unfinished,
    failures: Number(row.failures),
    sendFailuresUntil: time(row.send_failures_until),
    warnedOrders: row.warned_orders ?? [],
  };
}
