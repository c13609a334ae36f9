/**
 * Migrations: the plain SQL files of `migrations/`, applied in name order, each once, recorded in
 * `schema_migrations`. All pending files run in one transaction under an advisory lock, so
 * replicas booting together apply them once and a failed file leaves nothing half-done.
 */
import type { Sql } from "./connect.ts";

/** The migration files' folder: read at boot (src/permissions.ts grants it). */
export const MIGRATIONS_DIR = new URL("../../migrations/", import.meta.url);
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

/** Applies the pending migrations; returns the names applied by this call. */
export async function migrate(sql: Sql, migrations?: Migration[]): Promise<string[]> {
  const files = migrations ?? await readMigrations();
  return await sql.begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`;
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
