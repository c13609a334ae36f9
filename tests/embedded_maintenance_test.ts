/**
 * The embedded engine's vacuum (src/db/embedded/maintenance.ts): PGlite has no autovacuum, so
 * without it the row versions left by every update stay in the tables for good.
 */
import assert from "node:assert/strict";
import type { Sql } from "../src/db/connect.ts";
import {
  CHECKPOINT_WAL_BYTES,
  DEAD_ROWS_CAP,
  maintainEmbedded,
  MAINTENANCE_INTERVAL_MS,
} from "../src/db/embedded/maintenance.ts";
import {
  connectTestDatabase,
  databaseOf,
  ENGINE,
  freshDatabase,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";

/** Leaves `rows` dead rows in `tenants` (prefix `prefix`), and makes the statistics show them. */
async function churnTenants(sql: Sql, prefix: string, rows: number): Promise<void> {
  await sql`
    INSERT INTO tenants (id, name)
    SELECT ${prefix} || g, 'Churn' FROM generate_series(1, ${rows}::int) g`;
  await sql`DELETE FROM tenants WHERE id LIKE ${prefix + "%"}`;
  await flushStatistics(sql);
}

/** Adds `rows` live tenants, and makes the statistics show them. */
async function addLiveTenants(sql: Sql, rows: number): Promise<void> {
  await sql`
    INSERT INTO tenants (id, name)
    SELECT 'live_' || g, 'Live' FROM generate_series(1, ${rows}::int) g`;
  await flushStatistics(sql);
}

/**
 * Makes the statistics show what was written: they reach the shared counters when the session is
 * idle, at most once a second, unless a flush is forced before the next statement.
 */
async function flushStatistics(sql: Sql): Promise<void> {
  await sql`SELECT pg_stat_force_next_flush()`;
  await sql`SELECT 1`;
}

async function tenantsStats(sql: Sql) {
  const [row] = await sql`
    SELECT n_dead_tup::int AS dead, last_vacuum IS NOT NULL AS vacuumed,
           last_analyze IS NOT NULL AS analyzed
    FROM pg_stat_user_tables WHERE relname = 'tenants'`;
  return row;
}

Deno.test({
  name: "embedded maintenance: vacuums and analyzes a table past autovacuum's thresholds",
  ignore: ENGINE !== "embedded",
  async fn() {
    const test = await freshDatabase();
    const db = await connectTestDatabase(test);
    try {
      await maintainEmbedded(db.sql);
      await churnTenants(db.sql, "churn_a_", 1000);
      const before = await tenantsStats(db.sql);
      assert.equal(before.dead, 1000);
      assert.equal(before.vacuumed, false);

      const run = await maintainEmbedded(db.sql);
      assert.ok(run.vacuumed.includes("public.tenants"), JSON.stringify(run));
      await flushStatistics(db.sql);
      assert.deepEqual(await tenantsStats(db.sql), { dead: 0, vacuumed: true, analyzed: true });

      // Nothing is due any more: the next run leaves the table alone.
      assert.equal((await maintainEmbedded(db.sql)).vacuumed.includes("public.tenants"), false);

      // A run asked to stop does no more.
      const stopped = new AbortController();
      stopped.abort();
      await churnTenants(db.sql, "churn_b_", 1000);
      assert.deepEqual(await maintainEmbedded(db.sql, stopped.signal), {
        vacuumed: [],
        analyzed: [],
        checkpointed: false,
      });
    } finally {
      await db.close();
      await test.drop();
    }
  },
});

Deno.test({
  name: "embedded maintenance: a large table is vacuumed once its dead rows pass the cap",
  ignore: ENGINE !== "embedded",
  async fn() {
    const test = await freshDatabase();
    const db = await connectTestDatabase(test);
    try {
      // 20,000 live rows: autovacuum's threshold would be 50 + 20% of them, 4,050 dead rows,
      // and the vacuum that finally ran would hold the one session for all of them.
      const live = 20_000;
      await addLiveTenants(db.sql, live);
      // The inserts make it due once (autovacuum's insert threshold); after that only dead rows can.
      assert.ok((await maintainEmbedded(db.sql)).vacuumed.includes("public.tenants"));
      const dead = DEAD_ROWS_CAP + 500;
      assert.ok(dead < 50 + 0.2 * live);
      await churnTenants(db.sql, "churn_", dead);
      assert.equal((await tenantsStats(db.sql)).dead, dead);

      const run = await maintainEmbedded(db.sql);
      assert.ok(run.vacuumed.includes("public.tenants"), JSON.stringify(run));
      await flushStatistics(db.sql);
      assert.equal((await tenantsStats(db.sql)).dead, 0);
    } finally {
      await db.close();
      await test.drop();
    }
  },
});

Deno.test({
  name: "embedded maintenance: an analyze samples 3,000 rows, not PostgreSQL's 30,000",
  ignore: ENGINE !== "embedded",
  async fn() {
    // The sample, and the session's wait for it, follow default_statistics_target: 300 rows per
    // unit, and up to that many + 1 histogram bounds per column.
    const test = await freshDatabase();
    const db = await connectTestDatabase(test);
    try {
      await addLiveTenants(db.sql, 20_000);
      assert.ok((await maintainEmbedded(db.sql)).vacuumed.includes("public.tenants"));
      const [column] = await db.sql`
        SELECT array_length(histogram_bounds, 1)::int AS bounds FROM pg_stats
        WHERE tablename = 'tenants' AND attname = 'id'`;
      assert.equal(column.bounds, 11);
    } finally {
      await db.close();
      await test.drop();
    }
  },
});

Deno.test({
  name: "embedded maintenance: checkpoints, so the WAL stays bounded however much is written",
  ignore: ENGINE !== "embedded",
  async fn() {
    const test = await freshDatabase();
    const db = await connectTestDatabase(test);
    const walBytes = async () => {
      const [row] = await db.sql`SELECT sum(size)::float8 AS bytes FROM pg_ls_waldir()`;
      return row.bytes as number;
    };
    const redo = async () => {
      const [row] = await db.sql`SELECT redo_lsn::text AS lsn FROM pg_control_checkpoint()`;
      return row.lsn as string;
    };
    try {
      // A standalone backend never checkpoints on its own: churn about 3x the threshold of WAL
      // (incompressible payloads, written and deleted, as the queue's rows are).
      await db.sql`CREATE TABLE churn (body text)`;
      const before = await redo();
      const chunk = CHECKPOINT_WAL_BYTES / 8;
      for (let written = 0; written < 3 * CHECKPOINT_WAL_BYTES; written += chunk) {
        await db.sql`
          INSERT INTO churn
          SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2048) g,
                 generate_series(1, ${Math.ceil(chunk / 65_536)}::int) r
          GROUP BY r`;
        await db.sql`DELETE FROM churn`;
      }
      assert.equal(await redo(), before, "the engine checkpointed on its own after all");
      const grown = await walBytes();
      assert.ok(grown > 2 * CHECKPOINT_WAL_BYTES, `pg_wal holds ${grown} bytes`);

      const run = await maintainEmbedded(db.sql);
      assert.equal(run.checkpointed, true);
      assert.notEqual(await redo(), before);
      const after = await walBytes();
      assert.ok(
        after < grown && after <= 112 * 1024 * 1024,
        `pg_wal holds ${after} bytes after the checkpoint, ${grown} before`,
      );
      // Nothing written since: no checkpoint.
      assert.equal((await maintainEmbedded(db.sql)).checkpointed, false);
    } finally {
      await db.close();
      await test.drop();
    }
  },
});

Deno.test({
  name: "embedded maintenance: the service vacuums its embedded engine every few seconds",
  ignore: ENGINE !== "embedded",
  async fn() {
    const service = await startService();
    const sql = databaseOf(service);
    try {
      // The churn is found by the next run, due within the interval.
      await churnTenants(sql, "churn_", 1000);
      const line = await service.waitForLog(
        (l) => l.msg === "embedded_vacuumed" && (l.vacuumed as string[]).includes("public.tenants"),
        MAINTENANCE_INTERVAL_MS + 5_000,
      );
      assert.equal(line.level, "info");
      assert.equal(typeof line.durationMs, "number");
      assert.equal((await tenantsStats(sql)).dead, 0);
    } finally {
      await sql.end();
      await stopAndDrop(service);
    }
  },
});
