/**
 * A tenant's callback endpoint on loopback, for tests, the demo and tenant developers. It records
 * every request the service sends, checks its `X-Service-Signature` against the tenant's webhook
 * secrets (docs/deliveries.md, "Verifying deliveries"), and can be scripted to answer the way real
 * receivers fail: any status with any headers (a 429 with `Retry-After`, a 302 with `Location`),
 * slow answers, answers that never come, connections reset without an answer, and oversized bodies.
 *
 * It runs on `node:http` rather than `Deno.serve`, as the store simulators do: only a Node
 * socket can be destroyed before any byte of an answer is written. Every answer carries
 * `Connection: close`, so a client never reuses a connection that a later scripted reset
 * destroys (fetch would silently retry on a fresh one and hide the reset).
 *
 * @example
 * ```ts
 * const receiver = await startCallbackReceiver({ secrets: ["whsec_..."] });
 * receiver.script({ status: 503, headers: { "Retry-After": "120" } });
 * // Set the tenant's callback URL to receiver.url and make the service deliver an event.
 * const [first, second] = await receiver.waitFor(2);
 * assert.equal(first.answeredStatus, 503);
 * assert.ok(second.signatureValid);
 * // The event id is stable across retries (at-least-once delivery).
 * assert.equal(second.headers["x-service-event-id"], first.headers["x-service-event-id"]);
 * await receiver.close();
 * ```
 *
 * @module
 */
import http from "node:http";
import { checkSignature, type SignatureCheck, type SignatureRefusal } from "./webhook_signature.ts";
import {
  answerAndClose,
  clientGone,
  closeServer,
  listenOnLoopback,
  type LoopbackAddress,
  sleepUnlessAborted,
} from "./loopback_http.ts";

/** Options of {@linkcode startCallbackReceiver}. */
export interface CallbackReceiverOptions {
  /** The tenant's webhook secrets; a request is valid when it verifies with any. Default none. */
  secrets?: string[];
  /** How far `t` may be from now, in seconds. Default 300: the 5 minutes tenants allow. */
  toleranceSeconds?: number;
  /** The path that accepts deliveries. Default `/hooks`. */
  path?: string;
  /**
   * Answer 401 to a request whose signature does not verify, as a careful tenant does, with
   * `{"error":"invalid signature","reason":...}`. A refused request does not use up a scripted
   * answer. Default false: the answer does not
   * depend on the signature and a test inspects `signatureValid`.
   */
  rejectInvalidSignatures?: boolean;
  /** The port to listen on. Default 0: a free one. */
  port?: number;
  /** The loopback address to listen on. Default `127.0.0.1`. */
  address?: LoopbackAddress;
  /** Called with each request once it is answered (or dropped), e.g. to print it. */
  onAnswered?: (delivery: ReceivedDelivery) => void;
}

/** One request the receiver received. */
export interface ReceivedDelivery {
  /** The request method; the service always sends POST. */
  method: string;
  /** The request path, query string included. */
  path: string;
  /** Request headers by lower-case name; repeated headers are joined with `, `. */
  headers: Record<string, string>;
  /** The raw body text (UTF-8), exactly what the signature covers. */
  body: string;
  /** The parsed body, or null when it is not JSON. */
  json: unknown;
  /** Whether `X-Service-Signature` verifies with one of the secrets set at arrival. */
  signatureValid: boolean;
  /** Why the signature was refused (docs/deliveries.md, "Verifying deliveries"); null if valid. */
  signatureRefusal: SignatureRefusal | null;
  /** The status answered; 0 while unanswered, and for good after a reset or a hang. */
  answeredStatus: number;
  /** Arrival time, epoch milliseconds. */
  receivedAt: number;
}

/**
 * An answer to script for the next request(s) to the delivery path. Without `reset` or `hang`
 * a status is always answered, 200 by default.
 */
export interface ScriptedCallbackAnswer {
  /** HTTP status to answer. Default 200. */
  status?: number;
  /** Body text. Default `{"ok":true}` for a 2xx, `{"error":"scripted"}` otherwise. */
  body?: string;
  /** Extra response headers, e.g. `Retry-After` or `Location`. */
  headers?: Record<string, string>;
  /** Wait this long before answering (or resetting). */
  delayMs?: number;
  /** Never answer; the request stays open until the client leaves or the receiver closes. */
  hang?: boolean;
  /** Close the connection without sending a single byte: the client's fetch rejects. */
  reset?: boolean;
  /** Answer a body of this many bytes (`x` repeated) instead of `body`. */
  bodyBytes?: number;
  /** How many requests this answer applies to. Default 1. */
  times?: number;
}

/** A running callback receiver. */
export interface CallbackReceiver {
  /** Where to deliver: `http://127.0.0.1:<port>/hooks`. */
  readonly url: string;
  /** Every request received, in order of arrival, whatever it was answered. Tests may clear it. */
  readonly deliveries: ReceivedDelivery[];
  /** Replaces the secrets that later requests are verified with (a rotation on the tenant side). */
  setSecrets(secrets: string[]): void;
  /** Queues an answer after those already queued; with none queued the answer is 200. */
  script(answer: ScriptedCallbackAnswer): void;
  /** Drops the answers still queued. */
  clearScripts(): void;
  /**
   * Resolves with the deliveries once at least `count` requests have arrived (they may not be
   * answered yet); rejects after `timeoutMs` (default 10 000) saying how many arrived.
   */
  waitFor(count: number, timeoutMs?: number): Promise<ReceivedDelivery[]>;
  /** The requests answered 2xx. */
  accepted(): ReceivedDelivery[];
  /** Requests received but not answered yet (delayed or hanging), for concurrency checks. */
  inFlight(): number;
  /** The most requests ever in flight at the same moment. */
  maxInFlight(): number;
  /** Stops listening, drops open connections (ending hanging requests) and cuts delays short. */
  close(): Promise<void>;
}

/**
 * Starts a callback receiver on 127.0.0.1 on a free port.
 *
 * @example
 * ```ts
 * const receiver = await startCallbackReceiver({ secrets: [secret], rejectInvalidSignatures: true });
 * receiver.script({ reset: true });
 * receiver.script({ status: 500, times: 2 });
 * ```
 */
export async function startCallbackReceiver(
  options: CallbackReceiverOptions = {},
): Promise<CallbackReceiver> {
  const receiver = new Receiver(options);
  await receiver.listen();
  return receiver;
}

/** Statuses whose answer must not have a body (RFC 9110). */
const BODYLESS_STATUSES = new Set([204, 205, 304]);

interface Waiter {
  count: number;
  resolve(deliveries: ReceivedDelivery[]): void;
  reject(error: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

class Receiver implements CallbackReceiver {
  url = "";
  readonly deliveries: ReceivedDelivery[] = [];
  #secrets: string[];
  readonly #toleranceSeconds: number;
  readonly #path: string;
  readonly #rejectInvalidSignatures: boolean;
  readonly #port: number;
  readonly #address: LoopbackAddress;
  readonly #onAnswered: ((delivery: ReceivedDelivery) => void) | null;
  readonly #scripts: ScriptedCallbackAnswer[] = [];
  readonly #waiters = new Set<Waiter>();
  #inFlight = 0;
  #maxInFlight = 0;
  #closed = false;
  readonly #server = http.createServer((req, res) => {
    this.#handle(req, res).catch((error) => {
      // A bug here must not hang the client: answer 500 with no body.
      console.error("callback receiver:", error);
      if (!res.headersSent) res.writeHead(500, { Connection: "close" }).end();
    });
  });

  constructor(options: CallbackReceiverOptions) {
    this.#secrets = [...(options.secrets ?? [])];
    this.#toleranceSeconds = options.toleranceSeconds ?? 300;
    this.#path = options.path ?? "/hooks";
    this.#rejectInvalidSignatures = options.rejectInvalidSignatures ?? false;
    this.#port = options.port ?? 0;
    this.#address = options.address ?? "127.0.0.1";
    this.#onAnswered = options.onAnswered ?? null;
  }

  async listen(): Promise<void> {
    const port = await listenOnLoopback(this.#server, {
      port: this.#port,
      address: this.#address,
    });
    const host = this.#address.includes(":") ? `[${this.#address}]` : this.#address;
    this.url = `http://${host}:${port}${this.#path}`;
  }

  setSecrets(secrets: string[]): void {
    this.#secrets = [...secrets];
  }

  script(answer: ScriptedCallbackAnswer): void {
    this.#scripts.push({ ...answer, times: answer.times ?? 1 });
  }

  clearScripts(): void {
    this.#scripts.length = 0;
  }

  waitFor(count: number, timeoutMs = 10_000): Promise<ReceivedDelivery[]> {
    if (this.deliveries.length >= count) return Promise.resolve([...this.deliveries]);
    if (this.#closed) {
      return Promise.reject(new Error(this.#shortfall(count, "the receiver is closed")));
    }
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        count,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.#waiters.delete(waiter);
          reject(new Error(this.#shortfall(count, `waited ${timeoutMs} ms`)));
        }, timeoutMs),
      };
      this.#waiters.add(waiter);
    });
  }

  accepted(): ReceivedDelivery[] {
    return this.deliveries.filter((d) => d.answeredStatus >= 200 && d.answeredStatus < 300);
  }

  inFlight(): number {
    return this.#inFlight;
  }

  maxInFlight(): number {
    return this.#maxInFlight;
  }

  close(): Promise<void> {
    this.#closed = true;
    for (const waiter of this.#waiters) {
      clearTimeout(waiter.timer);
      waiter.reject(new Error(this.#shortfall(waiter.count, "the receiver was closed")));
    }
    this.#waiters.clear();
    // Destroys hanging and delayed requests too; their `close` events settle them.
    return closeServer(this.#server);
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const receivedAt = Date.now();
    this.#inFlight++;
    this.#maxInFlight = Math.max(this.#maxInFlight, this.#inFlight);
    let unanswered = true;
    let recorded: ReceivedDelivery | null = null;
    const settle = () => {
      if (unanswered) {
        unanswered = false;
        this.#inFlight--;
        if (recorded !== null) this.#onAnswered?.(recorded);
      }
    };
    // The client left, or close() dropped the connection, before an answer.
    res.once("close", settle);

    let body: string;
    try {
      body = await readBody(req);
    } catch {
      settle();
      res.destroy();
      return;
    }
    const headers = headersOf(req);
    const signature = this.#check(headers["x-service-signature"] ?? null, body);
    const delivery: ReceivedDelivery = {
      method: req.method ?? "",
      path: req.url ?? "/",
      headers,
      body,
      json: parseJson(body),
      signatureValid: signature.valid,
      signatureRefusal: signature.reason,
      answeredStatus: 0,
      receivedAt,
    };
    this.deliveries.push(delivery);
    recorded = delivery;
    this.#wakeWaiters();

    const answer = (status: number, text: string, extra?: Record<string, string>) => {
      delivery.answeredStatus = status;
      settle();
      answerAndClose(res, status, BODYLESS_STATUSES.has(status) ? "" : text, extra);
    };
    if (new URL(delivery.path, "http://127.0.0.1").pathname !== this.#path) {
      answer(404, '{"error":"not found"}');
      return;
    }
    if (delivery.method !== "POST") {
      answer(405, '{"error":"method not allowed"}', { Allow: "POST" });
      return;
    }
    if (this.#rejectInvalidSignatures && !delivery.signatureValid) {
      answer(
        401,
        JSON.stringify({ error: "invalid signature", reason: delivery.signatureRefusal }),
      );
      return;
    }

    const scripted = this.#nextScripted();
    if (scripted === undefined) {
      answer(200, '{"ok":true}');
      return;
    }
    if (scripted.delayMs) {
      const completed = await sleepUnlessAborted(scripted.delayMs, clientGone(res));
      if (!completed) {
        res.destroy();
        return;
      }
    }
    if (scripted.reset) {
      settle();
      req.socket.destroy();
      return;
    }
    // A hanging request is settled by the `close` of its connection.
    if (scripted.hang) return;
    const status = scripted.status ?? 200;
    const text = scripted.bodyBytes !== undefined
      ? "x".repeat(scripted.bodyBytes)
      : scripted.body ?? (status >= 200 && status < 300 ? '{"ok":true}' : '{"error":"scripted"}');
    const extra = scripted.bodyBytes !== undefined
      ? { "Content-Type": "text/plain", ...scripted.headers }
      : scripted.headers;
    answer(status, text, extra);
  }

  #check(header: string | null, body: string): SignatureCheck {
    return checkSignature(this.#secrets, header, body, {
      toleranceSeconds: this.#toleranceSeconds,
    });
  }

  #nextScripted(): ScriptedCallbackAnswer | undefined {
    const next = this.#scripts[0];
    if (next === undefined) return undefined;
    next.times = (next.times ?? 1) - 1;
    if (next.times <= 0) this.#scripts.shift();
    return next;
  }

  #wakeWaiters(): void {
    for (const waiter of this.#waiters) {
      if (this.deliveries.length < waiter.count) continue;
      clearTimeout(waiter.timer);
      this.#waiters.delete(waiter);
      waiter.resolve([...this.deliveries]);
    }
  }

  #shortfall(count: number, why: string): string {
    return `callback receiver: ${why} for ${count} request(s), ${this.deliveries.length} arrived`;
  }
}

/** The whole request body as UTF-8 text; rejects when the client leaves before its end. */
function readBody(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Uint8Array[] = [];
    let ended = false;
    req.on("data", (chunk: Uint8Array) => chunks.push(chunk));
    req.once("end", () => {
      ended = true;
      const bytes = new Uint8Array(chunks.reduce((sum, chunk) => sum + chunk.length, 0));
      let offset = 0;
      for (const chunk of chunks) {
        bytes.set(chunk, offset);
        offset += chunk.length;
      }
      resolve(new TextDecoder().decode(bytes));
    });
    req.once("error", reject);
    req.once("close", () => {
      if (!ended) reject(new Error("the client left before the end of the body"));
    });
  });
}

function headersOf(req: http.IncomingMessage): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(", ") : value;
  }
  return headers;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
