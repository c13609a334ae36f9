/**
 * Connects to the database: PostgreSQL when `DATABASE_URL` is set, otherwise the embedded engine
 * in `DATA_DIR` (docs/postgresql.md, "Embedded or PostgreSQL"). Both are reached through the same
 * client, `npm:postgres`.
 */
import postgres from "postgres";
import net from "node:net";
import { join, resolve } from "node:path";
import { type EmbeddedServer, SOCKET_NAME, startEmbeddedServer } from "./embedded/server.ts";
import {
  type DatabasePooler,
  pollInsteadOfListen,
  sessionsAreShared,
  sharedSessionsError,
} from "./pooler.ts";
import { certificateError, type PostgresTls, postgresTls, readCaFile } from "./postgres_tls.ts";
import { RelayError } from "../errors.ts";

/** The SQL client type used across the service. */
export type Sql = postgres.Sql;

/** An open database. */
export interface Database {
  sql: Sql;
  /**
   * The dispatcher's own small pool (`ConnectOptions.dispatchPoolSize`), so its claims and records
   * do not queue behind the receivers' statements; `sql` itself when none was asked for.
   */
  dispatchSql: Sql;
  engine: "postgresql" | "embedded";
  /**
   * Calls `onNotify` whenever any process runs `NOTIFY channel`. A process that uses an embedded
   * engine hosted by another process hears nothing (it relies on its periodic work instead).
   * Behind a transaction pooler without `DATABASE_LISTEN_URL` it is called every 5 s instead.
   */
  listen(channel: string, onNotify: () => void): Promise<void>;
  close(): Promise<void>;
}

/** Options of {@linkcode connectDatabase}. */
export interface ConnectOptions {
  /** PostgreSQL URL, or `null` for the embedded engine. */
  databaseUrl: string | null;
  dataDir: string;
  poolSize: number;
  /** Connections of a separate pool for the dispatcher; none (0) unless given. */
  dispatchPoolSize?: number;
  /** How long to wait for the database before failing. */
  timeoutMs: number;
  /**
   * The service shares its embedded engine on `DATA_DIR`'s socket; a CLI that finds no service
   * running opens the engine privately and releases it when done.
   */
  shareEmbedded: boolean;
  /** What sits between the service and PostgreSQL (`DATABASE_POOLER`); `none` by default. */
  pooler?: DatabasePooler;
  /** A URL that gives `LISTEN` a session of its own (`DATABASE_LISTEN_URL`). */
  listenUrl?: string | null;
  /** CA certificates for `sslmode=verify-full` (`DATABASE_CA_FILE`). */
  caFile?: string | null;
}

/** A database that could not be reached within the wait. */
export class DatabaseUnavailableError extends RelayError {
  constructor(message: string, options?: ErrorOptions) {
    super("DATABASE_UNAVAILABLE", message, options);
  }
}

/** Opens the configured database and waits until it answers. */
export async function connectDatabase(options: ConnectOptions): Promise<Database> {
  if (options.databaseUrl !== null) return await connectPostgres(options.databaseUrl, options);
  return await connectEmbedded(options);
}

async function connectPostgres(url: string, options: ConnectOptions): Promise<Database> {
  const pooler = options.pooler ?? "none";
  const ca = options.caFile ? await readCaFile(options.caFile) : null;
  const mainTls = postgresTls(url, "DATABASE_URL", ca);
  const listenAt = options.listenUrl
    ? { url: options.listenUrl, tls: postgresTls(options.listenUrl, "DATABASE_LISTEN_URL", ca) }
    : null;
  const clientOptions = (tls: PostgresTls, max: number, preparedStatements = true) => ({
    max,
    connect_timeout: 5,
    // npm:postgres waits up to 20 s before a connection's next attempt after failed ones, and a
    // query handed to that connection waits with it: after an outage of a few seconds, requests
    // timed out for many seconds more while the database answered. At most 1 s here.
    backoff: reconnectDelaySeconds,
    idle_timeout: 60,
    onnotice: () => {},
    connection: { application_name: "purchase-relay" },
    ssl: tls.ssl,
    // Behind a transaction pooler the next transaction may run in another session, which does not
    // know a statement prepared in this one: send unnamed statements only.
    prepare: preparedStatements && pooler !== "transaction",
  });
  const sql = postgres(url, clientOptions(mainTls, options.poolSize));
  // The dispatcher's statements are planned afresh at every run: their best plan depends on the
  // queue's depth, and a prepared statement's generic plan, made while the queue was nearly
  // empty, scans every pending delivery per claim once it is not (docs/architecture.md,
  // "Queue statements and stale statistics").
  const dispatchSql = options.dispatchPoolSize
    ? postgres(url, clientOptions(mainTls, options.dispatchPoolSize, false))
    : sql;
  // LISTEN needs a session of its own: DATABASE_LISTEN_URL when set, else DATABASE_URL.
  const listener = listenAt && postgres(listenAt.url, clientOptions(listenAt.tls, 1));
  const deadline = Date.now() + options.timeoutMs;
  try {
    await waitUntilAnswers(sql, mainTls, deadline, options.timeoutMs);
    if (pooler === "none") {
      await refuseSharedSessions(url, clientOptions(mainTls, 2), "DATABASE_URL");
    }
    if (listenAt && listener) {
      await waitUntilAnswers(listener, listenAt.tls, deadline, options.timeoutMs);
      await refuseSharedSessions(
        listenAt.url,
        clientOptions(listenAt.tls, 2),
        "DATABASE_LISTEN_URL",
      );
    }
  } catch (error) {
    await sql.end({ timeout: 0 }).catch(() => {});
    if (dispatchSql !== sql) await dispatchSql.end({ timeout: 0 }).catch(() => {});
    await listener?.end({ timeout: 0 }).catch(() => {});
    throw error;
  }
  const endDispatchPool = () => dispatchSql === sql ? undefined : dispatchSql.end({ timeout: 1 });
  const stopPolling: (() => void)[] = [];
  const stopListening = async () => {
    for (const stop of stopPolling) stop();
    await listener?.end({ timeout: 0 });
  };
  return {
    sql,
    dispatchSql,
    engine: "postgresql",
    listen: async (channel, onNotify) => {
      if (listener === null && pooler === "transaction") {
        // A LISTEN through the pooler would hear nothing: look for work on a timer instead.
        stopPolling.push(pollInsteadOfListen(onNotify));
        return;
      }
      // npm:postgres listens on a dedicated connection and re-listens after reconnecting.
      await (listener ?? sql).listen(channel, () => onNotify());
    },
    // The listener only listens: nothing of it is in flight to wait for. Nor is anything of the
    // dispatcher's pool: the dispatcher has stopped before the database closes.
    close: () => sql.end({ timeout: 5 }).finally(endDispatchPool).finally(stopListening),
  };
}

/**
 * Seconds before a connection's next attempt after `retries` failed ones in its pool: the client's
 * own growth with jitter, capped at 1 s instead of 20 (see `connectPostgres`).
 */
export function reconnectDelaySeconds(retries: number): number {
  return (0.5 + Math.random() / 2) * Math.min(3 ** retries / 100, 1);
}

/**
 * Waits until `sql` answers, retrying until `deadline`; a certificate that fails
 * `sslmode=verify-full` stops the wait at once, since retrying cannot make it match.
 */
async function waitUntilAnswers(
  sql: Sql,
  tls: PostgresTls,
  deadline: number,
  timeoutMs: number,
): Promise<void> {
  while (true) {
    try {
      await sql`SELECT 1`;
      return;
    } catch (error) {
      const mismatch = typeof tls.ssl === "object" ? certificateError(error, tls) : null;
      if (mismatch) throw mismatch;
      if (Date.now() >= deadline) {
        throw new DatabaseUnavailableError(
          `PostgreSQL did not answer within ${timeoutMs} ms: ${describe(error)}`,
          { cause: error },
        );
      }
      await sleep(Math.min(500, Math.max(0, deadline - Date.now())));
    }
  }
}

/** Fails the boot when `url` turns out to share PostgreSQL sessions between its connections. */
async function refuseSharedSessions(
  url: string,
  clientOptions: postgres.Options<Record<string, never>>,
  variable: "DATABASE_URL" | "DATABASE_LISTEN_URL",
): Promise<void> {
  const probe = postgres(url, { ...clientOptions, prepare: false });
  try {
    if (await sessionsAreShared(probe)) throw sharedSessionsError(variable);
  } finally {
    await probe.end({ timeout: 0 }).catch(() => {});
  }
}

async function connectEmbedded(options: ConnectOptions): Promise<Database> {
  const dataDir = resolve(options.dataDir);
  await Deno.mkdir(dataDir, { recursive: true, mode: 0o700 });
  const sharedSocket = join(dataDir, SOCKET_NAME);
  if (sharedSocket.length > 100) {
    throw new DatabaseUnavailableError(
      `DATA_DIR is too long for a Unix socket path (${sharedSocket.length} > 100 characters)`,
    );
  }
  // The lock file is held by the one process that runs the engine on this data directory.
  const lockFile = await Deno.open(join(dataDir, "pglite.lock"), { create: true, write: true });
  const deadline = Date.now() + options.timeoutMs;
  try {
    while (true) {
      if (await socketAnswers(sharedSocket)) {
        // One engine, one session: a second service would share it with the first and its
        // transactions. Replicas need PostgreSQL; admin commands may use the running engine.
        if (options.shareEmbedded) {
          throw new DatabaseUnavailableError(
            `the embedded database in ${options.dataDir} is already served by another process; ` +
              "run one service per embedded database, or set DATABASE_URL for replicas",
          );
        }
        lockFile.close();
        return embeddedClient({ socketDir: dataDir }, options, async () => {});
      }
      if (await lockFile.tryLock(true)) break;
      if (Date.now() >= deadline) {
        throw new DatabaseUnavailableError(
          `the embedded database in ${options.dataDir} is held by another process`,
        );
      }
      await sleep(100);
    }
  } catch (error) {
    lockFile.close();
    throw error;
  }

  let server: EmbeddedServer;
  try {
    // A service shares its engine on DATA_DIR's socket; a CLI that opened it alone keeps it to
    // itself and connects in memory.
    server = await startEmbeddedServer(dataDir, options.shareEmbedded ? dataDir : null);
  } catch (error) {
    lockFile.close();
    throw new DatabaseUnavailableError(
      `the embedded database could not start: ${describe(error)}`,
      { cause: error },
    );
  }
  return embeddedClient({ engine: server }, options, async () => {
    await server.close();
    await lockFile.unlock().catch(() => {});
    lockFile.close();
  });
}

/**
 * A client of the embedded engine another process serves on `dataDir`'s socket (`shareEmbedded`):
 * the CLI while the service runs, and tests and benchmarks that read what a running service wrote
 * (one connection unless `options` says otherwise). It shares the engine's one session with that
 * process's connections and never names statements: a named statement's first run holds the
 * session between its two halves (see db/embedded/server.ts).
 */
export function sharedEmbeddedClient(
  dataDir: string,
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): Sql {
  return postgres({
    host: dataDir,
    port: 5432,
    user: "postgres",
    database: "postgres",
    max: 1,
    onnotice: () => {},
    ...options,
    prepare: false,
  });
}

/** Where a client of the embedded engine connects: this process's engine, or another's socket. */
type EmbeddedRoute = { engine: EmbeddedServer } | { socketDir: string };

/**
 * The client of an embedded engine. The process that hosts it connects in memory: its connections
 * never cross a Unix socket (see db/embedded/memory_socket.ts for why).
 */
function embeddedClient(
  route: EmbeddedRoute,
  sizes: { poolSize: number; dispatchPoolSize?: number },
  stop: () => Promise<void>,
): Database {
  const engine = "engine" in route ? route.engine : null;
  // A new connection's startup waits for the session while others use it. npm:postgres 3.4.9 must
  // not time out there: a connection closed with a write pending and then reopened keeps a stale
  // write timer and never flushes its next small message (its query hangs for good).
  const pool = (poolSize: number) => ({ max: poolSize, connect_timeout: 30 });
  // In the hosting process the receivers' statements are prepared, as on PostgreSQL: planning a
  // batch statement costs the engine more than running it. The dispatcher's are planned at each
  // run, as on PostgreSQL (docs/architecture.md, "Queue statements and stale statistics").
  const client = (poolSize: number, prepare: boolean) =>
    "socketDir" in route ? sharedEmbeddedClient(route.socketDir, pool(poolSize)) : postgres({
      // npm:postgres takes a socket factory, which its types do not declare.
      ...{ socket: () => route.engine.connect() },
      user: "postgres",
      database: "postgres",
      onnotice: () => {},
      prepare,
      ...pool(poolSize),
    });
  const sql = client(sizes.poolSize, true);
  const dispatchSql = sizes.dispatchPoolSize ? client(sizes.dispatchPoolSize, false) : sql;
  return {
    sql,
    dispatchSql,
    engine: "embedded",
    listen: (channel, onNotify) => engine?.listen(channel, onNotify) ?? Promise.resolve(),
    async close() {
      await Promise.all([
        sql.end({ timeout: 5 }),
        dispatchSql === sql ? null : dispatchSql.end({ timeout: 5 }),
      ]);
      await stop();
    },
  };
}

function socketAnswers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(path);
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
