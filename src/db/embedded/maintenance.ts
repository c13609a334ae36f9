/**
 * Vacuum and analyze for the embedded engine, which has no autovacuum: PGlite runs PostgreSQL as
 * one standalone backend, without the server processes that would start autovacuum's workers.
 * Without this, the row versions every claim and attempt record leaves behind would stay in the
 * queue's tables and indexes for good, the planner's statistics would never be refreshed, and
 * nothing would freeze old transaction ids: a standalone backend does not refuse writes before
 * the transaction counter wraps around, as a server does, so after about two billion
 * transactions old rows would turn invisible (docs/postgresql.md, "Embedded or PostgreSQL").
 *
 * Each run does what autovacuum would do with its default settings: it reads the statistics
 * PostgreSQL keeps per table and vacuums the tables past autovacuum's thresholds (dead rows,
 * inserted rows, or the age of their oldest unfrozen transaction id), and analyzes the service's
 * own tables past the analyze threshold. One table at a time: each statement holds the engine's
 * one session while it runs, so every request waits for it. Two differences from autovacuum keep
 * that wait short: a table is vacuumed once {@linkcode DEAD_ROWS_CAP} rows are dead, however
 * large it is (autovacuum waits for a fifth of the live rows, so a vacuum's work, and the wait,
 * grew with the table), and runs come every {@linkcode MAINTENANCE_INTERVAL_MS}, so each finds
 * only the churn of a few seconds. And it vacuums TOAST tables only for dead rows or age.
 *
 * It also checkpoints, as the server's checkpointer would: a standalone backend never starts a
 * checkpoint however much WAL it writes, and WAL is removed only up to the last checkpoint, so
 * `pg_wal` grew by every byte written since boot (about 28 KB per notification relayed) until the
 * disk was full, and a crash replayed all of it at the next boot.
 */
import type { Sql } from "../connect.ts";

/** What one run did. */
export interface EmbeddedMaintenanceRun {
  /** Tables vacuumed (with `ANALYZE` when due), schema-qualified. */
  vacuumed: string[];
  /** Tables only analyzed. */
  analyzed: string[];
  /** Whether it checkpointed (past {@linkcode CHECKPOINT_WAL_BYTES} of WAL since the last). */
  checkpointed: boolean;
}

/**
 * WAL written since the last checkpoint that makes a run checkpoint: `max_wal_size`'s role on a
 * server, smaller, so `pg_wal` stays within about this plus `min_wal_size` (80 MB of recycled
 * segments) and a crash replays at most this much.
 */
export const CHECKPOINT_WAL_BYTES = 64 * 1024 * 1024;

/**
 * How often the service runs it: often enough that a busy queue's churn since the last run is a
 * few thousand rows, not a minute's worth (docs/architecture.md, "Vacuuming the embedded engine").
 */
export const MAINTENANCE_INTERVAL_MS = 10_000;

/** Dead rows that make a table due whatever its size: a bound on one vacuum's work. */
export const DEAD_ROWS_CAP = 2_000;

/**
 * autovacuum's defaults (`autovacuum_vacuum_threshold` and `_scale_factor`, the insert and
 * analyze ones, and `autovacuum_freeze_max_age`).
 */
const VACUUM_THRESHOLD = 50;
const VACUUM_SCALE = 0.2;
const INSERT_THRESHOLD = 1000;
const INSERT_SCALE = 0.2;
const ANALYZE_THRESHOLD = 50;
const ANALYZE_SCALE = 0.1;
const FREEZE_MAX_AGE = 200_000_000;

/** Vacuums and analyzes the tables that are due; stops between tables once `signal` aborts. */
export async function maintainEmbedded(
  sql: Sql,
  signal?: AbortSignal,
): Promise<EmbeddedMaintenanceRun> {
  // System catalogs too: they age like any table, and the database's oldest transaction id is
  // the oldest of all its tables'. A TOAST table (the notifications' payloads, most of the bytes)
  // is vacuumed on its own, for dead rows or age only: vacuuming rows only because they were
  // inserted would read every new payload while the session waits.
  const due = await sql<{ name: string; vacuum: boolean; analyze: boolean }[]>`
    SELECT format('%I.%I', s.schemaname, s.relname) AS name,
           (s.n_dead_tup > least(${VACUUM_THRESHOLD}::float8 +
                                 ${VACUUM_SCALE}::float8 * s.n_live_tup, ${DEAD_ROWS_CAP}::float8)
            OR (s.schemaname <> 'pg_toast' AND s.n_ins_since_vacuum >
                ${INSERT_THRESHOLD}::float8 + ${INSERT_SCALE}::float8 * s.n_live_tup)
            OR age(c.relfrozenxid) > ${FREEZE_MAX_AGE}::int) AS vacuum,
           (s.schemaname = current_schema()
            AND s.n_mod_since_analyze >
                ${ANALYZE_THRESHOLD}::float8 + ${ANALYZE_SCALE}::float8 * s.n_live_tup) AS analyze
    FROM pg_stat_all_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE c.relkind IN ('r', 't')
    ORDER BY s.schemaname, s.relname`;
  const run: EmbeddedMaintenanceRun = { vacuumed: [], analyzed: [], checkpointed: false };
  for (const table of due) {
    if (signal?.aborted) break;
    // The name comes quoted from format('%I.%I'); VACUUM takes no parameters.
    if (table.vacuum) {
      await sql.unsafe(`VACUUM (PROCESS_TOAST FALSE) ${table.name}`);
      run.vacuumed.push(table.name);
    }
    // A statement of its own, not VACUUM's ANALYZE option: requests get the session in between.
    if (table.analyze && !signal?.aborted) {
      await sql.unsafe(`ANALYZE ${table.name}`);
      if (!table.vacuum) run.analyzed.push(table.name);
    }
  }
  if (signal?.aborted) return run;
  // After the vacuums, whose WAL it then covers too.
  const [wal] = await sql<{ since: number }[]>`
    SELECT (pg_current_wal_lsn() - redo_lsn)::float8 AS since FROM pg_control_checkpoint()`;
  if (wal.since > CHECKPOINT_WAL_BYTES) {
    await sql`CHECKPOINT`;
    run.checkpointed = true;
  }
  return run;
}
