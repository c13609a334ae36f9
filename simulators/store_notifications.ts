/**
 * Notifications of a chosen type, as each store would send them about one purchase: a store A
 * notification signed with a {@linkcode StoreaSigner}, with the transaction, renewal info and
 * status the type implies (an EXPIRED one carries an expired transaction, a REFUND a revoked
 * one); and a store B developer notification of any kind, with the Pub/Sub push envelope and the
 * OIDC token that come with it. `purchase-relay trigger` (through `deno task dev`) and tenants'
 * own tests use them to make any notification the event catalog knows (docs/events.md).
 *
 * ```ts
 * const { signedPayload } = await storeaNotification(signer, {
 *   notificationType: "EXPIRED",
 *   subtype: "VOLUNTARY",
 *   originalTransactionId: "2000000123456789",
 *   productId: "pro.monthly",
 * });
 * const push = await storebPush(issuer, {
 *   notification: { kind: "subscription", notificationType: 4 },
 *   packageName: "com.example.app",
 *   purchaseToken: "tok",
 *   productId: "premium_monthly",
 *   audience: "https://relay.example.com/v1/webhooks/storeb/tenant_01",
 *   pushServiceAccount: "pubsub-push@example-project.iam.gserviceaccount.com",
 * });
 * ```
 * @module
 */
import type {
  StoreaNotificationPayload,
  StoreaRenewalInfoPayload,
  StoreaSigner,
  StoreaTransactionPayload,
} from "./storea_signer.ts";
import {
  oneTimeProductNotification,
  type PushEnvelope,
  pushEnvelope,
  type PushTokenIssuer,
  subscriptionNotification,
  testNotification,
  voidedPurchaseNotification,
} from "./storeb_push.ts";

const DAY_MS = 86_400_000;

/** A store A notification to make: its type, and the purchase it is about. */
export interface StoreaNotificationRequest {
  /** Any `notificationType`, e.g. `DID_RENEW` or `TEST`. */
  notificationType: string;
  /** E.g. `BILLING_RECOVERY`; none by default. */
  subtype?: string;
  /** The app's bundle id. Default: the signer's. */
  bundleId?: string;
  /** `data.appAppleId`, which the service checks when the tenant has an app id. */
  appAppleId?: number;
  /** The purchase: the subscription's (or the product's) original transaction id. */
  originalTransactionId: string;
  /** Its product id. */
  productId: string;
}

/** A signed store A notification: the body a receiver gets, and what it decodes to. */
export interface SignedStoreaNotification {
  /** The request body, `{ signedPayload }`. */
  body: { signedPayload: string };
  /** The decoded payload, nested transaction and renewal info still signed. */
  payload: StoreaNotificationPayload;
}

/** Store A `EXPIRED` subtypes and the renewal info's `expirationIntent` of each. */
const EXPIRATION_INTENTS: Record<string, number> = {
  VOLUNTARY: 1,
  BILLING_RETRY: 2,
  PRICE_INCREASE: 3,
  PRODUCT_NOT_FOR_SALE: 4,
};

/**
 * Makes and signs a store A notification of `request.notificationType`. A TEST carries no
 * transaction; a RENEWAL_EXTENSION with subtype SUMMARY carries a `summary` instead of `data`, as
 * Apple's do; ONE_TIME_CHARGE is about a consumable; every other type is about an auto-renewable
 * subscription, in the state the type describes.
 */
export async function storeaNotification(
  signer: StoreaSigner,
  request: StoreaNotificationRequest,
): Promise<SignedStoreaNotification> {
  const type = request.notificationType;
  const subtype = request.subtype;
  const bundleId = request.bundleId ?? signer.bundleId;
  if (type === "RENEWAL_EXTENSION" && subtype === "SUMMARY") {
    const payload = {
      notificationType: type,
      subtype,
      notificationUUID: crypto.randomUUID(),
      summary: {
        requestIdentifier: crypto.randomUUID(),
        environment: signer.environment,
        ...(request.appAppleId === undefined ? {} : { appAppleId: request.appAppleId }),
        bundleId,
        productId: request.productId,
        storefrontCountryCodes: ["USA"],
        succeededCount: 1,
        failedCount: 0,
      },
      version: "2.0",
      signedDate: Date.now(),
    } as unknown as StoreaNotificationPayload;
    return { body: { signedPayload: await signer.signNotification(payload) }, payload };
  }
  const subscription = type !== "ONE_TIME_CHARGE";
  const payload = await signer.notificationPayload({
    notificationType: type,
    subtype,
    bundleId,
    appAppleId: request.appAppleId,
    transaction: type === "TEST" ? undefined : transactionFor(signer, request, bundleId),
    renewalInfo: type === "TEST" || !subscription ? undefined : renewalInfoFor(signer, request),
    status: type === "TEST" || !subscription ? undefined : subscriptionStatus(type, subtype),
  });
  return { body: { signedPayload: await signer.signNotification(payload) }, payload };
}

function transactionFor(
  signer: StoreaSigner,
  request: StoreaNotificationRequest,
  bundleId: string,
): StoreaTransactionPayload {
  const now = Date.now();
  const type = request.notificationType;
  const subscription = type !== "ONE_TIME_CHARGE";
  const overrides: Partial<StoreaTransactionPayload> = {
    originalTransactionId: request.originalTransactionId,
    productId: request.productId,
    bundleId,
    type: subscription ? "Auto-Renewable Subscription" : "Consumable",
  };
  if (type === "SUBSCRIBED" || type === "ONE_TIME_CHARGE") {
    overrides.transactionId = request.originalTransactionId;
  }
  if (subscription) {
    overrides.originalPurchaseDate = now - 31 * DAY_MS;
    if (type === "DID_RENEW") overrides.transactionReason = "RENEWAL";
    if (type === "EXPIRED" || type === "GRACE_PERIOD_EXPIRED") {
      overrides.purchaseDate = now - 31 * DAY_MS;
      overrides.expiresDate = now - DAY_MS;
    }
  }
  if (type === "REFUND" || type === "REVOKE") {
    overrides.revocationDate = now;
    overrides.revocationReason = 0;
  }
  return signer.sampleTransaction(overrides);
}

function renewalInfoFor(
  signer: StoreaSigner,
  request: StoreaNotificationRequest,
): StoreaRenewalInfoPayload {
  const type = request.notificationType;
  const subtype = request.subtype ?? "";
  const overrides: Partial<StoreaRenewalInfoPayload> = {
    originalTransactionId: request.originalTransactionId,
    productId: request.productId,
    autoRenewProductId: request.productId,
  };
  if (subtype === "AUTO_RENEW_DISABLED" || type === "EXPIRED") overrides.autoRenewStatus = 0;
  if (type === "EXPIRED") overrides.expirationIntent = EXPIRATION_INTENTS[subtype] ?? 5;
  if (type === "DID_FAIL_TO_RENEW") {
    overrides.isInBillingRetryPeriod = true;
    if (subtype === "GRACE_PERIOD") overrides.gracePeriodExpiresDate = Date.now() + 6 * DAY_MS;
  }
  return signer.sampleRenewalInfo(overrides);
}

/** `data.status`: 1 active, 2 expired, 3 billing retry, 4 grace period, 5 revoked. */
function subscriptionStatus(type: string, subtype: string | undefined): number {
  if (type === "EXPIRED" || type === "GRACE_PERIOD_EXPIRED") return 2;
  if (type === "DID_FAIL_TO_RENEW") return subtype === "GRACE_PERIOD" ? 4 : 3;
  if (type === "REVOKE" || type === "REFUND") return 5;
  return 1;
}

/** The developer notification a {@linkcode storebPush} carries. */
export type StorebNotificationKind =
  | { kind: "subscription"; notificationType: number }
  | { kind: "one_time_product"; notificationType: number }
  /** `refundType` 1 is a full refund (the default), 2 a quantity-based partial one. */
  | { kind: "voided_purchase"; refundType?: 1 | 2 }
  | { kind: "test" };

/** A store B push to make: the notification, the purchase it is about, and the push's token. */
export interface StorebPushRequest {
  notification: StorebNotificationKind;
  packageName: string;
  purchaseToken: string;
  /** The subscription or product id (Google sends `subscriptionId` only to old integrations). */
  productId: string;
  /** The push subscription's audience, the `aud` of its token (the tenant's push audience). */
  audience: string;
  /** The service account the push subscription signs its token as. */
  pushServiceAccount: string;
}

/** A store B push as Pub/Sub sends it: the body, the bearer token, and the notification. */
export interface StorebPush {
  body: PushEnvelope;
  /** `Authorization: Bearer <token>`. */
  token: string;
  /** The developer notification inside `body.message.data`. */
  notification: Record<string, unknown>;
}

/** Makes a store B push of any notification kind, with a token from `issuer`. */
export async function storebPush(
  issuer: PushTokenIssuer,
  request: StorebPushRequest,
): Promise<StorebPush> {
  const notification = storebNotification(request);
  const token = await issuer.mint({
    audience: request.audience,
    email: request.pushServiceAccount,
  });
  return { body: pushEnvelope(notification), token, notification };
}

function storebNotification(request: StorebPushRequest): Record<string, unknown> {
  const { notification, packageName, purchaseToken, productId } = request;
  switch (notification.kind) {
    case "subscription":
      return subscriptionNotification(packageName, {
        notificationType: notification.notificationType,
        purchaseToken,
        subscriptionId: productId,
      });
    case "one_time_product":
      return oneTimeProductNotification(packageName, {
        notificationType: notification.notificationType,
        purchaseToken,
        sku: productId,
      });
    case "voided_purchase":
      return voidedPurchaseNotification(packageName, {
        purchaseToken,
        orderId: `GPA.${randomDigits(4)}-${randomDigits(4)}-${randomDigits(4)}-${randomDigits(5)}`,
        productType: 1,
        refundType: notification.refundType ?? 1,
      });
    case "test":
      return testNotification(packageName);
  }
}

function randomDigits(count: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(count)), (byte) => byte % 10).join("");
}
