/**
 * A migration that needs a table's lock while another session holds it (a backup's `pg_dump`, a
 * long report) waits a bounded time, lets the receivers' inserts through in between, and is tried
 * again (src/db/migrate.ts). PostgreSQL only: the embedded engine has one session.
 */
import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, type Migration, readMigrations } from "../src/db/migrate.ts";
import { connectTestDatabase, ENGINE, freshDatabase } from "./helpers/service.ts";
import { eventually } from "./helpers/relay.ts";

const LOCKING: Migration = {
  name: "9999_test_lock_probe.sql",
  sql: "ALTER TABLE events ADD COLUMN lock_probe integer",
};

Deno.test({
  name: "migrate: a migration waits a bounded time for a lock another session holds",
  ignore: ENGINE !== "postgresql",
  async fn() {
    const test = await freshDatabase();
    const db = await connectTestDatabase(test);
    const reader = postgres(test.env.DATABASE_URL, { max: 1, onnotice: () => {} });
    const writer = postgres(test.env.DATABASE_URL, { max: 1, onnotice: () => {} });
    try {
      const files = [...await readMigrations(), LOCKING];
      await db.sql`INSERT INTO tenants (id, name) VALUES ('t', 't')`;
      // A backup's long read of `events`: it holds ACCESS SHARE until it ends.
      let holding = () => {};
      const held = new Promise<void>((resolve) => holding = resolve);
      const reading = reader.begin(async (tx) => {
        await tx`SELECT count(*) FROM events`;
        holding();
        await tx`SELECT pg_sleep(3)`;
      });
      await held;

      const timeouts: number[] = [];
      const migrating = migrate(db.sql, files, {
        lockTimeoutMs: 300,
        retryPausesMs: [200, 200],
        onLockTimeout: (attempt) => timeouts.push(attempt),
      });
      // Meanwhile a receiver's insert goes through within a lock timeout or so, not after the
      // whole read (without a lock timeout it queued behind the migration until the read ended).
      // It is sent once the migration waits for its lock.
      await eventually(
        async () => {
          const [{ waiting }] = await writer`
          SELECT count(*)::int AS waiting FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`;
          return waiting > 0 ? true : undefined;
        },
        5_000,
        "the migration waiting for its lock",
      );
      const started = performance.now();
      await writer`
        INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
        VALUES ('evt_probe', 't', 'storea', 'probe', 'renewal', 'DID_RENEW', '{}')`;
      const waited = performance.now() - started;
      assert.ok(waited < 1_500, `the insert waited ${waited.toFixed(0)} ms behind the migration`);

      await assert.rejects(migrating, /another session kept locked.*3 times; nothing was applied/);
      assert.deepEqual(timeouts, [1, 2]);
      const [{ present }] = await db.sql`
        SELECT count(*)::int > 0 AS present FROM schema_migrations WHERE name = ${LOCKING.name}`;
      assert.equal(present, false);

      // Once the read has ended, the migration applies.
      await reading;
      assert.deepEqual(await migrate(db.sql, files), [LOCKING.name]);
    } finally {
      await reader.end();
      await writer.end();
      await db.close();
      await test.drop();
    }
  },
});
