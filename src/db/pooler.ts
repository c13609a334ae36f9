/**
 * Connection poolers in front of PostgreSQL (docs/postgresql.md, "Connection poolers").
 *
 * A pooler in transaction mode (PgBouncer's `pool_mode = transaction`, Supavisor's and Neon's
 * pooled endpoints) runs each transaction in whichever server session is free, so what lives in a
 * session breaks: a named prepared statement is unknown in the next session, and a `LISTEN` hears
 * nothing once its session goes back to the pool. With `DATABASE_POOLER=transaction` the service
 * prepares no named statements, and listens through `DATABASE_LISTEN_URL` (a session of its own) or
 * else polls. What is scoped to one transaction works as it is: the migrations'
 * `pg_advisory_xact_lock`, `FOR UPDATE SKIP LOCKED` claims, `sql.begin` blocks.
 */
import type postgres from "postgres";
import { RelayError } from "../errors.ts";

/** What sits between the service and PostgreSQL (`DATABASE_POOLER`). */
export type DatabasePooler = "none" | "transaction";

/** How often a process that cannot `LISTEN` looks for work that was requeued. */
export const NOTIFY_POLL_INTERVAL_MS = 5_000;

/** The database URL reaches PostgreSQL in a way the configuration did not declare. */
export class DatabasePoolerError extends RelayError {
  constructor(message: string) {
    super("POOLER_MODE_MISMATCH", message);
  }
}

/**
 * Whether two connections of `sql` (a client of at least 2 connections) were served, one after
 * the other, by the same PostgreSQL session: proof of a pooler in transaction or statement mode,
 * since a session belongs to one connection otherwise. A pooler that hands out the server
 * connection freed last (PgBouncer's default) is caught in the first round; one that spreads its
 * connections may go unnoticed, which is why `DATABASE_POOLER` is declared, not guessed.
 */
export async function sessionsAreShared(sql: postgres.Sql, rounds = 3): Promise<boolean> {
  const first = await sql.reserve();
  const second = await sql.reserve();
  try {
    for (let round = 0; round < rounds; round++) {
      const [a] = await first`SELECT pg_backend_pid() AS pid`;
      const [b] = await second`SELECT pg_backend_pid() AS pid`;
      if (a.pid === b.pid) return true;
    }
    return false;
  } finally {
    first.release();
    second.release();
  }
}

/** The boot error for a URL found to share sessions where a session of its own is needed. */
export function sharedSessionsError(variable: "DATABASE_URL" | "DATABASE_LISTEN_URL"): Error {
  if (variable === "DATABASE_LISTEN_URL") {
    return new DatabasePoolerError(
      "DATABASE_LISTEN_URL leads to a connection pooler in transaction mode, where LISTEN hears " +
        "nothing: point it at PostgreSQL directly, or at a pooler in session mode " +
        '(docs/postgresql.md, "Connection poolers")',
    );
  }
  return new DatabasePoolerError(
    "DATABASE_URL leads to a connection pooler in transaction mode (two connections ran in one " +
      "PostgreSQL session), where prepared statements and LISTEN break: set " +
      "DATABASE_POOLER=transaction, and DATABASE_LISTEN_URL to a direct connection for immediate " +
      'delivery wake-ups (docs/postgresql.md, "Connection poolers")',
  );
}

/**
 * Calls `onNotify` every {@linkcode NOTIFY_POLL_INTERVAL_MS}, in place of a `LISTEN` that a
 * transaction pooler would silence; returns the function that stops it.
 */
export function pollInsteadOfListen(onNotify: () => void): () => void {
  const timer = setInterval(onNotify, NOTIFY_POLL_INTERVAL_MS);
  return () => clearInterval(timer);
}
