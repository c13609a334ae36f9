/**
 * The event catalog: every store notification, known or not, gets a unified `event`, a `reason`, a
 * `platformEvent` and a `subject`. The two tables below are the whole mapping; `docs/events.md`
 * documents them row by row.
 */
import { objectOrNull } from "../lib/json.ts";

/** What a delivery says about the notification behind it (docs/deliveries.md, "A delivery"). */
export interface CatalogEntry {
  /** Unified name, e.g. `subscription.renewed`; `unknown` for anything not in the tables. */
  event: string;
  /** Sub-classification: the store A subtype in lower case, a store B refund kind, or null. */
  reason: string | null;
  /** The upstream identifier, e.g. `storea.did_renew` or `storeb.subscription.2`. */
  platformEvent: string;
  /** The user record the event is about, or null when it is about none. */
  subject: Subject | null;
}

/** The user record an event is about; null for events about no single user (docs/events.md). */
export interface Subject {
  /** Store A `originalTransactionId`, store B `purchaseToken`. */
  key: string;
  productId: string | null;
  type: "subscription" | "product";
}

/** The fields of a verified store A transaction the catalog looks at. */
export interface StoreaTransactionFacts {
  originalTransactionId?: unknown;
  productId?: unknown;
  type?: unknown;
}

/**
 * Store A: notificationType -> event. A function of the subtype where the subtype changes the
 * meaning; `REVOKE` also depends on the product type and is handled in `classifyStorea`.
 */
const STOREA_EVENTS: Record<string, string | ((subtype: string | null) => string)> = {
  SUBSCRIBED: "subscription.purchased",
  DID_RENEW: (subtype) =>
    subtype === "BILLING_RECOVERY" ? "subscription.recovered" : "subscription.renewed",
  DID_FAIL_TO_RENEW: (subtype) =>
    subtype === "GRACE_PERIOD" ? "subscription.in_grace_period" : "subscription.on_hold",
  GRACE_PERIOD_EXPIRED: "subscription.grace_period_expired",
  DID_CHANGE_RENEWAL_STATUS: (subtype) =>
    subtype === "AUTO_RENEW_DISABLED"
      ? "subscription.canceled"
      : subtype === "AUTO_RENEW_ENABLED"
      ? "subscription.uncanceled"
      : "unknown",
  DID_CHANGE_RENEWAL_PREF: "subscription.product_changed",
  OFFER_REDEEMED: "subscription.offer_redeemed",
  PRICE_INCREASE: "subscription.price_increase",
  RENEWAL_EXTENDED: "subscription.extended",
  RENEWAL_EXTENSION: "subscription.extension_summary",
  EXPIRED: "subscription.expired",
  REVOKE: "subscription.revoked",
  ONE_TIME_CHARGE: "product.purchased",
  REFUND: "refund.issued",
  REFUND_DECLINED: "refund.declined",
  REFUND_REVERSED: "refund.reversed",
  CONSUMPTION_REQUEST: "refund.consumption_requested",
  TEST: "test",
};

/** Store A types whose events are about no single user record (docs/events.md). */
const STOREA_WITHOUT_SUBJECT = new Set(["TEST", "REFUND", "REFUND_DECLINED", "REFUND_REVERSED"]);

/**
 * Store B subscription notificationType -> event, in Google's published numbering, which is what
 * Google Play sends; the platformEvent always carries the number itself (docs/events.md, "A note
 * on store B numbering").
 */
const STOREB_SUBSCRIPTION_EVENTS: Record<number, string> = {
  1: "subscription.recovered", // SUBSCRIPTION_RECOVERED
  2: "subscription.renewed", // SUBSCRIPTION_RENEWED
  3: "subscription.canceled", // SUBSCRIPTION_CANCELED
  4: "subscription.purchased", // SUBSCRIPTION_PURCHASED
  5: "subscription.on_hold", // SUBSCRIPTION_ON_HOLD
  6: "subscription.in_grace_period", // SUBSCRIPTION_IN_GRACE_PERIOD
  7: "subscription.uncanceled", // SUBSCRIPTION_RESTARTED
  8: "subscription.price_increase", // SUBSCRIPTION_PRICE_CHANGE_CONFIRMED
  9: "subscription.extended", // SUBSCRIPTION_DEFERRED
  10: "subscription.paused", // SUBSCRIPTION_PAUSED
  11: "subscription.pause_schedule_changed", // SUBSCRIPTION_PAUSE_SCHEDULE_CHANGED
  12: "subscription.revoked", // SUBSCRIPTION_REVOKED
  13: "subscription.expired", // SUBSCRIPTION_EXPIRED
  17: "subscription.product_changed", // SUBSCRIPTION_ITEMS_CHANGED
  18: "subscription.canceled", // SUBSCRIPTION_CANCELLATION_SCHEDULED
  19: "subscription.price_increase", // SUBSCRIPTION_PRICE_CHANGE_UPDATED
  20: "subscription.pending_purchase_canceled", // SUBSCRIPTION_PENDING_PURCHASE_CANCELED
  22: "subscription.price_increase", // SUBSCRIPTION_PRICE_STEP_UP_CONSENT_UPDATED
};

/** Store B one-time product notificationType -> event. */
const STOREB_ONE_TIME_EVENTS: Record<number, string> = {
  1: "product.purchased", // ONE_TIME_PRODUCT_PURCHASED
  2: "product.canceled", // ONE_TIME_PRODUCT_CANCELED
};

/**
 * Every unified event name a delivery can carry (docs/events.md): what an event filter may name.
 * `tests/events_catalog_test.ts` checks that the tables above name no other.
 */
export const UNIFIED_EVENTS: readonly string[] = [
  "subscription.purchased",
  "subscription.renewed",
  "subscription.recovered",
  "subscription.in_grace_period",
  "subscription.on_hold",
  "subscription.grace_period_expired",
  "subscription.canceled",
  "subscription.uncanceled",
  "subscription.product_changed",
  "subscription.offer_redeemed",
  "subscription.price_increase",
  "subscription.extended",
  "subscription.extension_summary",
  "subscription.expired",
  "subscription.revoked",
  "subscription.paused",
  "subscription.pause_schedule_changed",
  "subscription.pending_purchase_canceled",
  "product.purchased",
  "product.canceled",
  "product.revoked",
  "refund.issued",
  "refund.declined",
  "refund.reversed",
  "refund.consumption_requested",
  "test",
  "unknown",
];

/** The notification types the tables name; see {@linkcode namedNotificationTypes}. */
export interface NamedNotificationTypes {
  /** Store A `notificationType` values (some name an event only with a subtype). */
  storea: string[];
  /** Store B subscription `notificationType` numbers. */
  storebSubscription: number[];
  /** Store B one-time product `notificationType` numbers. */
  storebOneTimeProduct: number[];
}

/**
 * The notification types the catalog names an event for, in table order (store B's voided
 * purchase and test notifications have no type number): what a development tool may make
 * (`purchase-relay trigger`).
 */
export function namedNotificationTypes(): NamedNotificationTypes {
  return {
    storea: Object.keys(STOREA_EVENTS),
    storebSubscription: Object.keys(STOREB_SUBSCRIPTION_EVENTS).map(Number),
    storebOneTimeProduct: Object.keys(STOREB_ONE_TIME_EVENTS).map(Number),
  };
}

/**
 * Classifies a verified store A notification. `transaction` is its verified nested
 * `signedTransactionInfo`, or null when the notification has none (TEST, for instance).
 */
export function classifyStorea(
  notification: { notificationType?: unknown; subtype?: unknown },
  transaction: StoreaTransactionFacts | null,
): CatalogEntry {
  const type = typeof notification.notificationType === "string"
    ? notification.notificationType
    : "";
  const subtype = typeof notification.subtype === "string" ? notification.subtype : null;
  const isSubscription = transaction?.type === "Auto-Renewable Subscription";

  // The type comes from the store: an own-property lookup, or `valueOf` finds Object's method.
  const mapped = Object.hasOwn(STOREA_EVENTS, type) ? STOREA_EVENTS[type] : undefined;
  let event = typeof mapped === "function" ? mapped(subtype) : mapped ?? "unknown";
  if (type === "REVOKE" && transaction !== null && !isSubscription) event = "product.revoked";

  const key = transaction?.originalTransactionId;
  const subject: Subject | null =
    event === "unknown" || STOREA_WITHOUT_SUBJECT.has(type) || typeof key !== "string" ? null : {
      key,
      productId: typeof transaction?.productId === "string" ? transaction.productId : null,
      type: isSubscription ? "subscription" : "product",
    };
  return {
    event,
    reason: subtype === null ? null : subtype.toLowerCase(),
    platformEvent: `storea.${type.toLowerCase() || "unknown"}`,
    subject,
  };
}

/** Classifies a decoded store B developer notification (the JSON inside `message.data`). */
export function classifyStoreb(notification: Record<string, unknown>): CatalogEntry {
  const subscription = objectOrNull(notification.subscriptionNotification);
  if (subscription) {
    return classifyPurchaseNotification(subscription, {
      events: STOREB_SUBSCRIPTION_EVENTS,
      platformPrefix: "storeb.subscription",
      productId: subscription.subscriptionId,
      type: "subscription",
    });
  }
  const oneTime = objectOrNull(notification.oneTimeProductNotification);
  if (oneTime) {
    return classifyPurchaseNotification(oneTime, {
      events: STOREB_ONE_TIME_EVENTS,
      platformPrefix: "storeb.one_time_product",
      productId: oneTime.sku,
      type: "product",
    });
  }
  const voided = objectOrNull(notification.voidedPurchaseNotification);
  if (voided) {
    const refundType = voided.refundType;
    return {
      event: "refund.issued",
      reason: refundType === 1 ? "full_refund" : refundType === 2 ? "partial_refund" : null,
      platformEvent: "storeb.voided_purchase",
      subject: null,
    };
  }
  if (objectOrNull(notification.testNotification)) {
    return { event: "test", reason: null, platformEvent: "storeb.test", subject: null };
  }
  return { event: "unknown", reason: null, platformEvent: "storeb.unknown", subject: null };
}

/** A store B notification about one purchase: its numbered type, and a subject when known. */
function classifyPurchaseNotification(
  notification: Record<string, unknown>,
  kind: {
    events: Record<number, string>;
    platformPrefix: string;
    productId: unknown;
    type: Subject["type"];
  },
): CatalogEntry {
  const type = notification.notificationType;
  const event = typeof type === "number" && Object.hasOwn(kind.events, type)
    ? kind.events[type]
    : undefined;
  const token = notification.purchaseToken;
  return {
    event: event ?? "unknown",
    reason: null,
    platformEvent: `${kind.platformPrefix}.${typeof type === "number" ? type : "unknown"}`,
    // Unknown notifications carry no subject: nothing says what their token is about.
    subject: event && typeof token === "string"
      ? {
        key: token,
        productId: typeof kind.productId === "string" ? kind.productId : null,
        type: kind.type,
      }
      : null,
  };
}
