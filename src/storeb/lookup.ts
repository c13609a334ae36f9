/**
 * One store B purchase lookup and what its answer means, shared by verify and the store actions
 * (which read the purchase before and, when a write's answer was lost, after writing): 200 is
 * the normalized purchase, 404 and 410 are `PURCHASE_NOT_FOUND`, 429 is `RATE_LIMITED`, anything
 * else is `GOOGLE_API_ERROR` (docs/verify.md, "POST /v1/storeb/verify").
 */
import { rateLimited, type ServiceError, UPSTREAM_RETRY_AFTER_DEFAULT_SECONDS } from "../errors.ts";
import type { ServiceAccount } from "./oauth.ts";
import type { StorebApiClient } from "./api_client.ts";
import {
  type NormalizedPurchase,
  normalizeProductPurchase,
  normalizeSubscriptionPurchase,
  type ProductPurchase,
  type SubscriptionPurchase,
} from "./purchase.ts";
import { googleApiError, parseJsonBody, type UpstreamResponse } from "./upstream.ts";
import { objectOrEmpty } from "../lib/json.ts";
import { parseRetryAfterMs } from "../lib/retry_after.ts";

/** Which purchase, as a verify request names it. */
export interface PurchaseRef {
  packageName: string;
  productId: string;
  purchaseToken: string;
  type: "subscription" | "product";
}

/** A lookup's answer: the purchase, or `PURCHASE_NOT_FOUND`. Other answers throw. */
export type PurchaseLookup =
  | {
    found: true;
    normalized: NormalizedPurchase<SubscriptionPurchase | ProductPurchase>;
    upstreamStatus: number;
  }
  | {
    found: false;
    error: "PURCHASE_NOT_FOUND";
    message: string;
    upstreamStatus: 404 | 410;
  };

/** Looks `ref` up with `account`, within `timeoutMs` (the client's retries included). */
export async function lookUpPurchase(
  client: StorebApiClient,
  account: ServiceAccount,
  ref: PurchaseRef,
  timeoutMs: number,
): Promise<PurchaseLookup> {
  const answer = await client.getPurchase(account, ref, { timeoutMs });
  if (answer.status === 200) {
    const body = parseJsonBody(answer.text);
    const normalized = ref.type === "subscription"
      ? normalizeSubscriptionPurchase(body, ref)
      : normalizeProductPurchase(body, ref);
    return { found: true, normalized, upstreamStatus: 200 };
  }
  if (answer.status === 404 || answer.status === 410) return notFound(ref.type, answer.status);
  throw upstreamFailure(answer);
}

/**
 * `PURCHASE_NOT_FOUND` for a 404 (the token never existed) or a 410 (no longer valid); the
 * message tells which.
 */
export function notFound(
  type: PurchaseRef["type"],
  status: 404 | 410,
): Extract<PurchaseLookup, { found: false }> {
  return {
    found: false,
    error: "PURCHASE_NOT_FOUND",
    message: status === 404
      ? `store B has no ${type} purchase with this token: it never existed`
      : `this ${type} purchase token is no longer valid: consumed, refunded or expired too ` +
        `long ago`,
    upstreamStatus: status,
  };
}

/** The error of an answer that is neither a success nor "not found": 429 or 502. */
export function upstreamFailure(answer: UpstreamResponse): ServiceError {
  return answer.status === 429 ? quotaExceeded(answer) : unexpectedAnswer(answer);
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
