/**
 * Connects to the database: PostgreSQL when `DATABASE_URL` is set, otherwise the embedded engine
 * in `DATA_DIR` (decisions.md 3). Both are reached through the same client, `npm:postgres`.
 */
import postgres from "postgres";
import net from "node:net";
import { join, resolve } from "node:path";
import { type EmbeddedServer, SOCKET_NAME, startEmbeddedServer } from "./embedded.ts";

/** The SQL client type used across the service. */
export type Sql = postgres.Sql;

/** An open database. */
export interface Database {
  sql: Sql;
  engine: "postgresql" | "embedded";
  /**
   * Calls `onNotify` whenever any process runs `NOTIFY channel`. A process that uses an embedded
   * engine hosted by another process hears nothing (it relies on its periodic work instead).
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
  /** How long to wait for the database before failing. */
  timeoutMs: number;
  /**
   * The service shares its embedded engine on `DATA_DIR`'s socket; a CLI that finds no service
   * running opens the engine privately and releases it when done.
   */
  shareEmbedded: boolean;
}

/** A database that could not be reached within the wait. */
export class DatabaseUnavailableError extends Error {
  readonly code = "DATABASE_UNAVAILABLE";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "DatabaseUnavailableError";
  }
}

/** Opens the configured database and waits until it answers. */
export async function connectDatabase(options: ConnectOptions): Promise<Database> {
  if (options.databaseUrl !== null) return await connectPostgres(options.databaseUrl, options);
  return await connectEmbedded(options);
}

async function connectPostgres(url: string, options: ConnectOptions): Promise<Database> {
  const sql = postgres(url, {
    max: options.poolSize,
    connect_timeout: 5,
    idle_timeout: 60,
    onnotice: () => {},
    connection: { application_name: "purchase-relay" },
  });
  const deadline = Date.now() + options.timeoutMs;
  while (true) {
    try {
      await sql`SELECT 1`;
      break;
    } catch (error) {
      if (Date.now() >= deadline) {
        await sql.end({ timeout: 0 }).catch(() => {});
        throw new DatabaseUnavailableError(
          `PostgreSQL did not answer within ${options.timeoutMs} ms: ${describe(error)}`,
          { cause: error },
        );
      }
      await sleep(Math.min(500, Math.max(0, deadline - Date.now())));
    }
  }
  return {
    sql,
    engine: "postgresql",
    // npm:postgres listens on a dedicated connection and re-listens after reconnecting.
    listen: async (channel, onNotify) => void await sql.listen(channel, () => onNotify()),
    close: () => sql.end({ timeout: 5 }),
  };
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
        return embeddedClient({ socketDir: dataDir }, options.poolSize, async () => {});
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
  return embeddedClient({ engine: server }, options.poolSize, async () => {
    await server.close();
    await lockFile.unlock().catch(() => {});
    lockFile.close();
  });
}

/** Where a client of the embedded engine connects: this process's engine, or another's socket. */
type EmbeddedRoute = { engine: EmbeddedServer } | { socketDir: string };

/**
 * The client of an embedded engine. The process that hosts it connects in memory: its connections
 * never cross a Unix socket (see memory_socket.ts for why).
 */
function embeddedClient(
  route: EmbeddedRoute,
  poolSize: number,
  stop: () => Promise<void>,
): Database {
  const engine = "engine" in route ? route.engine : null;
  const sql = postgres({
    ...("engine" in route
      ? { socket: () => route.engine.connect() }
      : { host: route.socketDir, port: 5432 }),
    user: "postgres",
    database: "postgres",
    max: poolSize,
    // Connections share PGlite's one session, so statement names must not be reused.
    prepare: false,
    // A new connection's startup waits for the session while others use it. npm:postgres 3.4.9
    // must not time out there: a connection closed with a write pending and then reopened keeps
    // a stale write timer and never flushes its next small message (its query hangs for good).
    connect_timeout: 30,
    onnotice: () => {},
  });
  return {
    sql,
    engine: "embedded",
    listen: (channel, onNotify) => engine?.listen(channel, onNotify) ?? Promise.resolve(),
    async close() {
      await sql.end({ timeout: 5 });
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
