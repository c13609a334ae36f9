/**
 * Store B verification (docs/integration.md, "POST /v1/storeb/verify"): asks the Play Developer API
 * about a purchase token and normalizes the answer.
 */
import type { StorebCredentials } from "../db/credentials.ts";
import { rateLimited, type ServiceError, UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS } from "../errors.ts";
import { AccessTokenSource, parseServiceAccount, type ServiceAccount } from "./oauth.ts";
import { StorebApiClient } from "./api_client.ts";
import {
  normalizeProductPurchase,
  normalizeSubscriptionPurchase,
  type ProductPurchase,
  type SubscriptionPurchase,
} from "./purchase.ts";
import { googleApiError, parseJsonBody, type UpstreamResponse } from "./upstream.ts";
import { objectOrEmpty } from "../json.ts";
import { parseRetryAfterMs } from "../retry_after.ts";

/** A store B verify request, as the route validated it. */
export interface StorebVerifyInput {
  packageName: string;
  productId: string;
  purchaseToken: string;
  type: "subscription" | "product";
}

/** Where the Play Developer API and its token endpoint are, and how long a call may take. */
export interface StorebVerifierOptions {
  /** `STOREB_API_URL`. */
  apiUrl: string;
  /** `STOREB_TOKEN_URL`: where access tokens come from, and the assertion's `aud`. */
  tokenUrl: string;
  /** The whole verification's deadline, retries included. */
  timeoutMs: number;
}

/** A verify outcome: a normalized purchase, or a domain failure answered with HTTP 200. */
export type StorebVerifyOutcome =
  | {
    valid: true;
    appUserId: string | null;
    purchase: SubscriptionPurchase | ProductPurchase;
    /** The upstream HTTP status, for the validation audit. */
    upstreamStatus: number;
  }
  | {
    valid: false;
    error: "PURCHASE_NOT_FOUND" | "PACKAGE_NAME_MISMATCH";
    message: string;
    /** The upstream HTTP status, or null when no upstream call was made. */
    upstreamStatus: number | null;
  };

/** Verifies store B purchases for any tenant. */
export class StorebVerifier {
  #timeoutMs: number;
  #client: StorebApiClient;
  /** Parsed service accounts, one per loaded credentials object (reused between reloads). */
  #accounts = new WeakMap<StorebCredentials, ServiceAccount>();

  constructor(options: StorebVerifierOptions) {
    this.#timeoutMs = options.timeoutMs;
    this.#client = new StorebApiClient({
      apiUrl: options.apiUrl,
      tokens: new AccessTokenSource({ tokenUrl: options.tokenUrl, timeoutMs: options.timeoutMs }),
    });
  }

  /** Verifies one purchase with the tenant's credentials. Upstream failures throw. */
  async verify(
    credentials: StorebCredentials,
    request: StorebVerifyInput,
  ): Promise<StorebVerifyOutcome> {
    // The package is checked before the store is asked: a mismatch costs no upstream call.
    if (request.packageName !== credentials.packageName) {
      return {
        valid: false,
        error: "PACKAGE_NAME_MISMATCH",
        message: `packageName "${request.packageName}" is not this tenant's package ` +
          `"${credentials.packageName}"`,
        upstreamStatus: null,
      };
    }
    const account = this.#accountOf(credentials);
    const answer = await this.#client.getPurchase(account, request, {
      timeoutMs: this.#timeoutMs,
    });
    if (answer.status === 200) {
      const body = parseJsonBody(answer.text);
      const normalized = request.type === "subscription"
        ? normalizeSubscriptionPurchase(body, request)
        : normalizeProductPurchase(body, request);
      return { valid: true, ...normalized, upstreamStatus: answer.status };
    }
    if (answer.status === 404) {
      return {
        valid: false,
        error: "PURCHASE_NOT_FOUND",
        message: `store B has no ${request.type} purchase with this token: it never existed`,
        upstreamStatus: 404,
      };
    }
    if (answer.status === 410) {
      return {
        valid: false,
        error: "PURCHASE_NOT_FOUND",
        message: `this ${request.type} purchase token is no longer valid: consumed, refunded ` +
          `or expired too long ago`,
        upstreamStatus: 410,
      };
    }
    if (answer.status === 429) throw quotaExceeded(answer);
    throw unexpectedAnswer(answer);
  }

  /** The service account of `credentials`, parsed (and its key hashed) once, not per request. */
  #accountOf(credentials: StorebCredentials): ServiceAccount {
    let account = this.#accounts.get(credentials);
    if (!account) {
      account = parseServiceAccount(credentials.serviceAccountJson);
      this.#accounts.set(credentials, account);
    }
    return account;
  }
}

/**
 * 429 `RATE_LIMITED` for the upstream quota, with the store's `Retry-After` when it sent a usable
 * one (seconds or an HTTP date) and the default wait otherwise: every 429 carries both the header
 * and `details.retryAfterSeconds`.
 */
function quotaExceeded(answer: UpstreamResponse): ServiceError {
  const message = "the store B API quota of this service account is exceeded";
  const waitMs = parseRetryAfterMs(answer.headers.get("retry-after"));
  const seconds = waitMs === null ? null : waitMs / 1000;
  return rateLimited(
    `${message}; retry after ${seconds === null ? "the default wait" : "the time given"}`,
    seconds ?? UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS,
    { upstreamStatus: 429 },
  );
}

/** 502 `GOOGLE_API_ERROR` for any other status, with Google's own error code when it sent one. */
function unexpectedAnswer(answer: UpstreamResponse): ServiceError {
  const body = parseJsonBody(answer.text);
  const status = objectOrEmpty(objectOrEmpty(body).error).status;
  const upstreamCode = typeof status === "string" ? status : null;
  return googleApiError(
    `the store B API answered HTTP ${answer.status}${upstreamCode ? ` (${upstreamCode})` : ""}`,
    { status: answer.status, upstreamCode },
  );
}
