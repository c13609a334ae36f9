/**
 * Store B verification (docs/verify.md, "POST /v1/storeb/verify"): asks the Play Developer API
 * about a purchase token and normalizes the answer; and the store actions beside it
 * (docs/store_gateway.md, "Store B: acknowledging purchases"), which share its client, its token
 * cache and its parsed service accounts.
 */
import type { StorebCredentials } from "./credentials.ts";
import { AccessTokenSource, parseServiceAccount, type ServiceAccount } from "./oauth.ts";
import { StorebApiClient, type VoidedPurchasesQuery } from "./api_client.ts";
import type { UpstreamResponse } from "./upstream.ts";
import type { ProductPurchase, SubscriptionPurchase } from "./purchase.ts";
import { lookUpPurchase } from "./lookup.ts";
import {
  acknowledgePurchase,
  acknowledgeVerified,
  ActionBudget,
  type ActionContext,
  consumePurchase,
  purchaseStateOf,
  type StorebAcknowledgeOutcome,
  type StorebActionFailure,
  type StorebConsumeOutcome,
  type VerifyAcknowledgement,
} from "./actions.ts";

export type { StorebAcknowledgeOutcome, StorebConsumeOutcome, VerifyAcknowledgement };

/** A store B verify request, as the route validated it. */
export interface StorebVerifyInput {
  packageName: string;
  productId: string;
  purchaseToken: string;
  type: "subscription" | "product";
  /** Acknowledge a paid, unacknowledged purchase before answering (default false). */
  acknowledge?: boolean;
}

/** A store B acknowledge request, as the route validated it. */
export interface StorebAcknowledgeInput {
  packageName: string;
  productId: string;
  purchaseToken: string;
  type: "subscription" | "product";
}

/** A store B consume request (one-time products only), as the route validated it. */
export interface StorebConsumeInput {
  packageName: string;
  productId: string;
  purchaseToken: string;
}

/** Where the Play Developer API and its token endpoint are, and how long a call may take. */
export interface StorebVerifierOptions {
  /** `STOREB_API_URL`. */
  apiUrl: string;
  /** `STOREB_TOKEN_URL`: where access tokens come from, and the assertion's `aud`. */
  tokenUrl: string;
  /**
   * The whole verification's deadline, retries included; each step of an action gets as long,
   * and the whole action three times as long.
   */
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
    /** Only when the request asked for `acknowledge: true`. */
    acknowledgement?: VerifyAcknowledgement;
  }
  | {
    valid: false;
    error: "PURCHASE_NOT_FOUND" | "PACKAGE_NAME_MISMATCH";
    message: string;
    /** The upstream HTTP status, or null when no upstream call was made. */
    upstreamStatus: number | null;
  };

/** Verifies store B purchases, and acknowledges and consumes them, for any tenant. */
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

  /**
   * Verifies one purchase with the tenant's credentials, and with `acknowledge: true` acknowledges
   * it when it is paid and not yet acknowledged. Upstream failures of the lookup throw; those of
   * the acknowledgement are reported in `acknowledgement`.
   */
  async verify(
    credentials: StorebCredentials,
    request: StorebVerifyInput,
    options: { timeoutMs?: number } = {},
  ): Promise<StorebVerifyOutcome> {
    // The package is checked before the store is asked: a mismatch costs no upstream call.
    const mismatch = packageMismatch(credentials, request.packageName);
    if (mismatch) return { ...mismatch, error: "PACKAGE_NAME_MISMATCH", upstreamStatus: null };
    const context = this.#contextOf(credentials);
    const budget = new ActionBudget(options.timeoutMs ?? this.#timeoutMs);
    const ref = {
      packageName: request.packageName,
      productId: request.productId,
      purchaseToken: request.purchaseToken,
      type: request.type,
    };
    const read = await lookUpPurchase(context.client, context.account, ref, budget.next());
    if (!read.found) {
      return {
        valid: false,
        error: read.error,
        message: read.message,
        upstreamStatus: read.upstreamStatus,
      };
    }
    const { appUserId, purchase } = read.normalized;
    if (request.acknowledge !== true) {
      return { valid: true, appUserId, purchase, upstreamStatus: read.upstreamStatus };
    }
    const acknowledgement = await acknowledgeVerified(context, ref, purchase, budget);
    // Acknowledged during this call: the answer says what the store now holds. rawResponse stays
    // the store's answer as read, before the acknowledgement.
    const answered = acknowledgement.acknowledged && !purchaseStateOf(purchase).acknowledged
      ? { ...purchase, acknowledgementState: 1 as const }
      : purchase;
    return {
      valid: true,
      appUserId,
      purchase: answered,
      upstreamStatus: read.upstreamStatus,
      acknowledgement,
    };
  }

  /**
   * Acknowledges a purchase unless it already is
   * (docs/store_gateway.md, "Store B: acknowledging purchases").
   */
  acknowledge(
    credentials: StorebCredentials,
    request: StorebAcknowledgeInput,
  ): Promise<StorebAcknowledgeOutcome> {
    const mismatch = packageMismatch(credentials, request.packageName);
    if (mismatch) return Promise.resolve(mismatch);
    return acknowledgePurchase(
      this.#contextOf(credentials),
      request,
      new ActionBudget(this.#timeoutMs),
    );
  }

  /**
   * Consumes a one-time product purchase unless it already is
   * (docs/store_gateway.md, "Store B: acknowledging purchases").
   */
  consume(
    credentials: StorebCredentials,
    request: StorebConsumeInput,
  ): Promise<StorebConsumeOutcome> {
    const mismatch = packageMismatch(credentials, request.packageName);
    if (mismatch) return Promise.resolve(mismatch);
    return consumePurchase(
      this.#contextOf(credentials),
      request,
      new ActionBudget(this.#timeoutMs),
    );
  }

  /**
   * One page of the purchases Google voided for the tenant's package, read with verify's client
   * and token cache, whatever its status: the recovery of missed notifications reads it.
   */
  voidedPurchases(
    credentials: StorebCredentials,
    query: Omit<VoidedPurchasesQuery, "packageName">,
    options: { timeoutMs?: number; signal?: AbortSignal } = {},
  ): Promise<UpstreamResponse> {
    return this.#client.listVoidedPurchases(
      this.#accountOf(credentials),
      { ...query, packageName: credentials.packageName },
      { timeoutMs: options.timeoutMs ?? this.#timeoutMs, signal: options.signal },
    );
  }

  #contextOf(credentials: StorebCredentials): ActionContext {
    return { client: this.#client, account: this.#accountOf(credentials) };
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

/** `PACKAGE_NAME_MISMATCH` when `packageName` is not the tenant's, else null. */
function packageMismatch(
  credentials: StorebCredentials,
  packageName: string,
): StorebActionFailure & { error: "PACKAGE_NAME_MISMATCH" } | null {
  if (packageName === credentials.packageName) return null;
  return {
    valid: false,
    error: "PACKAGE_NAME_MISMATCH",
    message: `packageName "${packageName}" is not this tenant's package ` +
      `"${credentials.packageName}"`,
  };
}
