/**
 * Normalization of the Play Developer API's purchase objects into the verify response's `purchase`
 * (docs/verify.md, "POST /v1/storeb/verify"). Pure functions of the upstream JSON and the
 * request.
 *
 * Upstream shapes are read loosely: a field that is absent or of an unexpected type becomes null
 * (false for `autoRenewing`, 0 for a subscription's `acknowledgementState`) rather than failing the
 * verification, because `rawResponse` keeps everything for a client that needs more. So the
 * documented strings and integers are always of their type or null, never missing or of another
 * type. Only a body that is not a JSON object at all is refused (502 `GOOGLE_API_ERROR`).
 */
import type { ServiceError } from "../errors.ts";
import { googleApiError } from "./upstream.ts";
import { objectOrEmpty } from "../lib/json.ts";

/** The `purchase` of a subscription verify response. */
export interface SubscriptionPurchase {
  kind: "storeb#subscriptionPurchaseV2";
  packageName: string;
  /** Line item 0's `productId`. */
  productId: string | null;
  purchaseToken: string;
  startTime: string | null;
  /** Line item 0's. */
  expiryTime: string | null;
  /** Line item 0's `autoRenewingPlan.autoRenewEnabled`; false without an auto-renewing plan. */
  autoRenewing: boolean;
  /** Line item 0's `autoRenewingPlan.recurringPrice.currencyCode`. */
  priceCurrencyCode: string | null;
  /** Line item 0's recurring price in micros, as an exact decimal string. */
  priceAmountMicros: string | null;
  /** The upstream `regionCode`. */
  countryCode: string | null;
  /** Always null: subscriptionsv2 has no payment state. */
  paymentState: null;
  /** 1 for `ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED`, else 0. */
  acknowledgementState: 0 | 1;
  /** `latestOrderId`, or line item 0's `latestSuccessfulOrderId`. */
  orderId: string | null;
  /** `externalAccountIdentifiers.obfuscatedExternalAccountId`. */
  obfuscatedExternalAccountId: string | null;
  /** The upstream object, unchanged. */
  rawResponse: Record<string, unknown>;
}

/** The `purchase` of a one-time product verify response. */
export interface ProductPurchase {
  kind: "storeb#productPurchase";
  packageName: string;
  /** The request's product id: it is part of the upstream URL, so the answer is about it. */
  productId: string;
  purchaseToken: string;
  /** Epoch milliseconds as a string. */
  purchaseTimeMillis: string | null;
  /** 0 purchased, 1 canceled, 2 pending. Never defaulted: 0 would claim a purchase. */
  purchaseState: number | null;
  /** 0 yet to be consumed, 1 consumed. */
  consumptionState: number | null;
  /** 0 yet to be acknowledged, 1 acknowledged. */
  acknowledgementState: number | null;
  orderId: string | null;
  /** The upstream top-level `obfuscatedExternalAccountId`. */
  obfuscatedExternalAccountId: string | null;
  /** The upstream object, unchanged. */
  rawResponse: Record<string, unknown>;
}

/** A normalized purchase and the app user it belongs to (the response's `appUserId`). */
export interface NormalizedPurchase<P> {
  appUserId: string | null;
  purchase: P;
}

/** What normalization takes from the request. */
export interface PurchaseRequestFields {
  packageName: string;
  productId: string;
  purchaseToken: string;
}

type Json = Record<string, unknown>;

/** Normalizes a 200 answer of purchases.subscriptionsv2.get. */
export function normalizeSubscriptionPurchase(
  upstream: unknown,
  request: PurchaseRequestFields,
): NormalizedPurchase<SubscriptionPurchase> {
  const raw = jsonObject(upstream, "subscription purchase");
  const lineItems = Array.isArray(raw.lineItems) ? raw.lineItems : [];
  const first = objectOrEmpty(lineItems[0]);
  const plan = objectOrEmpty(first.autoRenewingPlan);
  const price = plan.recurringPrice;
  const obfuscatedExternalAccountId = stringOrNull(
    objectOrEmpty(raw.externalAccountIdentifiers).obfuscatedExternalAccountId,
  );
  return {
    appUserId: obfuscatedExternalAccountId,
    purchase: {
      kind: "storeb#subscriptionPurchaseV2",
      packageName: request.packageName,
      productId: stringOrNull(first.productId),
      purchaseToken: request.purchaseToken,
      startTime: stringOrNull(raw.startTime),
      expiryTime: stringOrNull(first.expiryTime),
      autoRenewing: plan.autoRenewEnabled === true,
      priceCurrencyCode: stringOrNull(objectOrEmpty(price).currencyCode),
      priceAmountMicros: moneyToMicros(price),
      countryCode: stringOrNull(raw.regionCode),
      paymentState: null,
      acknowledgementState: raw.acknowledgementState === "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED"
        ? 1
        : 0,
      orderId: stringOrNull(raw.latestOrderId) ?? stringOrNull(first.latestSuccessfulOrderId),
      obfuscatedExternalAccountId,
      rawResponse: raw,
    },
  };
}

/** Normalizes a 200 answer of purchases.products.get. */
export function normalizeProductPurchase(
  upstream: unknown,
  request: PurchaseRequestFields,
): NormalizedPurchase<ProductPurchase> {
  const raw = jsonObject(upstream, "product purchase");
  const obfuscatedExternalAccountId = stringOrNull(raw.obfuscatedExternalAccountId);
  return {
    appUserId: obfuscatedExternalAccountId,
    purchase: {
      kind: "storeb#productPurchase",
      packageName: request.packageName,
      productId: request.productId,
      purchaseToken: request.purchaseToken,
      purchaseTimeMillis: int64String(raw.purchaseTimeMillis),
      purchaseState: integerOrNull(raw.purchaseState),
      consumptionState: integerOrNull(raw.consumptionState),
      acknowledgementState: integerOrNull(raw.acknowledgementState),
      orderId: stringOrNull(raw.orderId),
      obfuscatedExternalAccountId,
      rawResponse: raw,
    },
  };
}

/**
 * A Google `Money` ({currencyCode, units: int64 string, nanos: int32}) in micros, as an exact
 * decimal string: units x 1e6 + nanos / 1e3, with a fraction only when nanos has one
 * ("1990000", "-1750000", "0.001"). Computed with BigInt, so no int64 loses precision. Absent
 * `units` or `nanos` are 0 (proto3 JSON omits zeros); null when `money` is not a Money.
 */
export function moneyToMicros(money: unknown): string | null {
  if (typeof money !== "object" || money === null || Array.isArray(money)) return null;
  const { units = "0", nanos = 0 } = money as Json;
  let totalNanos: bigint;
  if (typeof units === "string" && /^[+-]?\d{1,19}$/.test(units)) {
    totalNanos = BigInt(units) * 1_000_000_000n;
  } else if (typeof units === "number" && Number.isSafeInteger(units)) {
    totalNanos = BigInt(units) * 1_000_000_000n;
  } else {
    return null;
  }
  if (typeof nanos !== "number" || !Number.isInteger(nanos) || Math.abs(nanos) > 999_999_999) {
    return null;
  }
  totalNanos += BigInt(nanos);
  const negative = totalNanos < 0n;
  const magnitude = negative ? -totalNanos : totalNanos;
  const whole = (magnitude / 1000n).toString();
  const fraction = (magnitude % 1000n).toString().padStart(3, "0").replace(/0+$/, "");
  return `${negative ? "-" : ""}${whole}${fraction === "" ? "" : `.${fraction}`}`;
}

function jsonObject(value: unknown, what: string): Json {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw notAnObject(what);
  }
  return value as Json;
}

function notAnObject(what: string): ServiceError {
  return googleApiError(`the store B API answered 200 without a ${what} object`, {
    status: 200,
    upstreamCode: null,
  });
}

function stringOrNull(value: unknown): string | null {
  return typeof value === "string" && value !== "" ? value : null;
}

function integerOrNull(value: unknown): number | null {
  return typeof value === "number" && Number.isInteger(value) ? value : null;
}

/** An int64 field: proto3 JSON sends it as a decimal string; a plain number is accepted too. */
function int64String(value: unknown): string | null {
  if (typeof value === "string" && /^-?\d+$/.test(value)) return value;
  if (typeof value === "number" && Number.isSafeInteger(value)) return String(value);
  return null;
}
