/**
 * The App Store Server API, with the error mapping every store A endpoint shares
 * (docs/integration.md, "Errors"): one ES256 token per tenant key, the caller's deadline, 429
 * `RATE_LIMITED` from Apple's millisecond `Retry-After`, and 502 `APPLE_API_ERROR` with
 * `details.status` and `details.upstreamCode` for anything unexpected. A call that is safe to send
 * twice is retried once when Apple says to try again (5xx, errorCode 5000001) or the connection
 * broke, within the caller's deadline (docs/architecture.md, "Retrying store A calls").
 */
import {
  rateLimited,
  RelayError,
  ServiceError,
  UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS,
} from "../errors.ts";
import type { StoreaCredentials } from "./credentials.ts";
import type { StoreaTokenSigner } from "./api_token.ts";
import { objectOrNull } from "../lib/json.ts";
import { ATTR, withSpan } from "../observability/telemetry.ts";

/** The two App Store environments, lower-case as in the verify API. */
export type StoreaEnvironmentName = "production" | "sandbox";

/** One call of the App Store Server API. */
export interface StoreaRequest {
  /** For spans: `get_transaction`, `subscriptions`, `history`, `consumption`... */
  operation: string;
  method: "GET" | "POST" | "PUT";
  /**
   * The path after the environment's base URL, each segment already percent-encoded; segments
   * from a request are checked by `pathSegmentField`, so `.` and `..` never reach here.
   */
  path: string;
  /** Query parameters in order; a name may repeat (Apple's filters do). */
  query?: ReadonlyArray<readonly [string, string]>;
  /** Sent as JSON. */
  body?: unknown;
  /**
   * Whether sending it twice leaves Apple as sending it once does: only then is it retried.
   * Reads are; a PUT that replaces a record is; a POST that makes something new is not
   * (docs/architecture.md, "Retrying store A calls").
   */
  idempotent: boolean;
  /**
   * Whether Apple's 400 is the caller's to answer (the request carried the tenant's own values)
   * rather than a 502 (the service built the request wrong).
   */
  answersBadRequest?: boolean;
}

/** What Apple answered, once rate limits, retries and unexpected statuses are dealt with. */
export type StoreaAnswer =
  /** 2xx; the body parsed as a JSON object, or null when there was none. */
  | { kind: "ok"; status: number; body: Record<string, unknown> | null }
  | { kind: "not_found"; upstreamCode: number | null }
  /** 401: a bad key, or production for an app never released. */
  | { kind: "unauthorized" }
  /** 400, for a request with `answersBadRequest`. */
  | { kind: "bad_request"; upstreamCode: number | null; errorMessage: string | null };

/** Where the API lives. */
export interface StoreaApiClientOptions {
  /** `STOREA_API_URL_PRODUCTION`. */
  productionUrl: string;
  /** `STOREA_API_URL_SANDBOX`. */
  sandboxUrl: string;
  tokens: StoreaTokenSigner;
}

/**
 * An answer worth one more try: a signal inside the client, which always turns it into 502
 * `APPLE_API_ERROR` before it leaves; its code is that one's, should a log ever see it.
 */
class RetryableAnswer extends RelayError {
  constructor(
    readonly status: number | null,
    readonly upstreamCode: number | null,
    cause?: unknown,
  ) {
    super("APPLE_API_ERROR", status === null ? "network error" : `status ${status}`, { cause });
  }
}

/** Calls the App Store Server API on behalf of tenants. */
export class StoreaApiClient {
  #options: StoreaApiClientOptions;

  constructor(options: StoreaApiClientOptions) {
    this.#options = options;
  }

  /**
   * Sends `request` to `environment` with the tenant's token.
   * @throws {ServiceError} 429 `RATE_LIMITED` when Apple's rate limit was hit; 502
   * `APPLE_API_ERROR` for any other unexpected answer, for no answer in time, and for a retryable
   * failure that happened again (or once, for a request that is not idempotent).
   */
  send(
    credentials: StoreaCredentials,
    request: StoreaRequest,
    options: { environment: StoreaEnvironmentName; signal: AbortSignal },
  ): Promise<StoreaAnswer> {
    return withSpan(`purchase_relay.storea.${request.operation}`, {
      [ATTR.store]: "storea",
      "purchase_relay.environment": options.environment,
    }, async (span) => {
      const answer = await this.#send(credentials, request, options);
      span?.setAttribute(ATTR.outcome, answer.kind);
      return answer;
    });
  }

  async #send(
    credentials: StoreaCredentials,
    request: StoreaRequest,
    options: { environment: StoreaEnvironmentName; signal: AbortSignal },
  ): Promise<StoreaAnswer> {
    const base = options.environment === "production"
      ? this.#options.productionUrl
      : this.#options.sandboxUrl;
    const url = new URL(`${base.replace(/\/+$/, "")}${request.path}`);
    for (const [name, value] of request.query ?? []) url.searchParams.append(name, value);
    const token = await this.#options.tokens.tokenFor(credentials);
    try {
      return await this.#call(url, token, request, options.signal);
    } catch (error) {
      if (
        !(error instanceof RetryableAnswer) || !request.idempotent || options.signal.aborted
      ) throw upstreamError(error, request.idempotent);
      try {
        return await this.#call(url, token, request, options.signal);
      } catch (again) {
        throw upstreamError(again, true);
      }
    }
  }

  async #call(
    url: URL,
    token: string,
    request: StoreaRequest,
    signal: AbortSignal,
  ): Promise<StoreaAnswer> {
    const headers: Record<string, string> = {
      authorization: `Bearer ${token}`,
      accept: "application/json",
    };
    if (request.body !== undefined) headers["content-type"] = "application/json";
    let response: Response;
    try {
      response = await fetch(url, {
        method: request.method,
        headers,
        body: request.body === undefined ? undefined : JSON.stringify(request.body),
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

    if (response.status >= 200 && response.status < 300) {
      if (text.trim() !== "" && body === null) {
        throw unexpectedBody("with a body that is not JSON", response.status);
      }
      return { kind: "ok", status: response.status, body };
    }
    if (response.status === 404) return { kind: "not_found", upstreamCode };
    if (response.status === 401) return { kind: "unauthorized" };
    if (response.status === 429) throw appleRateLimited(response.headers.get("retry-after"));
    if (response.status >= 500 || upstreamCode === 5000001) {
      throw new RetryableAnswer(response.status, upstreamCode);
    }
    if (response.status === 400 && request.answersBadRequest) {
      const errorMessage = typeof body?.errorMessage === "string" ? body.errorMessage : null;
      return { kind: "bad_request", upstreamCode, errorMessage };
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

/** Get Notification History's filters (epoch milliseconds), as Apple's request body names them. */
export interface NotificationHistoryQuery {
  startDate: number;
  endDate: number;
  /** Only the notifications that have not reached the service (or that Apple still retries). */
  onlyFailures?: boolean;
  transactionId?: string;
  notificationType?: string;
  notificationSubtype?: string;
}

/** One attempt of the App Store to post a notification. */
export interface NotificationSendAttempt {
  /** Epoch milliseconds. */
  attemptDate: number;
  /** `SUCCESS`, or what the App Store met: `TIMED_OUT`, `TLS_ISSUE`, `NO_RESPONSE`... */
  sendAttemptResult: string;
}

/** One record of the notification history: the notification, not yet verified, and its attempts. */
export interface NotificationHistoryRecord {
  /** The JWS as Apple returned it: anything until it verifies (a non-string is invalid). */
  signedPayload: unknown;
  sendAttempts: NotificationSendAttempt[];
}

/** What Get Notification History answered for one page. */
export type NotificationHistoryPage =
  | {
    kind: "page";
    records: NotificationHistoryRecord[];
    hasMore: boolean;
    /** For the next page; null when Apple sent none. */
    paginationToken: string | null;
  }
  /** 401: a bad key, or production for an app never released. */
  | { kind: "unauthorized" }
  /** Apple's 400: a pagination token it no longer takes, dates out of its range... */
  | { kind: "refused"; upstreamCode: number | null; errorMessage: string | null };

/**
 * One page of Get Notification History (`POST /inApps/v1/notifications/history`) in
 * `environment`: the notifications the App Store sent or tried to send in the window, at most 20
 * a page. A read, so retried once like the other reads.
 * @throws {ServiceError} as {@linkcode StoreaApiClient.send}, and 502 `APPLE_API_ERROR` for a 404
 * or an answer without the history.
 */
export async function getNotificationHistory(
  client: StoreaApiClient,
  credentials: StoreaCredentials,
  query: NotificationHistoryQuery,
  options: { environment: StoreaEnvironmentName; signal: AbortSignal; paginationToken?: string },
): Promise<NotificationHistoryPage> {
  const answer = await client.send(credentials, {
    operation: "notification_history",
    method: "POST",
    path: "/inApps/v1/notifications/history",
    query: options.paginationToken === undefined
      ? []
      : [["paginationToken", options.paginationToken]],
    body: query,
    idempotent: true,
    answersBadRequest: true,
  }, options);
  switch (answer.kind) {
    case "unauthorized":
      return answer;
    case "bad_request":
      return {
        kind: "refused",
        upstreamCode: answer.upstreamCode,
        errorMessage: answer.errorMessage,
      };
    case "not_found":
      throw new ServiceError("APPLE_API_ERROR", "the App Store answered 404 to the history", {
        details: { status: 404, upstreamCode: answer.upstreamCode },
      });
  }
  const body = answer.body ?? {};
  const history = body.notificationHistory ?? [];
  if (
    !Array.isArray(history) || (body.hasMore !== undefined && typeof body.hasMore !== "boolean")
  ) {
    throw unexpectedBody("with a notification history of the wrong shape", answer.status);
  }
  const token = body.paginationToken;
  return {
    kind: "page",
    records: history.map((item) => {
      const record = objectOrNull(item) ?? {};
      const attempts = Array.isArray(record.sendAttempts) ? record.sendAttempts : [];
      return {
        signedPayload: record.signedPayload,
        sendAttempts: attempts.flatMap((attempt) => {
          const { attemptDate, sendAttemptResult } = objectOrNull(attempt) ?? {};
          return typeof attemptDate === "number" && typeof sendAttemptResult === "string"
            ? [{ attemptDate, sendAttemptResult }]
            : [];
        }),
      };
    }),
    hasMore: body.hasMore === true,
    paginationToken: typeof token === "string" && token !== "" ? token : null,
  };
}

/** 502 for a success whose body is not what the call returns. */
function unexpectedBody(what: string, status: number): ServiceError {
  return new ServiceError("APPLE_API_ERROR", `the App Store answered ${what}`, {
    details: { status, upstreamCode: null },
  });
}

/** Maps what is left after the retry to 502 `APPLE_API_ERROR` (or passes a mapped error on). */
function upstreamError(error: unknown, retried: boolean): unknown {
  if (error instanceof ServiceError) return error;
  if (error instanceof RetryableAnswer) {
    const what = error.status === null ? "could not be reached" : `answered ${error.status}`;
    return new ServiceError("APPLE_API_ERROR", `the App Store ${what}${retried ? ", twice" : ""}`, {
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
