/**
 * Errors that reach a client. Each carries a stable code (docs/integration.md, "Error codes";
 * docs/troubleshooting.md, "By error code") and is turned into the error envelope
 * (docs/integration.md, "Errors") in exactly one place, the HTTP server.
 */

/**
 * The base of every error the service raises on purpose. Its `code` is stable: logs, the CLI's
 * error output and the startup failure line print it, and a caller may branch on it. The name
 * is the subclass's, so logs say which kind it was.
 */
export class RelayError extends Error {
  readonly code: string;

  constructor(code: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/**
 * The code of `error` for a log line or the CLI: a {@linkcode RelayError}'s own, or the
 * upper-case code a runtime or driver error carries (`ECONNREFUSED`), else `fallback`.
 */
export function errorCode(error: unknown, fallback: string): string {
  if (error instanceof RelayError) return error.code;
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[A-Z][A-Z0-9_]*$/.test(code) ? code : fallback;
}

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
export class ServiceError extends RelayError {
  declare readonly code: ErrorCode;
  readonly status: number;
  readonly details?: Record<string, unknown>;
  readonly headers?: Record<string, string>;
  readonly upstreamStatus?: number | null;

  constructor(code: ErrorCode, message: string, options: ServiceErrorOptions = {}) {
    super(code, message, { cause: options.cause });
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
  options: { upstreamStatus?: number; cause?: unknown } = {},
): ServiceError {
  const seconds = Math.max(1, Math.ceil(retryAfterSeconds));
  return new ServiceError("RATE_LIMITED", message, {
    details: { retryAfterSeconds: seconds },
    headers: { "Retry-After": String(seconds) },
    upstreamStatus: options.upstreamStatus,
    cause: options.cause,
  });
}
