/**
 * The App Store Server API's Get Transaction Info call, with the error mapping the verify endpoint
 * needs. One call is retried once when Apple says to try again (5xx, errorCode 5000001) or the
 * connection broke, within the caller's deadline.
 */
import {
  rateLimited,
  RelayError,
  ServiceError,
  UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS,
} from "../errors.ts";
import type { StoreaCredentials } from "../db/credentials.ts";
import type { StoreaTokenSigner } from "./api_token.ts";
import { objectOrNull } from "../json.ts";
import { ATTR, withSpan } from "../telemetry.ts";

/** The two App Store environments, lower-case as in the verify API. */
export type StoreaEnvironmentName = "production" | "sandbox";

/** What one environment said about a transaction id. */
export type TransactionLookup =
  | { kind: "found"; signedTransactionInfo: string }
  | { kind: "not_found"; upstreamCode: number | null }
  /** Production answers 401 for apps that were never released: automatic mode then asks sandbox. */
  | { kind: "unauthorized" };

/** Where the API lives. */
export interface StoreaApiClientOptions {
  /** `STOREA_API_URL_PRODUCTION`. */
  productionUrl: string;
  /** `STOREA_API_URL_SANDBOX`. */
  sandboxUrl: string;
  tokens: StoreaTokenSigner;
}

/** An answer worth one more try. */
class RetryableAnswer extends RelayError {
  constructor(
    readonly status: number | null,
    readonly upstreamCode: number | null,
    cause?: unknown,
  ) {
    super("UPSTREAM_RETRYABLE", status === null ? "network error" : `status ${status}`, { cause });
  }
}

/** Calls the App Store Server API on behalf of tenants. */
export class StoreaApiClient {
  #options: StoreaApiClientOptions;

  constructor(options: StoreaApiClientOptions) {
    this.#options = options;
  }

  /**
   * Looks `transactionId` up in `environment`. Throws the verify endpoint's errors: 429
   * `RATE_LIMITED`, 502 `APPLE_API_ERROR`.
   */
  getTransactionInfo(
    credentials: StoreaCredentials,
    transactionId: string,
    options: { environment: StoreaEnvironmentName; signal: AbortSignal },
  ): Promise<TransactionLookup> {
    return withSpan("purchase_relay.storea.get_transaction", {
      [ATTR.store]: "storea",
      "purchase_relay.environment": options.environment,
    }, async (span) => {
      const lookup = await this.#lookUp(credentials, transactionId, options);
      span?.setAttribute(ATTR.outcome, lookup.kind);
      return lookup;
    });
  }

  async #lookUp(
    credentials: StoreaCredentials,
    transactionId: string,
    options: { environment: StoreaEnvironmentName; signal: AbortSignal },
  ): Promise<TransactionLookup> {
    const base = options.environment === "production"
      ? this.#options.productionUrl
      : this.#options.sandboxUrl;
    const url = `${base.replace(/\/+$/, "")}/inApps/v1/transactions/${
      // A path segment: the verify route refuses "." and ".." (pathSegmentField).
      encodeURIComponent(transactionId)}`;
    const token = await this.#options.tokens.tokenFor(credentials);
    try {
      return await this.#call(url, token, options.signal);
    } catch (error) {
      if (!(error instanceof RetryableAnswer) || options.signal.aborted) throw upstreamError(error);
      try {
        return await this.#call(url, token, options.signal);
      } catch (again) {
        throw upstreamError(again);
      }
    }
  }

  async #call(url: string, token: string, signal: AbortSignal): Promise<TransactionLookup> {
    let response: Response;
    try {
      response = await fetch(url, {
        headers: { authorization: `Bearer ${token}`, accept: "application/json" },
        redirect: "manual",
        signal,
      });
    } catch (error) {
      if (signal.aborted) throw error;
      throw new RetryableAnswer(null, null, error);
    }
    const text = await response.text().catch((error) => {
      if (signal.aborted) throw error;
      throw new RetryableAnswer(null, null, error);
    });
    const body = parseObject(text);
    const upstreamCode = typeof body?.errorCode === "number" ? body.errorCode : null;

    if (response.status === 200) {
      if (typeof body?.signedTransactionInfo !== "string") {
        throw new ServiceError("APPLE_API_ERROR", "the App Store answered without a transaction", {
          details: { status: 200, upstreamCode: null },
        });
      }
      return { kind: "found", signedTransactionInfo: body.signedTransactionInfo };
    }
    if (response.status === 404) return { kind: "not_found", upstreamCode };
    if (response.status === 401) return { kind: "unauthorized" };
    if (response.status === 429) throw appleRateLimited(response.headers.get("retry-after"));
    if (response.status >= 500 || upstreamCode === 5000001) {
      throw new RetryableAnswer(response.status, upstreamCode);
    }
    throw new ServiceError(
      "APPLE_API_ERROR",
      `the App Store answered ${response.status}${
        upstreamCode ? ` (errorCode ${upstreamCode})` : ""
      }`,
      { details: { status: response.status, upstreamCode } },
    );
  }
}

/** Maps what is left after the retry to 502 `APPLE_API_ERROR` (or passes a mapped error on). */
function upstreamError(error: unknown): unknown {
  if (error instanceof ServiceError) return error;
  if (error instanceof RetryableAnswer) {
    const what = error.status === null ? "could not be reached" : `answered ${error.status}`;
    return new ServiceError("APPLE_API_ERROR", `the App Store ${what}, twice`, {
      details: { status: error.status, upstreamCode: error.upstreamCode },
      cause: error.cause,
    });
  }
  // The deadline passed (timeoutSignal) or the caller gave up.
  return new ServiceError("APPLE_API_ERROR", "the App Store did not answer in time", {
    details: { status: null, upstreamCode: null },
    cause: error,
  });
}

/**
 * 429 `RATE_LIMITED`. Apple's `Retry-After` is a UNIX time in milliseconds, not the seconds
 * of RFC 7231, so it is turned into seconds from now (at least 1). Without one, or with anything
 * but digits (garbage, a negative number), the client is told the default wait.
 */
function appleRateLimited(retryAfter: string | null): ServiceError {
  const message = "the App Store rate limit for this app was exceeded";
  const text = retryAfter?.trim() ?? "";
  const seconds = /^\d{1,16}$/.test(text)
    ? (Number(text) - Date.now()) / 1000
    : UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS;
  return rateLimited(message, seconds, { upstreamStatus: 429 });
}

function parseObject(text: string): Record<string, unknown> | null {
  try {
    const value = JSON.parse(text);
    return objectOrNull(value);
  } catch {
    return null;
  }
}
