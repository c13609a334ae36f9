/**
 * One delivery attempt: check the callback target, sign the body afresh, POST it to an address
 * that passed the check, and report what happened. Never throws: every outcome, network errors
 * included, is an `AttemptResult` the caller records (docs/security.md, "Callback safety").
 */
import type { CallbackPolicy } from "./callback_policy.ts";
import { withoutUrlSecrets } from "./callback_url.ts";
import { checkCallback, type CheckedAddresses, type ResolveHost } from "./callback_target.ts";
import { type CallbackConnections, postToCallback } from "./callback_client.ts";
import { signatureHeader } from "./signature.ts";
import type { AttemptResult } from "./queue.ts";
import { timeoutSignal } from "../lib/abort.ts";
import { parseRetryAfterMs } from "../lib/retry_after.ts";
import { withClientSpan } from "../observability/telemetry.ts";

const encoder = new TextEncoder();

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
  /** `CALLBACK_ALLOW_HTTP` and `CALLBACK_ALLOW_PRIVATE_NETWORKS`. */
  policy: CallbackPolicy;
  /**
   * Resolves a host name whose addresses are checked; `Deno.resolveDns` by default. Tests may
   * replace it, and a given one is used whatever the policy. It shares the attempt's `timeoutMs`:
   * a resolver that never answers ends the attempt, not the dispatcher's slot.
   */
  resolve?: ResolveHost;
  /** Connections kept between attempts; without it, each attempt opens and closes its own. */
  connections?: CallbackConnections;
  /** Checked addresses kept between attempts; without it, each attempt resolves the name. */
  checkedAddresses?: CheckedAddresses;
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

  // One deadline for the whole attempt: resolving, connecting, sending and reading the answer.
  const deadline = timeoutSignal(options.timeoutMs);
  const signal = deadline.signal;
  try {
    const target = await checkCallback(request.callbackUrl, options, signal);
    if ("problem" in target) return result({ error: `callback URL refused: ${target.problem}` });
    if (request.secrets.length === 0) return result({ error: "the tenant has no webhook secret" });

    const timestamp = Math.floor(attemptedAt.getTime() / 1000);
    // Encoded once: the signature and the request are made of the same bytes.
    const body = encoder.encode(request.payload);
    const headers = {
      "content-type": "application/json",
      "user-agent": `purchase-relay/${options.version}`,
      "x-service-event": request.event,
      "x-service-event-id": request.eventId,
      "x-service-timestamp": String(timestamp),
      "x-service-signature": signatureHeader(request.secrets, timestamp, body),
      "x-service-version": options.version,
    };
    const answer = await withClientSpan(
      "POST",
      target.url,
      (traceHeaders) =>
        postToCallback(target, {
          body,
          bodyLimit: RESPONSE_BODY_LIMIT,
          signal,
          headers: { ...headers, ...traceHeaders },
        }, options.connections),
    ).catch((error) => {
      // No answer from the checked addresses: the next attempt resolves the name again, in case
      // it has moved.
      options.checkedAddresses?.forget(target.host);
      throw error;
    });
    return result({
      responseCode: answer.status,
      responseBody: answer.bodyPrefix,
      retryAfterMs: answer.status === 429 || answer.status === 503
        ? parseRetryAfterMs(answer.retryAfter, attemptedAt.getTime())
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

/** An error as stored and logged: never with a URL's query string or credentials. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return withoutUrlSecrets(String(error)).slice(0, 500);
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return withoutUrlSecrets(`${error.name}: ${error.message}${cause}`).slice(0, 500);
}
