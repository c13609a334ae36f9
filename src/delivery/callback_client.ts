/**
 * POSTs to a checked callback over a connection to one of its checked addresses: HTTP/1.1 written
 * over the runtime's own TCP and TLS (`Deno.connect`, `Deno.startTls`). The host name is never
 * resolved again, while TLS still sends it as SNI and verifies the certificate against it, and
 * `Host` carries it. Redirects are not followed; only the first `bodyLimit` bytes of the answer
 * are read, and a connection whose answer was not read to its end is closed rather than kept.
 * A kept connection is watched while idle, and any byte it receives then closes it: an answer
 * only ever comes from bytes that arrived after its request was written.
 *
 * Hand-written, not `node:http(s)` or `fetch` (docs/architecture.md, "Why it is built this way"):
 * `fetch` resolves the name itself and cannot be pinned to an address over TLS, and in this runtime
 * `node:http`, like undici, costs twice the CPU per POST of the few steps a delivery needs.
 */
import { RelayError } from "../errors.ts";
import type { CheckedCallback } from "./callback_target.ts";

/**
 * How long a connection to a callback is kept open, idle, for the next attempt. A callback that
 * closes it sooner costs nothing: an attempt whose kept connection turns out closed before any
 * byte of an answer is sent again on a new connection.
 */
export const IDLE_CONNECTION_MS = 30_000;
/**
 * Idle connections kept per host, port and set of checked addresses: more than the dispatcher's
 * default concurrency (64), so that a burst's connections all serve the next one.
 */
const IDLE_CONNECTIONS_PER_TARGET = 256;
/** The most bytes of status line and headers read before the answer is refused. */
const MAX_HEAD_BYTES = 64 * 1024;
/** The most bytes of one chunk-size line (with extensions) of a chunked body. */
const MAX_CHUNK_LINE_BYTES = 4 * 1024;
/**
 * The read buffer's first size: a callback's answer is usually a few hundred bytes, and the buffer
 * doubles when a longer one needs it (up to the bounds above).
 */
const FIRST_READ_BYTES = 2 * 1024;

/** Statuses whose answer has no body (the Fetch standard's null body statuses). */
const NULL_BODY_STATUSES = [101, 103, 204, 205, 304];

const ONE_BYTE = new Uint8Array(1);

const encoder = new TextEncoder();
const latin1 = new TextDecoder("latin1");
const utf8 = new TextDecoder();

/** What comes back from a callback. */
export interface CallbackAnswer {
  status: number;
  retryAfter: string | null;
  /** The first `bodyLimit` bytes as text; null when the body was cut short. */
  bodyPrefix: string | null;
}

/** One POST. */
export interface CallbackPost {
  headers: Record<string, string>;
  /** The body's bytes, as sent (and signed). */
  body: Uint8Array;
  bodyLimit: number;
  /** The attempt's deadline: connecting, sending and reading the answer. */
  signal: AbortSignal;
}

/** An open connection to a callback, and where it leads. */
interface Connection {
  conn: Deno.Conn;
  /** The target it was opened for: host, port, protocol and checked addresses. */
  key: string;
  /** When it was last kept idle, in `performance.now()` milliseconds. */
  idleSince: number;
  /** The read left pending on it since it was last kept; null once the next answer took it. */
  watch: IdleWatch | null;
}

/**
 * A read left pending on a kept connection. A callback has nothing to send between answers, so
 * when it completes while the connection is idle (bytes, the end of the stream or an error) the
 * connection is closed; a request written on the connection afterwards takes its bytes as the
 * first of its answer.
 */
interface IdleWatch {
  buffer: Uint8Array;
  read: Promise<number | null>;
  /** The read completed. */
  settled: boolean;
  /** The connection is in the pool, not taken by an attempt. */
  idle: boolean;
}

/**
 * Connections kept open between attempts (a cache of idle sockets, each kept for 30 s). A socket
 * is reused only for the same host, port and set of checked addresses, so it always leads to an
 * address that passed the check for this attempt (where nothing is checked, for the same host and
 * port). Without one, each attempt has its own connection, closed after it.
 */
export class CallbackConnections {
  /** Idle connections per target, oldest first. */
  #idle = new Map<string, Connection[]>();
  #open = new Set<Connection>();
  #closed = false;
  /** Closes connections idle for too long; runs only while some are idle. */
  #sweeper: ReturnType<typeof setInterval> | undefined;
  #now: () => number;
  /** Opened at the first reuse of a kept connection. */
  #poll: Promise<SocketPoll> | null = null;

  /** `now` is the clock of idle times, `performance.now()` unless a test gives another. */
  constructor(options: { now?: () => number } = {}) {
    this.#now = options.now ?? (() => performance.now());
  }

  /**
   * An idle connection to `key`, the most recently used, or null. Its idle watch is still
   * pending: before writing on it, wait for {@linkcode polled} and look at the watch again.
   */
  take(key: string): Connection | null {
    const idle = this.#idle.get(key);
    const connection = idle?.pop() ?? null;
    if (idle?.length === 0) this.#idle.delete(key);
    if (connection !== null && this.#now() - connection.idleSince >= IDLE_CONNECTION_MS) {
      // The newest is too old, so are the rest: the sweep has not come round yet.
      for (const stale of [connection, ...idle ?? []]) this.discard(stale);
      this.#idle.delete(key);
      return null;
    }
    if (connection !== null) {
      connection.watch!.idle = false;
      // In use again: its reads keep the process running, as a new connection's do.
      connection.conn.ref();
    }
    return connection;
  }

  /**
   * Resolves once the runtime has polled every socket since the call, and the reads that poll
   * completed have run their callbacks: a byte that reached a kept connection before the call
   * has then settled its idle watch. Rejects when that cannot be established.
   */
  async polled(): Promise<void> {
    if (this.#closed) throw new Deno.errors.Interrupted("the dispatcher is stopping");
    this.#poll ??= SocketPoll.open();
    const poll = this.#poll;
    try {
      await (await poll).next();
    } catch (error) {
      // A broken loopback pair is made again for the next attempt.
      if (this.#poll === poll) this.#poll = null;
      poll.then((opened) => opened.close(), () => {});
      throw error;
    }
  }

  /** Counts `connection` as open, so that {@linkcode close} ends it. */
  opened(connection: Connection): void {
    if (this.#closed) {
      closeQuietly(connection.conn);
      throw new Deno.errors.Interrupted("the dispatcher is stopping");
    }
    this.#open.add(connection);
  }

  /**
   * Keeps `connection` for the next attempt to the same target, or closes it when full. It is
   * watched while idle: a byte, the end of the stream or an error closes it.
   */
  keep(connection: Connection): void {
    const idle = this.#idle.get(connection.key) ?? [];
    if (this.#closed || idle.length >= IDLE_CONNECTIONS_PER_TARGET) {
      this.discard(connection);
      return;
    }
    const buffer = new Uint8Array(FIRST_READ_BYTES);
    const watch: IdleWatch = {
      buffer,
      read: connection.conn.read(buffer),
      settled: false,
      idle: true,
    };
    const settle = () => {
      watch.settled = true;
      if (watch.idle) this.#forget(connection);
    };
    watch.read.then(settle, settle);
    // An idle connection does not keep the process running.
    connection.conn.unref();
    connection.watch = watch;
    connection.idleSince = this.#now();
    idle.push(connection);
    this.#idle.set(connection.key, idle);
    if (this.#sweeper === undefined) {
      // One timer for every idle connection, not one each: attempts keep and take thousands a
      // second. It does not keep the process running.
      const sweeper = setInterval(() => this.#sweep(), IDLE_CONNECTION_MS / 3);
      Deno.unrefTimer(sweeper);
      this.#sweeper = sweeper;
    }
  }

  /** Closes the connections idle for {@linkcode IDLE_CONNECTION_MS} or more. */
  #sweep(): void {
    const before = this.#now() - IDLE_CONNECTION_MS;
    for (const [key, idle] of this.#idle) {
      let stale = 0;
      while (stale < idle.length && idle[stale].idleSince <= before) this.discard(idle[stale++]);
      idle.splice(0, stale);
      if (idle.length === 0) this.#idle.delete(key);
    }
    if (this.#idle.size === 0) {
      clearInterval(this.#sweeper);
      this.#sweeper = undefined;
    }
  }

  /** Takes an idle `connection` out of the pool and closes it. */
  #forget(connection: Connection): void {
    const idle = this.#idle.get(connection.key);
    const at = idle?.indexOf(connection) ?? -1;
    if (at !== -1) idle!.splice(at, 1);
    if (idle?.length === 0) this.#idle.delete(connection.key);
    this.discard(connection);
  }

  /** Closes `connection` and forgets it. */
  discard(connection: Connection): void {
    if (connection.watch !== null) connection.watch.idle = false;
    this.#open.delete(connection);
    closeQuietly(connection.conn);
  }

  /** Closes every connection, idle or not; attempts in flight on them fail. */
  close(): void {
    this.#closed = true;
    clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    this.#idle.clear();
    for (const connection of this.#open) this.discard(connection);
    this.#poll?.then((poll) => poll.close(), () => {});
    this.#poll = null;
  }
}

/**
 * A loopback connection of the pool's own, to tell when the runtime has polled its sockets. A
 * byte written on one end can only be read on the other once the runtime has waited on its
 * sockets, and that wait also reports every other socket that had bytes by then: their reads
 * complete in the same turn or earlier, and their callbacks run first (they were woken first, and
 * the callers waiting here are let go a few microtasks later). A timer does not tell this: in
 * Deno 2 a timer can fire in the turn that polled a socket, before that socket's read is
 * delivered.
 */
class SocketPoll {
  #sender: Deno.Conn;
  #receiver: Deno.Conn;
  /** The receiver's read, left pending between rounds, so that it completes only after a poll. */
  #read: Promise<number | null>;
  #sink = new Uint8Array(64);
  /** Callers waiting for the next round, which writes its byte after they asked. */
  #waiting: { resolve: () => void; reject: (error: unknown) => void }[] = [];
  #inFlight = false;
  #broken: unknown = null;

  private constructor(sender: Deno.Conn, receiver: Deno.Conn) {
    this.#sender = sender;
    this.#receiver = receiver;
    this.#read = this.#pendingRead();
  }

  /** A connected pair on loopback, checked to be the pool's own two ends. */
  static async open(): Promise<SocketPoll> {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    let sender: Deno.TcpConn | null = null;
    try {
      const accepted = listener.accept();
      // Rejects when the listener closes first, which the caller then learns from `connect`.
      accepted.catch(() => {});
      sender = await Deno.connect({ hostname: "127.0.0.1", port: listener.addr.port });
      const receiver = await accepted;
      if (receiver.remoteAddr.port !== sender.localAddr.port) {
        // Another local process connected first.
        closeQuietly(receiver);
        throw new Deno.errors.ConnectionRefused("the loopback pair was not the pool's own");
      }
      sender.setNoDelay(true);
      return new SocketPoll(sender, receiver);
    } catch (error) {
      if (sender !== null) closeQuietly(sender);
      throw error;
    } finally {
      listener.close();
    }
  }

  #pendingRead(): Promise<number | null> {
    const read = this.#receiver.read(this.#sink);
    // Pending between rounds, it must not keep the process running.
    this.#receiver.unref();
    read.catch(() => {});
    return read;
  }

  /** Resolves after a round that started (wrote its byte) after the call. */
  next(): Promise<void> {
    if (this.#broken !== null) return Promise.reject(this.#broken);
    const { promise, resolve, reject } = Promise.withResolvers<void>();
    this.#waiting.push({ resolve, reject });
    if (!this.#inFlight) this.#round();
    return promise;
  }

  async #round(): Promise<void> {
    this.#inFlight = true;
    const waiting = this.#waiting;
    this.#waiting = [];
    try {
      this.#receiver.ref();
      await this.#sender.write(ONE_BYTE);
      if (await this.#read === null) {
        throw new Deno.errors.UnexpectedEof("the loopback pair closed");
      }
      // Started with nothing left to read, it completes only after the next round's poll.
      this.#read = this.#pendingRead();
      // Let the callbacks of reads that completed in this turn run before the waiting ones.
      for (let turn = 0; turn < 3; turn++) await null;
      for (const waiter of waiting) waiter.resolve();
    } catch (error) {
      this.#broken = error;
      for (const waiter of [...waiting, ...this.#waiting]) waiter.reject(error);
      this.#waiting = [];
      return;
    } finally {
      this.#inFlight = false;
    }
    if (this.#waiting.length > 0) this.#round();
  }

  close(): void {
    this.#broken ??= new Deno.errors.Interrupted("the dispatcher is stopping");
    closeQuietly(this.#sender);
    closeQuietly(this.#receiver);
  }
}

/**
 * POSTs `post` to `target`, connecting only to `target.addresses` when it has them. Rejects on a
 * network error or when `post.signal` aborts before the status line arrived; after it, the answer
 * is returned with a null `bodyPrefix`.
 */
export async function postToCallback(
  target: CheckedCallback,
  post: CallbackPost,
  connections?: CallbackConnections,
): Promise<CallbackAnswer> {
  const request = requestBytes(target, post);
  const key = targetKey(target);
  const kept = connections?.take(key) ?? null;
  if (kept !== null) {
    const answer = await exchange(kept, request, post, connections, true);
    if (answer !== null) return answer;
    // A kept connection the callback closed while it was idle: nothing of an answer came, so the
    // request is sent again on a new connection.
  }
  const conn = await connect(target, post.signal);
  const connection: Connection = { conn, key, idleSince: 0, watch: null };
  connections?.opened(connection);
  return (await exchange(connection, request, post, connections, false))!;
}

/** The pool key: protocol, host, port and the checked addresses, in a canonical order. */
function targetKey(target: CheckedCallback): string {
  const addresses = target.addresses === null ? "" : [...target.addresses].sort().join(",");
  return `${target.url.protocol}//${target.host}:${portOf(target.url)}|${addresses}`;
}

function portOf(url: URL): number {
  return url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
}

/** The request line, headers and body, as one buffer to write. */
function requestBytes(target: CheckedCallback, post: CallbackPost): Uint8Array {
  const body = post.body;
  let head = `POST ${target.url.pathname}${target.url.search} HTTP/1.1\r\n` +
    `host: ${target.url.host}\r\n`;
  for (const [name, value] of Object.entries(post.headers)) {
    // A header split across lines would let a value write headers of its own.
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name) || /[\r\n\0]/.test(value)) {
      throw new TypeError(`invalid request header ${JSON.stringify(name)}`);
    }
    head += `${name}: ${value}\r\n`;
  }
  head += `content-length: ${body.length}\r\n\r\n`;
  const headBytes = encoder.encode(head);
  const bytes = new Uint8Array(headBytes.length + body.length);
  bytes.set(headBytes);
  bytes.set(body, headBytes.length);
  return bytes;
}

/**
 * Opens a connection to the first of the checked addresses that accepts one (or to the host, when
 * nothing was checked), then TLS for https, naming the host.
 */
async function connect(target: CheckedCallback, signal: AbortSignal): Promise<Deno.Conn> {
  const port = portOf(target.url);
  const candidates = target.addresses ?? [target.host];
  let lastError: unknown = null;
  for (const hostname of candidates) {
    signal.throwIfAborted();
    let tcp: Deno.TcpConn;
    try {
      tcp = await Deno.connect({ hostname, port, signal });
    } catch (error) {
      lastError = error;
      continue;
    }
    tcp.setNoDelay(true);
    if (target.url.protocol !== "https:") return tcp;
    const tls = await Deno.startTls(tcp, { hostname: target.host });
    // The handshake runs under the attempt's deadline like everything else.
    const onAbort = () => closeQuietly(tls);
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      await tls.handshake();
    } catch (error) {
      closeQuietly(tls);
      throw error;
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
    return tls;
  }
  throw lastError;
}

/**
 * Writes the request and reads the answer on `connection`, which it keeps for the next attempt
 * when the answer was read whole and the callback did not ask to close it, and closes otherwise.
 * On a connection that was `kept` idle, a failure before any byte of an answer resolves to null:
 * the callback closed it meanwhile (or sent bytes nobody asked for), and the request can be sent
 * again on a new one.
 */
async function exchange(
  connection: Connection,
  request: Uint8Array,
  post: CallbackPost,
  connections: CallbackConnections | undefined,
  kept: boolean,
): Promise<CallbackAnswer | null> {
  const watch = connection.watch;
  connection.watch = null;
  const reader = new AnswerReader(connection.conn, watch);
  const onAbort = () => closeQuietly(connection.conn);
  post.signal.addEventListener("abort", onAbort, { once: true });
  let reusable = false;
  try {
    if (kept) {
      // Bytes that reached the connection before this attempt took it, and whose read the
      // runtime has not yet delivered, would be read as this request's answer: wait until the
      // runtime has polled its sockets, then look at the idle watch again.
      const polled = await connections!.polled().then(() => true, () => false);
      post.signal.throwIfAborted();
      if (!polled || watch!.settled) return null;
    }
    await writeAll(connection.conn, request);
    const head = await reader.head();
    const prefix = await reader.bodyPrefix(head, post.bodyLimit).catch(() => null);
    reusable = prefix !== null && prefix.whole && head.keepAlive && reader.buffered === 0 &&
      !post.signal.aborted;
    const bodyPrefix = prefix === null || post.signal.aborted ? null : utf8.decode(prefix.bytes);
    return {
      status: head.status,
      retryAfter: head.retryAfter,
      // As fetch has it: these statuses have no body.
      bodyPrefix: NULL_BODY_STATUSES.includes(head.status) ? null : bodyPrefix,
    };
  } catch (error) {
    if (post.signal.aborted) throw post.signal.reason;
    if (kept && !reader.received) return null;
    throw error;
  } finally {
    post.signal.removeEventListener("abort", onAbort);
    if (reusable && connections !== undefined) connections.keep(connection);
    else if (connections !== undefined) connections.discard(connection);
    else closeQuietly(connection.conn);
  }
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let written = 0;
  while (written < bytes.length) written += await conn.write(bytes.subarray(written));
}

/** The status line and the headers the sender reads. */
interface AnswerHead {
  status: number;
  retryAfter: string | null;
  /** A body of this many bytes; null when it is chunked or ends with the connection. */
  contentLength: number | null;
  chunked: boolean;
  /** The callback lets the connection be used again. */
  keepAlive: boolean;
}

/** Reads one HTTP/1.1 answer from a connection, never more than it needs. */
class AnswerReader {
  #conn: Deno.Conn;
  #buffer: Uint8Array;
  #start = 0;
  #end = 0;
  /** The idle watch's read, still pending when the request was written: the answer's first. */
  #pending: Promise<number | null> | null;
  /** Bytes were received on this connection for this answer. */
  #received = false;
  /** Bytes of lines consumed so far, to bound a head. */
  #consumed = 0;

  constructor(conn: Deno.Conn, watch: IdleWatch | null) {
    this.#conn = conn;
    this.#buffer = watch?.buffer ?? new Uint8Array(FIRST_READ_BYTES);
    this.#pending = watch?.read ?? null;
  }

  /** Whether any byte of an answer arrived. */
  get received(): boolean {
    return this.#received;
  }

  /** Bytes read from the socket and not yet consumed. */
  get buffered(): number {
    return this.#end - this.#start;
  }

  /** Reads more from the socket; false at its end. */
  async #fill(): Promise<boolean> {
    if (this.#start > 0 && this.#start === this.#end) this.#start = this.#end = 0;
    if (this.#end === this.#buffer.length) {
      // Full: move what is unread to the front, and double the buffer if that is half of it.
      if (this.buffered * 2 > this.#buffer.length) {
        const grown = new Uint8Array(this.#buffer.length * 2);
        grown.set(this.#buffer.subarray(this.#start, this.#end));
        this.#buffer = grown;
      } else {
        this.#buffer.copyWithin(0, this.#start, this.#end);
      }
      this.#end -= this.#start;
      this.#start = 0;
    }
    let n: number | null;
    if (this.#pending !== null) {
      // Reads into the start of the buffer, which is empty: nothing was read before it.
      const pending = this.#pending;
      this.#pending = null;
      n = await pending;
    } else {
      n = await this.#conn.read(this.#buffer.subarray(this.#end));
    }
    if (n === null) return false;
    this.#received = true;
    this.#end += n;
    return true;
  }

  /** The index just past the next CRLF (or LF) at or after `from`, or -1. */
  #lineEnd(from: number): number {
    const at = this.#buffer.subarray(from, this.#end).indexOf(10);
    return at === -1 ? -1 : from + at + 1;
  }

  /** The next line without its CRLF, once it is whole; null at the end of the stream. */
  async #line(limit: number): Promise<string | null> {
    while (true) {
      const end = this.#lineEnd(this.#start);
      if (end !== -1) {
        const line = latin1.decode(this.#buffer.subarray(this.#start, end)).replace(/\r?\n$/, "");
        this.#consumed += end - this.#start;
        this.#start = end;
        return line;
      }
      if (this.buffered >= limit) throw new CallbackAnswerError("a line is too long");
      if (!await this.#fill()) return null;
    }
  }

  /** The final answer's head; interim (1xx) answers are skipped, their bytes counted. */
  async head(): Promise<AnswerHead> {
    const start = this.#consumed;
    const nextLine = async () => {
      const line = await this.#line(MAX_HEAD_BYTES);
      if (this.#consumed - start > MAX_HEAD_BYTES) {
        throw new CallbackAnswerError("the answer's headers are too large");
      }
      return line;
    };
    while (true) {
      const statusLine = await nextLine();
      if (statusLine === null) {
        throw new CallbackAnswerError(
          this.#received
            ? "the callback closed the connection mid-answer"
            : "the callback closed the connection without answering",
        );
      }
      const match = /^HTTP\/1\.([01]) ([1-9]\d\d)(?: |$)/.exec(statusLine);
      if (match === null) throw new CallbackAnswerError("the answer is not HTTP/1.x");
      const status = Number(match[2]);
      const fields = new Map<string, string[]>();
      while (true) {
        const line = await nextLine();
        if (line === null) {
          throw new CallbackAnswerError("the callback closed the connection mid-answer");
        }
        if (line === "") break;
        const colon = line.indexOf(":");
        if (colon <= 0) throw new CallbackAnswerError("a header line has no name");
        const name = line.slice(0, colon).trim().toLowerCase();
        fields.set(name, [...fields.get(name) ?? [], line.slice(colon + 1).trim()]);
      }
      // 101 answers a request to upgrade, which was never made: it is final, and ends the use of
      // the connection like any answer the sender cannot read the end of.
      if (status < 200 && status !== 101) continue;
      return headOf(status, match[1] === "1", fields);
    }
  }

  /**
   * The body's first `limit` bytes, and whether the body ended within them (read to its end, so
   * the connection can be used again). Rejects when the connection fails mid-body.
   */
  async bodyPrefix(
    head: AnswerHead,
    limit: number,
  ): Promise<{ bytes: Uint8Array; whole: boolean }> {
    if (NULL_BODY_STATUSES.includes(head.status) || head.contentLength === 0) {
      return { bytes: new Uint8Array(0), whole: head.status !== 101 };
    }
    if (head.chunked) return await this.#chunkedPrefix(limit);
    const wanted = head.contentLength === null ? limit : Math.min(head.contentLength, limit);
    while (this.buffered < wanted && await this.#fill());
    const take = Math.min(this.buffered, wanted);
    const bytes = this.#buffer.slice(this.#start, this.#start + take);
    this.#start += take;
    if (head.contentLength !== null && take < wanted) {
      throw new CallbackAnswerError("the callback closed the connection mid-body");
    }
    return { bytes, whole: head.contentLength !== null && take === head.contentLength };
  }

  async #chunkedPrefix(limit: number): Promise<{ bytes: Uint8Array; whole: boolean }> {
    const chunks: Uint8Array[] = [];
    let size = 0;
    while (size < limit) {
      const line = await this.#line(MAX_CHUNK_LINE_BYTES);
      if (line === null) throw new CallbackAnswerError("the chunked body ended early");
      const match = /^([0-9a-fA-F]{1,8})(?:[ \t]*;.*)?$/.exec(line);
      if (match === null) throw new CallbackAnswerError("a chunk size is not valid");
      let remaining = parseInt(match[1], 16);
      if (remaining === 0) {
        // Trailers, then the empty line that ends the body.
        const start = this.#consumed;
        while (true) {
          const trailer = await this.#line(MAX_HEAD_BYTES);
          if (trailer === null) throw new CallbackAnswerError("the chunked body ended early");
          if (trailer === "") return { bytes: concat(chunks, size), whole: true };
          if (this.#consumed - start > MAX_HEAD_BYTES) {
            throw new CallbackAnswerError("the answer's trailers are too large");
          }
        }
      }
      while (remaining > 0 && size < limit) {
        if (this.buffered === 0 && !await this.#fill()) {
          throw new CallbackAnswerError("the chunked body ended early");
        }
        const take = Math.min(this.buffered, remaining, limit - size);
        chunks.push(this.#buffer.slice(this.#start, this.#start + take));
        this.#start += take;
        size += take;
        remaining -= take;
      }
      if (remaining > 0) break;
      const end = await this.#line(MAX_CHUNK_LINE_BYTES);
      if (end !== "") throw new CallbackAnswerError("a chunk does not end where it should");
    }
    return { bytes: concat(chunks, size), whole: false };
  }
}

/** The fields of a head that the sender reads. */
function headOf(status: number, http11: boolean, fields: Map<string, string[]>): AnswerHead {
  const codings = (fields.get("transfer-encoding") ?? []).join(",").toLowerCase()
    .split(",").map((coding) => coding.trim()).filter((coding) => coding !== "");
  const chunked = codings.length > 0 && codings[codings.length - 1] === "chunked";
  if (codings.length > 0 && !chunked) {
    // A body whose end only the connection's end marks.
    return {
      status,
      retryAfter: first(fields, "retry-after"),
      contentLength: null,
      chunked,
      keepAlive: false,
    };
  }
  let contentLength: number | null = null;
  if (!chunked && fields.has("content-length")) {
    const values = new Set(
      fields.get("content-length")!.join(",").split(",").map((value) => value.trim()),
    );
    const [value] = values;
    if (values.size !== 1 || !/^\d{1,15}$/.test(value)) {
      throw new CallbackAnswerError("the answer's content-length is not valid");
    }
    contentLength = Number(value);
  }
  const connection = (fields.get("connection") ?? []).join(",").toLowerCase();
  // Both framings at once is how a response is smuggled past a proxy: the body is read as chunked,
  // as HTTP/1.1 says, but the connection is not trusted for another request.
  const keepAlive = http11 && !/(^|,)\s*close\s*(,|$)/.test(connection) &&
    !(chunked && fields.has("content-length")) &&
    (chunked || contentLength !== null || NULL_BODY_STATUSES.includes(status)) && status !== 101;
  return { status, retryAfter: first(fields, "retry-after"), contentLength, chunked, keepAlive };
}

function first(fields: Map<string, string[]>, name: string): string | null {
  return fields.get(name)?.[0] ?? null;
}

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return bytes;
}

/** The callback's answer could not be read as HTTP/1.1: it is recorded as a network error. */
export class CallbackAnswerError extends RelayError {
  constructor(message: string) {
    super("CALLBACK_ANSWER_INVALID", message);
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}
