/**
 * POSTs to a checked callback over a connection to one of its checked addresses. `node:http(s)`
 * with a `lookup` that answers those addresses: the host name is never resolved again, while TLS
 * still sends it as SNI and verifies the certificate against it, and `Host` carries it. Redirects
 * are not followed; only the first `bodyLimit` bytes of the answer are read.
 *
 * `fetch` cannot do this: it resolves the name itself, and its `tcp` proxy transport connects to
 * a fixed address but then speaks plain HTTP to an https URL.
 */
import http from "node:http";
import https from "node:https";
import type { LookupFunction } from "node:net";
import { Buffer } from "node:buffer";
import type { CheckedCallback } from "./callback_target.ts";
import { parseIpAddress } from "./special_addresses.ts";
import { untilAborted } from "../abort.ts";

/**
 * How long a connection to a callback is kept open, idle, for the next attempt. A callback that
 * closes it sooner costs nothing: the runtime sends again on a new connection a request whose
 * kept connection turns out closed.
 */
const IDLE_CONNECTION_MS = 30_000;
/**
 * Idle connections kept per host, port and set of checked addresses: more than the dispatcher's
 * default concurrency (64), so that a burst's connections all serve the next one.
 */
const IDLE_CONNECTIONS_PER_TARGET = 256;

/** Statuses whose answer has no body (the Fetch standard's null body statuses). */
const NULL_BODY_STATUSES = [101, 103, 204, 205, 304];

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
  body: string;
  bodyLimit: number;
  /** The attempt's deadline: connecting, sending and reading the answer. */
  signal: AbortSignal;
}

/**
 * Connections kept open between attempts (a cache of idle sockets, each kept for 30 s). A socket
 * is reused only for the same host, port and set of checked addresses, so it always leads to an
 * address that passed the check for this attempt (where nothing is checked, for the same host and
 * port). Without one, each attempt has its own connection, closed after it.
 */
export class CallbackConnections {
  #http = new PinnedHttpAgent(agentOptions());
  #https = new PinnedHttpsAgent(agentOptions());

  /** The agent for a URL's protocol. */
  agentFor(protocol: string): http.Agent {
    return protocol === "https:" ? this.#https : this.#http;
  }

  /** Closes every connection, idle or not. */
  close(): void {
    this.#http.destroy();
    this.#https.destroy();
  }
}

function agentOptions(): http.AgentOptions {
  return {
    keepAlive: true,
    maxFreeSockets: IDLE_CONNECTIONS_PER_TARGET,
    // Applies to idle sockets (they are closed); an attempt in flight has its own deadline.
    timeout: IDLE_CONNECTION_MS,
  };
}

/** The request options this module adds: the checked addresses, part of the pool's key. */
interface PinnedOptions {
  pinnedAddresses?: string;
}

class PinnedHttpAgent extends http.Agent {
  override getName(options: http.ClientRequestArgs & PinnedOptions = {}): string {
    return `${super.getName(options)}:${options.pinnedAddresses ?? ""}`;
  }
}

class PinnedHttpsAgent extends https.Agent {
  override getName(options: https.RequestOptions & PinnedOptions = {}): string {
    return `${super.getName(options)}:${options.pinnedAddresses ?? ""}`;
  }
}

/**
 * POSTs `post` to `target`, connecting only to `target.addresses` when it has them. Rejects on a
 * network error or when `post.signal` aborts before the status line arrived.
 */
export async function postToCallback(
  target: CheckedCallback,
  post: CallbackPost,
  connections?: CallbackConnections,
): Promise<CallbackAnswer> {
  const { url, host } = target;
  const secure = url.protocol === "https:";
  const body = Buffer.from(post.body);
  const options: https.RequestOptions & PinnedOptions = {
    host,
    port: url.port === "" ? (secure ? 443 : 80) : Number(url.port),
    path: `${url.pathname}${url.search}`,
    method: "POST",
    headers: { ...post.headers, host: url.host, "content-length": String(body.length) },
    agent: connections?.agentFor(url.protocol) ?? false,
    signal: post.signal,
  };
  if (target.addresses !== null) {
    options.lookup = pinnedLookup(target.addresses);
    options.pinnedAddresses = [...target.addresses].sort().join(",");
  }
  const request = (secure ? https : http).request(options);
  const response = await untilAborted(
    new Promise<http.IncomingMessage>((resolve, reject) => {
      request.once("response", resolve);
      request.once("error", reject);
      request.end(body);
    }),
    post.signal,
  ).catch((error) => {
    request.destroy();
    throw error;
  });
  const status = response.statusCode ?? 0;
  const retryAfter = response.headers["retry-after"];
  const bodyPrefix = await readPrefix(response, post.bodyLimit, post.signal);
  return {
    status,
    retryAfter: typeof retryAfter === "string" ? retryAfter : null,
    // As fetch has it: these statuses have no body.
    bodyPrefix: NULL_BODY_STATUSES.includes(status) ? null : bodyPrefix,
  };
}

/** A `lookup` that answers the checked addresses and nothing else, whatever the name. */
function pinnedLookup(addresses: string[]): LookupFunction {
  const entries = addresses.map((address) => ({
    address,
    family: parseIpAddress(address)!.length === 4 ? 4 : 6,
  }));
  return ((
    _hostname: string,
    options: { all?: boolean },
    callback: (...args: unknown[]) => void,
  ) => {
    if (options?.all) callback(null, entries);
    else callback(null, entries[0].address, entries[0].family);
  }) as LookupFunction;
}

/**
 * The first `limit` bytes of the body as text; the rest is not read, and a connection whose body
 * was not read to its end is closed rather than kept. Null when the body was cut short (a reset,
 * or the deadline): the status still counts.
 */
async function readPrefix(
  response: http.IncomingMessage,
  limit: number,
  signal: AbortSignal,
): Promise<string | null> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  const onAbort = () => response.destroy();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const chunk of response) {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= limit) break; // leaving the loop destroys the response and its connection
    }
    if (signal.aborted) return null;
    return Buffer.concat(chunks).subarray(0, limit).toString("utf8");
  } catch {
    return null;
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}
