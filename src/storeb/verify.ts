/**
 * Store B verification (docs/integration.md, "POST /v1/storeb/verify"): asks the Play Developer API
 * about a purchase token and normalizes the answer.
 */
import type { StorebCredentials } from "../db/credentials.ts";
import { AccessTokenSource, parseServiceAccount, type ServiceAccount } from "./oauth.ts";
import { StorebApiClient } from "./api_client.ts";
import type { ProductPurchase, SubscriptionPurchase } from "./purchase.ts";
import { lookUpPurchase } from "./lookup.ts";

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
    const read = await lookUpPurchase(this.#client, account, request, this.#timeoutMs);
    if (!read.found) {
      return {
        valid: false,
        error: read.error,
        message: read.message,
        upstreamStatus: read.upstreamStatus,
      };
    }
    return { valid: true, ...read.normalized, upstreamStatus: read.upstreamStatus };
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
