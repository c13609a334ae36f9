/**
 * The Play Developer API calls of store B: the lookups of verification (purchases.subscriptionsv2
 * and purchases.products) and the recovery's list of voided purchases
 * (purchases.voidedpurchases), with the retries that are safe for a read: one after a 5xx or a network
 * failure, and one with a fresh token after a 401, all under one deadline; and the writes of the
 * store actions (acknowledge, consume), which are retried here only after a 401, when Google
 * certainly did nothing. Whether a write whose answer was lost took effect is the caller's
 * question (docs/architecture.md, "Retrying store B calls").
 */
import { timeoutSignal } from "../lib/abort.ts";
import type { AccessTokenSource, ServiceAccount } from "./oauth.ts";
import {
  googleApiError,
  pause,
  requestUpstream,
  type UpstreamResponse,
  UpstreamUnreachable,
} from "./upstream.ts";
import { ATTR, withSpan } from "../observability/telemetry.ts";

/** The default deadline of one lookup, retries and token requests included. */
export const DEFAULT_TIMEOUT_MS = 10_000;
/** A short breath before retrying a 5xx or a dropped connection. */
const RETRY_PAUSE_MS = 100;

/** Which purchase to look up. */
export type PurchaseQuery =
  | { type: "subscription"; packageName: string; purchaseToken: string }
  | { type: "product"; packageName: string; productId: string; purchaseToken: string };

/**
 * One page of voided purchases to list: voided (as Google's systems saw them) from `startTime` to
 * `endTime`, epoch milliseconds; `token` for a page after the first. Subscriptions are included
 * (`type=1`), and so are quantity-based partial refunds.
 */
export interface VoidedPurchasesQuery {
  packageName: string;
  startTime: number;
  endTime: number;
  /** Voided purchases per page; Google takes at most 1000. */
  maxResults: number;
  token?: string;
}

/**
 * A change to make at the store: acknowledge a subscription (`productId` is its subscription id)
 * or a one-time product, or consume a one-time product.
 */
export interface PurchaseWrite {
  action: "acknowledge" | "consume";
  type: "subscription" | "product";
  packageName: string;
  productId: string;
  purchaseToken: string;
}

/**
 * What came of one write: an answer (whatever its status), or none, in which case the write may
 * or may not have taken effect.
 */
export type WriteAttempt =
  | { answered: true; response: UpstreamResponse }
  | { answered: false; timedOut: boolean; error: UpstreamUnreachable };

/** Options of {@linkcode StorebApiClient}. */
export interface StorebApiClientOptions {
  /** `STOREB_API_URL`, without a trailing path. */
  apiUrl: string;
  /** Where access tokens come from. */
  tokens: AccessTokenSource;
}

/** Options of {@linkcode StorebApiClient.getPurchase}. */
export interface GetPurchaseOptions {
  /** The deadline of the whole lookup, retries included (default 10 s). */
  timeoutMs?: number;
}

/** Options of {@linkcode StorebApiClient.writePurchase}. */
export interface WritePurchaseOptions {
  /** The deadline of the write, its token requests and its retry after a 401 (default 10 s). */
  timeoutMs?: number;
}

/** The Play Developer API, as far as verification needs it. */
export class StorebApiClient {
  #apiUrl: string;
  #tokens: AccessTokenSource;

  constructor(options: StorebApiClientOptions) {
    this.#apiUrl = options.apiUrl.replace(/\/+$/, "");
    this.#tokens = options.tokens;
  }

  /**
   * Looks a purchase up and returns the final answer, whatever its status; the caller decides
   * what a status means. Throws 502 `GOOGLE_API_ERROR` when no answer arrived in time, and the
   * token source's errors.
   */
  getPurchase(
    account: ServiceAccount,
    query: PurchaseQuery,
    options: GetPurchaseOptions = {},
  ): Promise<UpstreamResponse> {
    return withSpan("purchase_relay.storeb.get_purchase", {
      [ATTR.store]: "storeb",
      "purchase_relay.purchase_type": query.type,
    }, async (span) => {
      const response = await this.#lookUp(account, query, options);
      span?.setAttribute(ATTR.outcome, String(response.status));
      return response;
    });
  }

  /**
   * Lists the purchases Google voided (purchases.voidedpurchases.list) in one page, and returns
   * the final answer, whatever its status: a read, retried as a lookup is. Throws 502
   * `GOOGLE_API_ERROR` when no answer arrived in time, and the token source's errors.
   */
  listVoidedPurchases(
    account: ServiceAccount,
    query: VoidedPurchasesQuery,
    options: GetPurchaseOptions & { signal?: AbortSignal } = {},
  ): Promise<UpstreamResponse> {
    return withSpan("purchase_relay.storeb.voided_purchases", {
      [ATTR.store]: "storeb",
    }, async (span) => {
      const response = await this.#read(account, this.#voidedPurchasesUrl(query), options);
      span?.setAttribute(ATTR.outcome, String(response.status));
      return response;
    });
  }

  #lookUp(
    account: ServiceAccount,
    query: PurchaseQuery,
    options: GetPurchaseOptions,
  ): Promise<UpstreamResponse> {
    return this.#read(account, this.#purchaseUrl(query), options);
  }

  async #read(
    account: ServiceAccount,
    url: string,
    options: GetPurchaseOptions & { signal?: AbortSignal },
  ): Promise<UpstreamResponse> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const timeout = timeoutSignal(timeoutMs);
    const clear = timeout.clear;
    // The caller's signal (a job stopping) ends the read like the deadline does.
    const deadline = options.signal === undefined
      ? timeout.signal
      : AbortSignal.any([timeout.signal, options.signal]);
    let retried = false;
    let refreshedToken = false;
    try {
      while (true) {
        const token = await this.#tokens.accessToken(account, { signal: deadline });
        let response: UpstreamResponse;
        try {
          response = await requestUpstream(url, {
            headers: { authorization: `Bearer ${token}`, accept: "application/json" },
          }, deadline);
        } catch (error) {
          if (error instanceof UpstreamUnreachable && !error.timedOut && !retried) {
            retried = true;
            await pause(RETRY_PAUSE_MS, deadline);
            continue;
          }
          throw error;
        }
        if (response.status === 401 && !refreshedToken) {
          // The token was revoked or expired early: one retry with a fresh one.
          refreshedToken = true;
          this.#tokens.invalidate(account, token);
          continue;
        }
        if (response.status >= 500 && !retried) {
          retried = true;
          await pause(RETRY_PAUSE_MS, deadline);
          continue;
        }
        return response;
      }
    } catch (error) {
      if (error instanceof UpstreamUnreachable) {
        const what = error.timedOut
          ? `did not answer within ${timeoutMs} ms`
          : "could not be reached (retried once)";
        throw googleApiError(`the store B API ${what}`, {
          status: null,
          upstreamCode: null,
          cause: error,
        });
      }
      if (deadline.aborted && error === deadline.reason) {
        // The deadline passed while waiting for a token or pausing between attempts.
        throw googleApiError(`the store B API did not answer within ${timeoutMs} ms`, {
          status: null,
          upstreamCode: null,
        });
      }
      throw error;
    } finally {
      clear();
    }
  }

  /**
   * Sends one write (`:acknowledge` or `:consume`) and returns its answer, whatever its status, or
   * that none came (timeout, connection refused or reset). Never retried, except once with a fresh
   * token after a 401: Google refused the token and did nothing. Throws 502 `GOOGLE_API_ERROR`
   * when the deadline passed before the write was sent, and the token source's errors.
   */
  writePurchase(
    account: ServiceAccount,
    write: PurchaseWrite,
    options: WritePurchaseOptions = {},
  ): Promise<WriteAttempt> {
    return withSpan("purchase_relay.storeb.write_purchase", {
      [ATTR.store]: "storeb",
      "purchase_relay.purchase_type": write.type,
      "purchase_relay.action": write.action,
    }, async (span) => {
      const attempt = await this.#write(account, write, options);
      span?.setAttribute(
        ATTR.outcome,
        attempt.answered ? String(attempt.response.status) : "no_answer",
      );
      return attempt;
    });
  }

  async #write(
    account: ServiceAccount,
    write: PurchaseWrite,
    options: WritePurchaseOptions,
  ): Promise<WriteAttempt> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const { signal: deadline, clear } = timeoutSignal(timeoutMs);
    const url = this.#writeUrl(write);
    // Acknowledge takes an optional JSON body (developerPayload, which is deprecated); consume
    // takes none.
    const init: RequestInit = write.action === "acknowledge"
      ? { method: "POST", body: "{}" }
      : { method: "POST" };
    let refreshedToken = false;
    try {
      while (true) {
        let token: string;
        try {
          token = await this.#tokens.accessToken(account, { signal: deadline });
        } catch (error) {
          if (deadline.aborted && error === deadline.reason) {
            // Nothing was sent: the deadline passed while waiting for a token.
            throw googleApiError(`the store B API did not answer within ${timeoutMs} ms`, {
              status: null,
              upstreamCode: null,
            });
          }
          throw error;
        }
        let response: UpstreamResponse;
        try {
          response = await requestUpstream(url, {
            ...init,
            headers: {
              authorization: `Bearer ${token}`,
              accept: "application/json",
              ...(init.body === undefined ? {} : { "content-type": "application/json" }),
            },
          }, deadline);
        } catch (error) {
          if (error instanceof UpstreamUnreachable) {
            return { answered: false, timedOut: error.timedOut, error };
          }
          throw error;
        }
        if (response.status === 401 && !refreshedToken) {
          // A refused token: the write was not carried out, so it is safe to send it again.
          refreshedToken = true;
          this.#tokens.invalidate(account, token);
          continue;
        }
        return { answered: true, response };
      }
    } finally {
      clear();
    }
  }

  // Path segments: the verify route refuses "." and ".." as product id or token
  // (pathSegmentField), and the package name is the tenant's own.
  #purchaseUrl(query: PurchaseQuery): string {
    const app = `${this.#apiUrl}/androidpublisher/v3/applications/${
      encodeURIComponent(query.packageName)
    }/purchases`;
    const token = encodeURIComponent(query.purchaseToken);
    return query.type === "subscription"
      ? `${app}/subscriptionsv2/tokens/${token}`
      : `${app}/products/${encodeURIComponent(query.productId)}/tokens/${token}`;
  }

  // The query's values are the service's own (times, a page token Google gave).
  #voidedPurchasesUrl(query: VoidedPurchasesQuery): string {
    const params = new URLSearchParams({
      startTime: String(query.startTime),
      endTime: String(query.endTime),
      type: "1",
      includeQuantityBasedPartialRefund: "true",
      maxResults: String(query.maxResults),
    });
    if (query.token !== undefined) params.set("token", query.token);
    return `${this.#apiUrl}/androidpublisher/v3/applications/${
      encodeURIComponent(query.packageName)
    }/purchases/voidedpurchases?${params}`;
  }

  // The same segments as a lookup's; `:` in a token or product id is percent-encoded, so the
  // custom method suffix cannot be forged from them.
  #writeUrl(write: PurchaseWrite): string {
    const app = `${this.#apiUrl}/androidpublisher/v3/applications/${
      encodeURIComponent(write.packageName)
    }/purchases`;
    const collection = write.type === "subscription" ? "subscriptions" : "products";
    return `${app}/${collection}/${encodeURIComponent(write.productId)}/tokens/${
      encodeURIComponent(write.purchaseToken)
    }:${write.action}`;
  }
}
