/**
 * Errors that reach a client. Each carries a stable code (docs/integration.md, "Error codes";
 * docs/operations.md, "By error code") and is turned into the error envelope
 * (docs/integration.md, "Errors") in exactly one place, the HTTP server.
 */

/** Every error code the service answers with, and its HTTP status. */
export const ERROR_STATUS = {
  INVALID_REQUEST: 400,
  CREDENTIALS_MISSING: 400,
  UNAUTHENTICATED: 401,
  SIGNATURE_INVALID: 401,
  TENANT_NOT_FOUND: 404,
  NOT_FOUND: 404,
  METHOD_NOT_ALLOWED: 405,
  RATE_LIMITED: 429,
  INTERNAL_ERROR: 500,
  APPLE_API_ERROR: 502,
  GOOGLE_API_ERROR: 502,
} as const;

/** A code from {@linkcode ERROR_STATUS}. */
export type ErrorCode = keyof typeof ERROR_STATUS;

/** Options of a {@linkcode ServiceError}. */
export interface ServiceErrorOptions {
  /** Error-specific details, sent as `details` in the envelope. */
  details?: Record<string, unknown>;
  /** Extra response headers, such as `Retry-After`. */
  headers?: Record<string, string>;
  /** The underlying error, kept for logs only. */
  cause?: unknown;
  /** The store's HTTP status behind this error, for the validation audit; never sent. */
  upstreamStatus?: number | null;
}

/** An error the client is meant to see, with its code and status. */
export class ServiceError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details?: Record<string, unknown>;
  readonly headers?: Record<string, string>;
  readonly upstreamStatus?: number | null;

  constructor(code: ErrorCode, message: string, options: ServiceErrorOptions = {}) {
    super(message, { cause: options.cause });
    this.name = "ServiceError";
    this.code = code;
    this.status = ERROR_STATUS[code];
    this.details = options.details;
    this.headers = options.headers;
    this.upstreamStatus = options.upstreamStatus;
  }
}

/** 400 `INVALID_REQUEST` with a message saying what is wrong. */
export function invalidRequest(message: string, details?: Record<string, unknown>): ServiceError {
  return new ServiceError("INVALID_REQUEST", message, { details });
}

/**
 * The wait given to the client when a store answers 429 without a usable hint: every 429 carries
 * `Retry-After` and `details.retryAfterSeconds` (docs/integration.md), and a minute matches the
 * stores' per-minute quotas without sending clients back while the limit is surely still hit.
 */
export const UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS = 60;

/**
 * 429 `RATE_LIMITED` with both `Retry-After` and `details.retryAfterSeconds` (docs/integration.md,
 * "Rate limiting"); `upstreamStatus` when the limit was the store's.
 */
export function rateLimited(
  message: string,
  retryAfterSeconds: number,
  options: { upstreamStatus?: number } = {},
): ServiceError {
  const seconds = Math.max(1, Math.ceil(retryAfterSeconds));
  return new ServiceError("RATE_LIMITED", message, {
    details: { retryAfterSeconds: seconds },
    headers: { "Retry-After": String(seconds) },
    upstreamStatus: options.upstreamStatus,
  });
}
