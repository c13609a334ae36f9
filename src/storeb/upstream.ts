/**
 * HTTP to Google's endpoints (token and Play Developer API), shared by the token source and the
 * API client: one request under a deadline, failures described without their URL, and the
 * `GOOGLE_API_ERROR` envelope (docs/integration.md, "Error codes").
 */
import { RelayError, ServiceError } from "../errors.ts";

/** A whole upstream answer: status, headers and body text. */
export interface UpstreamResponse {
  status: number;
  headers: Headers;
  text: string;
}

/**
 * No whole answer arrived: the connection failed, was reset mid-answer, or the deadline passed.
 * Its message never holds the URL, which carries the purchase token: purchase tokens are never
 * logged.
 */
export class UpstreamUnreachable extends RelayError {
  /** Whether the deadline passed (rather than the network failing). */
  readonly timedOut: boolean;

  constructor(timedOut: boolean, description: string) {
    super("UPSTREAM_UNREACHABLE", description);
    this.timedOut = timedOut;
  }
}

/**
 * Sends one request and reads the whole body under `deadline`. Redirects are not followed: Google
 * never redirects these calls, so a 3xx is returned as an unexpected status.
 */
export async function requestUpstream(
  url: string,
  init: RequestInit,
  deadline: AbortSignal,
): Promise<UpstreamResponse> {
  try {
    const response = await fetch(url, { ...init, redirect: "manual", signal: deadline });
    // The body is read under the same deadline; a reset mid-body is a network failure too.
    const text = await response.text();
    return { status: response.status, headers: response.headers, text };
  } catch (error) {
    if (deadline.aborted) throw new UpstreamUnreachable(true, "the deadline passed");
    throw new UpstreamUnreachable(false, withoutUrls(error));
  }
}

/** The body as JSON, or `undefined` when it is not JSON. */
export function parseJsonBody(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Fields of a `GOOGLE_API_ERROR`. */
export interface GoogleApiErrorFields {
  /** The upstream HTTP status; null when no answer arrived. */
  status: number | null;
  /** Google's own error code (`error.status` of the API, `error` of the token endpoint). */
  upstreamCode: string | null;
  /** Kept for logs only; must not hold tokens or key material. */
  cause?: unknown;
}

/** 502 `GOOGLE_API_ERROR` with `details.status` and `details.upstreamCode`. */
export function googleApiError(message: string, fields: GoogleApiErrorFields): ServiceError {
  return new ServiceError("GOOGLE_API_ERROR", message, {
    details: { status: fields.status, upstreamCode: fields.upstreamCode },
    cause: fields.cause,
  });
}

/** Waits `ms`, or rejects as soon as `signal` aborts. */
export function pause(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    function onAbort() {
      clearTimeout(timer);
      reject(signal.reason);
    }
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * An error's message and its causes' (fetch puts the reason, e.g. "Connection refused", in its
 * cause), with every URL cut out: fetch errors quote the URL they failed on.
 */
function withoutUrls(error: unknown): string {
  const parts: string[] = [];
  for (let e = error, depth = 0; e !== undefined && e !== null && depth < 4; depth++) {
    parts.push(e instanceof Error ? `${e.name}: ${e.message}` : String(e));
    e = e instanceof Error ? e.cause : undefined;
  }
  return parts.join("; ").replace(/[a-z][a-z0-9+.-]*:\/\/\S+/gi, "<url>");
}
