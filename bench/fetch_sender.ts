/**
 * The baseline of bench/callback_sender.ts: the delivery attempt as it was made before callbacks
 * were pinned to their checked address, with `fetch` (which resolves the name again and pools
 * connections). With `lookUp`, it first resolves a host name as the send-time check did in
 * production (A and AAAA with `Deno.resolveDns`, the same lookup the sender makes now); without,
 * as it ran where private networks were allowed. Same headers, signature, deadline, redirect
 * handling and 4 KB body record as src/delivery/sender.ts.
 * @module
 */
import { signatureHeader } from "../src/delivery/signature.ts";
import { readStreamPrefix } from "../src/lib/streams.ts";
import { timeoutSignal } from "../src/lib/abort.ts";
import { RESPONSE_BODY_LIMIT } from "../src/delivery/sender.ts";
import { parseRetryAfterMs } from "../src/lib/retry_after.ts";
import type { DeliveryRequest } from "../src/delivery/sender.ts";
import type { AttemptResult } from "../src/delivery/queue.ts";
import { resolveHost } from "../src/delivery/callback_target.ts";
import { parseIpAddress } from "../src/delivery/special_addresses.ts";

/** One attempt with `fetch`. */
export async function sendWithFetch(
  request: DeliveryRequest,
  options: { version: string; timeoutMs: number; lookUp: boolean },
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
  const deadline = timeoutSignal(options.timeoutMs);
  const signal = deadline.signal;
  try {
    const url = new URL(request.callbackUrl); // what the old check parsed
    if (url.protocol !== "https:" && url.protocol !== "http:") return result({ error: "refused" });
    const host = url.hostname.replace(/^\[|\]$/g, "");
    if (options.lookUp && parseIpAddress(host) === null) {
      if ((await resolveHost(host, signal)).length === 0) return result({ error: "no address" });
    }
    const timestamp = Math.floor(attemptedAt.getTime() / 1000);
    const response = await fetch(request.callbackUrl, {
      method: "POST",
      body: request.payload,
      redirect: "manual",
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
    let responseBody: string | null = null;
    try {
      const { bytes } = await readStreamPrefix(response.body, RESPONSE_BODY_LIMIT);
      responseBody = response.body === null ? null : new TextDecoder().decode(bytes);
    } catch {
      responseBody = null;
    }
    return result({
      responseCode: response.status,
      responseBody,
      retryAfterMs: response.status === 429 || response.status === 503
        ? parseRetryAfterMs(response.headers.get("retry-after"), attemptedAt.getTime())
        : null,
    });
  } catch (error) {
    return result({ error: signal.aborted ? "timeout" : String(error) });
  } finally {
    deadline.clear();
  }
}
