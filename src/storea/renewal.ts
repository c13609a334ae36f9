/**
 * A verified store A renewal info (`signedRenewalInfo`) in the shape the service answers it: the
 * fields Apple documents for every subscription, epoch-ms dates as ISO-8601, absent optional
 * fields as null, the JWS unchanged and every decoded field in `rawDecodedPayload`
 * (docs/store_gateway.md, "POST /v1/storea/subscriptions"). Shared by the subscription status
 * lookup and by what a store A delivery says of the purchase.
 */
import { integerOrNull, isoDate, stringOrNull } from "./transaction.ts";

/** The `renewal` object of a store A subscription. */
export interface StoreaRenewal {
  originalTransactionId: string;
  autoRenewProductId: string;
  productId: string;
  /** `0` off, `1` on. */
  autoRenewStatus: number | null;
  /** `1` customer cancel, `2` billing error, `3` price increase declined, `4` unavailable, `5` other. */
  expirationIntent: number | null;
  gracePeriodExpiresDate: string | null;
  isInBillingRetryPeriod: boolean | null;
  /** `1` intro, `2` promotional, `3` offer code. */
  offerType: number | null;
  offerIdentifier: string | null;
  recentSubscriptionStartDate: string | null;
  /** The next scheduled renewal. */
  renewalDate: string | null;
  signedDate: string | null;
  /** The original JWS, unchanged, so a client can verify it again. */
  signedRenewalInfo: string;
  /** Every field Apple sent, including those not normalized above. */
  rawDecodedPayload: Record<string, unknown>;
}

/** Normalizes a decoded (and already verified) `signedRenewalInfo` payload. */
export function normalizeRenewal(
  payload: Record<string, unknown>,
  signedRenewalInfo: string,
): StoreaRenewal {
  return {
    originalTransactionId: stringOrNull(payload.originalTransactionId) ?? "",
    autoRenewProductId: stringOrNull(payload.autoRenewProductId) ?? "",
    productId: stringOrNull(payload.productId) ?? "",
    autoRenewStatus: integerOrNull(payload.autoRenewStatus),
    expirationIntent: integerOrNull(payload.expirationIntent),
    gracePeriodExpiresDate: isoDate(payload.gracePeriodExpiresDate),
    isInBillingRetryPeriod: typeof payload.isInBillingRetryPeriod === "boolean"
      ? payload.isInBillingRetryPeriod
      : null,
    offerType: integerOrNull(payload.offerType),
    offerIdentifier: stringOrNull(payload.offerIdentifier),
    recentSubscriptionStartDate: isoDate(payload.recentSubscriptionStartDate),
    renewalDate: isoDate(payload.renewalDate),
    signedDate: isoDate(payload.signedDate),
    signedRenewalInfo,
    rawDecodedPayload: payload,
  };
}
