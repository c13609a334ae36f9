/**
 * The embedded engine: PGlite (PostgreSQL compiled to WebAssembly) in `DATA_DIR`, spoken to in
 * PostgreSQL's wire protocol so that `npm:postgres` talks to it exactly as to a PostgreSQL server.
 * The process that hosts it connects through in-memory sockets (`connect()`); other processes
 * (the admin CLI while the service runs) through a Unix socket in `DATA_DIR`.
 *
 * PGlite has one session. The server below lets several connections share it safely: it runs a
 * connection's messages up to each Sync (or simple Query) as one unit under a lock, and keeps
 * the lock for that connection while it has a transaction open. The session's prepared
 * statements are shared too: a client may name statements only with names no other connection
 * uses (npm:postgres prefixes each connection's names with a random string), and the server
 * deallocates a connection's named statements when it closes, so that they do not outlive it.
 *
 * A parameterised query outside a transaction takes the client two round trips (Parse, Describe
 * and Flush, then Bind, Execute and Sync once it knows the parameter types). The lock is not
 * kept between them: a client that is slow to send the second half would stop every other
 * connection (over the Unix socket, under load, the second half sometimes never came; see
 * memory_socket.ts). The server remembers the Parse instead and runs it again just before the
 * Bind, hiding its second ParseComplete; the unnamed statement is the same text, so the result is
 * the same. A named statement's first run keeps the lock between its halves instead: the
 * statement must exist when its Bind comes. Only the hosting process names statements, over
 * in-memory sockets, once per statement and connection. If the first half failed, PostgreSQL
 * skips every message until the next Sync, whoever sends it: the lock then stays with the
 * connection until its own Sync (npm:postgres sends it on the error).
 *
 * A startup message is answered from memory when PGlite has already answered the same bytes:
 * the session is shared, so the answer (parameters, key data, ReadyForQuery) is the same. A
 * client connecting while the session is busy (a delivery backlog) then gets in at once instead
 * of waiting for the lock, and never reaches its connect timeout: npm:postgres 3.4.9 can leave a
 * connection closed during its startup unable to send its next small message.
 */
import type { PGlite } from "@electric-sql/pglite";
import net from "node:net";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { type MemorySocket, memorySocketPair } from "./memory_socket.ts";
import { ensureDatabaseDirectory } from "./template.ts";

/** The socket file name PostgreSQL clients expect for port 5432. */
export const SOCKET_NAME = ".s.PGSQL.5432";
const SSL_REQUEST = 80877103;
const PROTOCOL_3 = 196608;
const GSSENC_REQUEST = 80877104;
const MSG_SYNC = 0x53; // 'S'
const MSG_QUERY = 0x51; // 'Q'
const MSG_NOTIFICATION = 0x41; // 'A', backend NotificationResponse
const MSG_FLUSH = 0x48; // 'H'
const MSG_TERMINATE = 0x58; // 'X'
const MSG_PARSE = 0x50; // 'P'
const MSG_BIND = 0x42; // 'B'
const MSG_DESCRIBE = 0x44; // 'D'
const MSG_PARSE_COMPLETE = 0x31; // '1', backend ParseComplete
const MSG_READY_FOR_QUERY = 0x5a; // 'Z'
const MSG_ERROR = 0x45; // 'E'
const MSG_AUTHENTICATION = 0x52; // 'R'
/** A Sync message: type and length, no body. */
const SYNC_MESSAGE = new Uint8Array([MSG_SYNC, 0, 0, 0, 4]);
/** Distinct startup messages whose answers are remembered; clients here send one or two. */
const STARTUP_ANSWER_LIMIT = 16;
/** A connection that holds a transaction open longer than this is cut, freeing the others. */
const TRANSACTION_IDLE_LIMIT_MS = 30_000;
/**
 * PostgreSQL settings of the embedded engine, on top of PGlite's own. PGlite holds PostgreSQL's
 * shared memory in its WebAssembly memory and touches all of it at start: the defaults, 128 MB of
 * shared buffers and room for 100 connections, were most of the engine's resident set. PGlite
 * runs one session, and 2 MB of buffers cost about 7% more CPU than 8 MB over 13,000 inserts and
 * reads (docs/benchmarks.md, "The embedded engine"). Neither changes what a commit survives.
 * The WAL kept after a checkpoint, as segments recycled for reuse, is at most `max_wal_size`: at
 * PostgreSQL's 1 GB, a checkpoint (embedded_maintenance.ts) freed none of the WAL a day had written.
 * An `ANALYZE` samples 300 rows per unit of `default_statistics_target` and holds the one session
 * while it reads them, every request waiting: 30,000 rows at PostgreSQL's 100, 3,000 at 10, enough
 * for the queue's statements, which find their rows through indexes (docs/architecture.md,
 * "Vacuuming the embedded engine").
 */
export const ENGINE_SETTINGS: Record<string, string> = {
  shared_buffers: "2MB",
  max_connections: "4",
  max_wal_size: "96MB",
  min_wal_size: "32MB",
  default_statistics_target: "10",
};

/** A running embedded engine. */
export interface EmbeddedServer {
  /** The directory holding the Unix socket (`host` for `npm:postgres`), if it serves one. */
  socketDir: string | null;
  /** A new connection from this process: the client's end (`socket` for `npm:postgres`). */
  connect(): MemorySocket;
  /**
   * Calls `onNotify` on every `NOTIFY channel`, whichever connection sends it. It runs under the
   * session lock, so it never lands inside a client's open transaction.
   */
  listen(channel: string, onNotify: () => void): Promise<void>;
  close(): Promise<void>;
}

/** Serializes access to the one PGlite session. */
class SessionLock {
  #tail: Promise<void> = Promise.resolve();

  acquire(): Promise<() => void> {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const granted = this.#tail.then(() => release);
    this.#tail = this.#tail.then(() => released);
    return granted;
  }
}

/**
 * Opens PGlite in `dataDir/pglite`. With a `socketDir`, it is also served on a Unix socket there,
 * for other processes; without one, only this process can use it.
 */
export async function startEmbeddedServer(
  dataDir: string,
  socketDir: string | null,
): Promise<EmbeddedServer> {
  // Loaded here, not at the top: a service on PostgreSQL never pays PGlite's memory.
  const { PGlite } = await import("@electric-sql/pglite");
  const databaseDir = join(dataDir, "pglite");
  // PGlite's WebAssembly compiles while a new database is unpacked, instead of after.
  const [pgliteWasmModule] = await Promise.all([
    Deno.readFile(new URL(import.meta.resolve("@electric-sql/pglite/pglite.wasm")))
      .then((bytes) => WebAssembly.compile(bytes)),
    ensureDatabaseDirectory(databaseDir),
  ]);
  const db = await PGlite.create(databaseDir, {
    pgliteWasmModule,
    startParams: [
      ...PGlite.defaultStartParams,
      ...Object.entries(ENGINE_SETTINGS).flatMap(([name, value]) => ["-c", `${name}=${value}`]),
    ],
  });
  const lock = new SessionLock();
  const sockets = new Set<Duplex>();
  const listeners = new Map<string, Set<() => void>>();
  const startupAnswers = new Map<string, Uint8Array>();
  const serve = (socket: Duplex) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    serveConnection({ db, lock, socket, listeners, startupAnswers });
  };
  const server = socketDir === null ? null : net.createServer(serve);
  const socketPath = socketDir === null ? null : join(socketDir, SOCKET_NAME);
  if (server !== null && socketPath !== null) {
    await Deno.remove(socketPath).catch(() => {});
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(socketPath, () => resolve());
    });
    await Deno.chmod(socketPath, 0o600);
  }

  return {
    socketDir,
    connect() {
      const [client, own] = memorySocketPair();
      serve(own);
      return client;
    },
    async listen(channel, onNotify) {
      const release = await lock.acquire();
      try {
        // LISTEN makes the session emit NotificationResponse messages, which the connection
        // that committed the NOTIFY carries; serveConnection picks them out of its output.
        await db.exec(`LISTEN "${channel.replaceAll('"', '""')}"`);
        let set = listeners.get(channel);
        if (!set) listeners.set(channel, set = new Set());
        set.add(onNotify);
      } finally {
        release();
      }
    },
    async close() {
      await new Promise<void>((resolve) => {
        if (server === null) resolve();
        else server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
      });
      if (socketPath !== null) await Deno.remove(socketPath).catch(() => {});
      const release = await lock.acquire();
      try {
        await db.close();
      } finally {
        release();
      }
    },
  };
}

/** What a connection shares with the others. */
interface ConnectionContext {
  db: PGlite;
  lock: SessionLock;
  socket: Duplex;
  listeners: Map<string, Set<() => void>>;
  /** PGlite's answers to startup messages, by the message's bytes (latin1). */
  startupAnswers: Map<string, Uint8Array>;
}

function serveConnection(context: ConnectionContext): void {
  const { db, lock, socket, listeners, startupAnswers } = context;
  let buffer: Uint8Array = new Uint8Array(0);
  let started = false;
  let batch: Uint8Array[] = [];
  let release: (() => void) | null = null;
  let idleTimer: ReturnType<typeof setTimeout> | undefined;
  let work = Promise.resolve();
  /** The Parse of a describe-first exchange, to run again before its Bind (see the module doc). */
  let parseToRepeat: Uint8Array | null = null;
  /** The statements this connection named, deallocated when it closes. */
  const named = new Set<string>();
  /**
   * Whether PostgreSQL is skipping this connection's messages until its Sync: after an error in
   * an exchange the client has not ended yet (its Sync follows), as the protocol has it.
   */
  let skippingToSync = false;

  /** Runs `unit` under the session lock; `record`, if given, gets everything PGlite answered. */
  const runUnit = (unit: Uint8Array[], record?: (answer: Uint8Array) => void) => {
    const answer: Uint8Array[] = [];
    work = work.then(async () => {
      if (socket.destroyed) return;
      clearTimeout(idleTimer);
      release ??= await lock.acquire();
      const repeated = parseToRepeat !== null && unit[0]?.[0] === MSG_BIND ? parseToRepeat : null;
      parseToRepeat = null;
      let midExchange = unit.at(-1)?.[0] === MSG_FLUSH;
      const scanner = new BackendScanner(listeners);
      try {
        for (const message of repeated ? [repeated, ...unit] : unit) {
          if (message[0] === MSG_TERMINATE) {
            socket.end();
            break;
          }
          if (message[0] === MSG_PARSE && message[5] !== 0) named.add(statementName(message));
          const hideParseComplete = message === repeated;
          await db.execProtocolRawStream(message, {
            onRawData: (data) => {
              if (hideParseComplete && isParseCompleteOnly(data)) return;
              // A copy: `data` is a view of the engine's memory, which its next answer reuses,
              // while a socket keeps what it cannot send at once in its write queue.
              const bytes = data.slice();
              if (record) answer.push(bytes);
              scanner.push(bytes);
              if (!socket.destroyed) socket.write(bytes);
            },
          });
        }
        const last = unit.at(-1)?.[0];
        if (last === MSG_SYNC || last === MSG_QUERY) skippingToSync = false;
        else if (scanner.sawError) skippingToSync = true;
        // Until that Sync the session is this connection's: another's messages would be skipped.
        if (midExchange && !skippingToSync && !db.isInTransaction() && isUnnamedDescribe(unit)) {
          parseToRepeat = unit[0];
          midExchange = false;
        }
        record?.(answer.reduce(concat, new Uint8Array(0)));
      } catch {
        socket.destroy();
      } finally {
        // After any other Flush the client reads a partial answer and continues the exchange.
        if (socket.destroyed || (!midExchange && !db.isInTransaction())) {
          await endSession();
        } else {
          idleTimer = setTimeout(() => socket.destroy(), TRANSACTION_IDLE_LIMIT_MS);
        }
      }
    });
  };

  // A connection that ends inside a transaction, or after an error before its Sync, must not
  // leave the session so for the next one.
  const endSession = async () => {
    if (!release) return;
    try {
      if (skippingToSync) await db.execProtocolRaw(SYNC_MESSAGE);
      skippingToSync = false;
      if (db.isInTransaction()) await db.exec("ROLLBACK");
    } catch {
      // the session is reset by the next BEGIN anyway
    }
    release();
    release = null;
  };

  socket.on("data", (chunk: Uint8Array) => {
    buffer = concat(buffer, chunk);
    let offset = 0;
    while (true) {
      const view = new DataView(buffer.buffer, buffer.byteOffset + offset);
      const available = buffer.length - offset;
      if (!started) {
        if (available < 8) break;
        const length = view.getInt32(0);
        if (available < length) break;
        const code = view.getInt32(4);
        const message = buffer.slice(offset, offset + length);
        offset += length;
        if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
          socket.write(new Uint8Array([0x4e])); // 'N': no encryption on a local socket
          continue;
        }
        started = true;
        if (code !== PROTOCOL_3) {
          runUnit([message]);
          continue;
        }
        const key = latin1(message);
        const remembered = startupAnswers.get(key);
        if (remembered) {
          socket.write(remembered);
          continue;
        }
        runUnit([message], (answer) => {
          if (isSuccessfulStartup(answer) && startupAnswers.size < STARTUP_ANSWER_LIMIT) {
            startupAnswers.set(key, answer);
          }
        });
        continue;
      }
      if (available < 5) break;
      const length = view.getInt32(1);
      if (available < length + 1) break;
      const type = buffer[offset];
      batch.push(buffer.slice(offset, offset + length + 1));
      offset += length + 1;
      if (
        type === MSG_SYNC || type === MSG_QUERY || type === MSG_FLUSH || type === MSG_TERMINATE
      ) {
        runUnit(batch);
        batch = [];
      }
    }
    buffer = buffer.slice(offset);
  });
  socket.on("error", () => socket.destroy());
  socket.on("close", () => {
    clearTimeout(idleTimer);
    work = work.then(endSession).then(deallocateNamed);
  });

  const deallocateNamed = async () => {
    if (named.size === 0) return;
    const unlock = await lock.acquire();
    try {
      for (const name of named) {
        // A statement whose Parse failed was never made: nothing to deallocate.
        await db.exec(`DEALLOCATE "${name.replaceAll('"', '""')}"`).catch(() => {});
      }
    } finally {
      named.clear();
      unlock();
    }
  };
}

/** The statement name of a Parse message: a C string after the type and length. */
function statementName(parse: Uint8Array): string {
  return new TextDecoder().decode(parse.subarray(5, parse.indexOf(0, 5)));
}

/**
 * Reads a stream of backend messages as it passes: calls the listeners of the channel of each
 * NotificationResponse ('A'), and notes whether an ErrorResponse ('E') went by. Other messages
 * are skipped by length without being copied.
 */
class BackendScanner {
  /** Whether an ErrorResponse has gone by. */
  sawError = false;
  #listeners: Map<string, Set<() => void>>;
  /** Bytes of a message header or of a notification message not complete yet. */
  #partial: Uint8Array = new Uint8Array(0);
  /** Bytes still to skip of a message that is not a notification. */
  #skip = 0;

  constructor(listeners: Map<string, Set<() => void>>) {
    this.#listeners = listeners;
  }

  push(chunk: Uint8Array): void {
    let data = chunk;
    if (this.#skip >= data.length) {
      this.#skip -= data.length;
      return;
    }
    data = data.subarray(this.#skip);
    this.#skip = 0;
    if (this.#partial.length > 0) data = concat(this.#partial, data);
    let offset = 0;
    while (data.length - offset >= 5) {
      const length = new DataView(data.buffer, data.byteOffset + offset).getInt32(1);
      const end = offset + 1 + length;
      if (data[offset] === MSG_ERROR) this.sawError = true;
      if (data[offset] !== MSG_NOTIFICATION || this.#listeners.size === 0) {
        if (end > data.length) {
          this.#skip = end - data.length;
          offset = data.length;
          break;
        }
        offset = end;
        continue;
      }
      if (end > data.length) break; // wait for the rest of the notification
      // Int32 process id, then the channel name as a C string.
      const start = offset + 9;
      const nul = data.indexOf(0, start);
      const channel = new TextDecoder().decode(data.subarray(start, nul));
      for (const listener of this.#listeners.get(channel) ?? []) listener();
      offset = end;
    }
    this.#partial = data.slice(offset);
  }
}

/**
 * Parse and Describe of the unnamed statement, then Flush: the first half of a describe-first
 * query.
 */
function isUnnamedDescribe(unit: Uint8Array[]): boolean {
  if (unit.length !== 3) return false;
  const [parse, describe] = unit;
  // Parse: type, Int32 length, statement name (empty: one NUL byte), ...
  // Describe: type, Int32 length, 'S', statement name (empty).
  return parse[0] === MSG_PARSE && parse[5] === 0 &&
    describe[0] === MSG_DESCRIBE && describe[5] === 0x53 && describe[6] === 0;
}

/**
 * Whether `answer` is a whole successful startup: AuthenticationOk first, ReadyForQuery last, no
 * ErrorResponse between (messages are walked by their lengths).
 */
function isSuccessfulStartup(answer: Uint8Array): boolean {
  if (answer.length < 14 || answer[0] !== MSG_AUTHENTICATION) return false;
  const view = new DataView(answer.buffer, answer.byteOffset, answer.byteLength);
  if (view.getInt32(5) !== 0) return false; // AuthenticationOk is code 0
  let offset = 0;
  let last = -1;
  while (offset + 5 <= answer.length) {
    last = answer[offset];
    if (last === MSG_ERROR) return false;
    offset += 1 + view.getInt32(offset + 1);
  }
  return offset === answer.length && last === MSG_READY_FOR_QUERY;
}

function latin1(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 4096) {
    text += String.fromCharCode(...bytes.subarray(i, i + 4096));
  }
  return text;
}

function isParseCompleteOnly(data: Uint8Array): boolean {
  return data.length === 5 && data[0] === MSG_PARSE_COMPLETE;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.length === 0) return b;
  const merged = new Uint8Array(a.length + b.length);
  merged.set(a);
  merged.set(b, a.length);
  return merged;
}
