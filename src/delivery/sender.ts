/**
 * One delivery attempt: re-check the callback target, sign the body afresh, POST it, and report
 * what happened. Never throws: every outcome, network errors included, is an `AttemptResult` the
 * caller records (decisions.md 9).
 */
import { isIP } from "node:net";
import { callbackUrlProblem, isPublicAddress } from "./callback_url.ts";
import { signatureHeader } from "./signature.ts";
import { readStreamPrefix } from "../http/body.ts";
import type { AttemptResult } from "./queue.ts";
import { timeoutSignal, untilAborted } from "../abort.ts";

/** How much of a callback's answer is kept. */
export const RESPONSE_BODY_LIMIT = 4096;

/** What an attempt sends, and where. */
export interface DeliveryRequest {
  callbackUrl: string;
  /** The exact JSON body. */
  payload: string;
  event: string;
  eventId: string;
  /** Signing secrets, current first. */
  secrets: string[];
}

/** How attempts are made. */
export interface SenderOptions {
  version: string;
  timeoutMs: number;
  /** `CALLBACK_ALLOW_INSECURE`: allow http and private, loopback or link-local targets. */
  allowInsecure: boolean;
  /**
   * Resolves a host name to addresses; `Deno.resolveDns` by default (tests may replace it). It
   * shares the attempt's `timeoutMs`: a resolver that never answers ends the attempt, not the
   * dispatcher's slot.
   */
  resolve?: (host: string, signal: AbortSignal) => Promise<string[]>;
}

/** Makes one signed delivery attempt. */
export async function sendDelivery(
  request: DeliveryRequest,
  options: SenderOptions,
): Promise<AttemptResult> {
  const attemptedAt = new Date();
  const started = performance.now();
  const result = (fields: Partial<AttemptResult>): AttemptResult => ({
    attemptedAt,
    durationMs: performance.now() - started,
    responseCode: null,
    responseBody: null,
    error: null,
    retryAfterMs: null,
    ...fields,
  });

  // One deadline for the whole attempt, name resolution included.
  const deadline = timeoutSignal(options.timeoutMs);
  const signal = deadline.signal;
  try {
    // decisions.md 9: the target is checked again at send time, its resolved addresses included.
    const problem = await targetProblem(request.callbackUrl, options, signal);
    if (problem !== null) return result({ error: `callback URL refused: ${problem}` });
    if (request.secrets.length === 0) return result({ error: "the tenant has no webhook secret" });

    const timestamp = Math.floor(attemptedAt.getTime() / 1000);
    const response = await fetch(request.callbackUrl, {
      method: "POST",
      body: request.payload,
      redirect: "manual", // a 3xx is a failed attempt, never followed
      signal,
      headers: {
        "content-type": "application/json",
        "user-agent": `purchase-relay/${options.version}`,
        "x-service-event": request.event,
        "x-service-event-id": request.eventId,
        "x-service-timestamp": String(timestamp),
        "x-service-signature": signatureHeader(request.secrets, timestamp, request.payload),
        "x-service-version": options.version,
      },
    });
    const responseBody = await readPrefix(response, RESPONSE_BODY_LIMIT);
    return result({
      responseCode: response.status,
      responseBody,
      retryAfterMs: response.status === 429 || response.status === 503
        ? retryAfterMs(response.headers.get("retry-after"), attemptedAt.getTime())
        : null,
    });
  } catch (error) {
    const timedOut = signal.aborted;
    return result({
      error: timedOut ? `no answer within ${options.timeoutMs} ms` : describe(error),
    });
  } finally {
    deadline.clear();
  }
}

/** Why the callback may not be called now, or null. */
async function targetProblem(
  url: string,
  options: SenderOptions,
  signal: AbortSignal,
): Promise<string | null> {
  const problem = callbackUrlProblem(url, options.allowInsecure);
  if (problem !== null || options.allowInsecure) return problem;
  const host = new URL(url).hostname.replace(/^\[|\]$/g, "");
  if (isIP(host) !== 0) return null; // a literal address was checked above
  let addresses: string[];
  try {
    // The deadline holds even for a resolver that ignores the signal.
    addresses = await untilAborted((options.resolve ?? resolveHost)(host, signal), signal);
  } catch (error) {
    if (signal.aborted) {
      return `${host} did not resolve within ${options.timeoutMs} ms`;
    }
    return `${host} does not resolve (${describe(error)})`;
  }
  if (addresses.length === 0) return `${host} does not resolve`;
  const blocked = addresses.find((address) => !isPublicAddress(address));
  return blocked === undefined
    ? null
    : `${host} resolves to ${blocked}, a private, loopback, link-local or metadata address`;
}

async function resolveHost(host: string, signal: AbortSignal): Promise<string[]> {
  const lookups = await Promise.allSettled([
    Deno.resolveDns(host, "A", { signal }),
    Deno.resolveDns(host, "AAAA", { signal }),
  ]);
  const addresses = lookups.flatMap((lookup) => lookup.status === "fulfilled" ? lookup.value : []);
  if (addresses.length === 0 && lookups[0].status === "rejected") throw lookups[0].reason;
  return addresses;
}

/** The first `limit` bytes of the body as text; the rest is not read. */
async function readPrefix(response: Response, limit: number): Promise<string | null> {
  try {
    const { bytes } = await readStreamPrefix(response.body, limit);
    return response.body === null ? null : new TextDecoder().decode(bytes);
  } catch {
    return null; // cut short (reset, or the attempt's timeout): the status still counts
  }
}

/** `Retry-After` as seconds or an HTTP date (RFC 9110 10.2.3), in ms from `now`. */
export function retryAfterMs(value: string | null, now: number): number | null {
  if (value === null) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  return Number.isNaN(date) ? null : Math.max(0, date - now);
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  // Deno wraps the cause of a failed fetch; its message is the useful part.
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.name}: ${error.message}${cause}`.slice(0, 500);
}
