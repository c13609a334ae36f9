/**
 * Migrations: the plain SQL files of `migrations/`, applied in name order, each once, recorded in
 * `schema_migrations`. All pending files run in one transaction under an advisory lock, so
 * replicas booting together apply them once and a failed file leaves nothing half-done.
 *
 * A statement that needs a table's lock while another session holds it (a long report, a backup's
 * `pg_dump`) waits at most {@linkcode MIGRATION_LOCK_TIMEOUT_MS}: while it waits, every insert into
 * that table queues behind it, so an unbounded wait would hold the receivers for as long as the
 * backup ran. The transaction is then rolled back whole and tried again after a pause, a few times
 * (docs/maintenance.md, "Upgrades and migrations").
 */
import type { Sql } from "./connect.ts";

import { MIGRATIONS_DIR } from "./files.ts";

export { MIGRATIONS_DIR };
/** An arbitrary, fixed advisory-lock key for migrations. */
const MIGRATION_LOCK = 7_263_005_101;

/** A migration file. */
export interface Migration {
  name: string;
  sql: string;
}

/** Reads the migration files in order. */
export async function readMigrations(dir: URL = MIGRATIONS_DIR): Promise<Migration[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (entry.isFile && /^\d{4}_[a-z0-9_]+\.sql$/.test(entry.name)) names.push(entry.name);
  }
  names.sort();
  return await Promise.all(
    names.map(async (name) => ({ name, sql: await Deno.readTextFile(new URL(name, dir)) })),
  );
}

/** The longest a migration's statement waits for a lock another session holds. */
export const MIGRATION_LOCK_TIMEOUT_MS = 3_000;
/** Pauses before the tries after a lock timeout: about a minute in all. */
const LOCK_RETRY_PAUSES_MS = [2_000, 5_000, 10_000, 20_000];

/** How {@linkcode migrate} waits for locks; the defaults are the service's. */
export interface MigrateOptions {
  lockTimeoutMs?: number;
  retryPausesMs?: number[];
  /** Told before each pause, after a lock timeout. */
  onLockTimeout?: (attempt: number, pauseMs: number) => void;
}

/** PostgreSQL's SQLSTATE for a lock not obtained within `lock_timeout`. */
const LOCK_NOT_AVAILABLE = "55P03";

/** Applies the pending migrations; returns the names applied by this call. */
export async function migrate(
  sql: Sql,
  migrations?: Migration[],
  options: MigrateOptions = {},
): Promise<string[]> {
  const files = migrations ?? await readMigrations();
  const pauses = options.retryPausesMs ?? LOCK_RETRY_PAUSES_MS;
  for (let attempt = 1;; attempt++) {
    try {
      return await migrateOnce(sql, files, options.lockTimeoutMs ?? MIGRATION_LOCK_TIMEOUT_MS);
    } catch (error) {
      const pause = pauses[attempt - 1];
      if ((error as { code?: unknown })?.code !== LOCK_NOT_AVAILABLE) throw error;
      if (pause === undefined) {
        throw new Error(
          `a migration waited for a table that another session kept locked (a backup or a long ` +
            `query?), ${attempt} times; nothing was applied: try again once it has finished`,
          { cause: error },
        );
      }
      options.onLockTimeout?.(attempt, pause);
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }
}

function migrateOnce(sql: Sql, files: Migration[], lockTimeoutMs: number): Promise<string[]> {
  return sql.begin(async (tx) => {
    // Replicas booting together wait for each other here, however long the first one takes.
    await tx`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`;
    await tx`SELECT set_config('lock_timeout', ${`${lockTimeoutMs}ms`}, true)`;
    await tx`
      CREATE TABLE IF NOT EXISTS schema_migrations (
        name       text PRIMARY KEY,
        applied_at timestamptz NOT NULL DEFAULT now()
      )`;
    const done = new Set((await tx`SELECT name FROM schema_migrations`).map((row) => row.name));
    const applied: string[] = [];
    for (const file of files) {
      if (done.has(file.name)) continue;
      await tx.unsafe(file.sql);
      await tx`INSERT INTO schema_migrations (name) VALUES (${file.name})`;
      applied.push(file.name);
    }
    return applied;
  });
}

/** How a database's recorded migrations compare with the files of this build. */
export interface SchemaState {
  /** This build's files the database has not applied (all of them on a new database). */
  missing: string[];
  /** Migrations the database records that this build has no file for: a newer build's. */
  unknown: string[];
  /** Whether the database has no migrations recorded at all. */
  empty: boolean;
}

/** Compares `schema_migrations` with this build's files without changing anything. */
export async function compareSchema(sql: Sql, migrations?: Migration[]): Promise<SchemaState> {
  const files = (migrations ?? await readMigrations()).map((file) => file.name);
  const [{ present }] = await sql`
    SELECT to_regclass('schema_migrations') IS NOT NULL AS present`;
  const recorded: string[] = present
    ? (await sql`SELECT name FROM schema_migrations ORDER BY name`).map((row) => row.name)
    : [];
  const known = new Set(files);
  const done = new Set(recorded);
  return {
    missing: files.filter((name) => !done.has(name)),
    unknown: recorded.filter((name) => !known.has(name)),
    empty: recorded.length === 0,
  };
}
