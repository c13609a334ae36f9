/**
 * A verified notification of either store as the event to store and deliver: classified by the
 * catalog, routed, with the store's own time of the event and what it says of the purchase
 * (docs/deliveries.md, "State on every delivery"). The receivers and the recovery from the
 * stores' records build their events here, so a recovered notification is delivered exactly as
 * one the store posted.
 */
import type { VerifiedStoreaNotification } from "../storea/notification.ts";
import { normalizeTransaction } from "../storea/transaction.ts";
import { normalizeRenewal } from "../storea/renewal.ts";
import { objectOrEmpty } from "../lib/json.ts";
import { classifyStorea, classifyStoreb } from "./catalog.ts";
import type { VerifiedNotification } from "./ingest.ts";

/** A verified store A notification of `tenantId` as its event. */
export function storeaEvent(
  tenantId: string,
  notification: VerifiedStoreaNotification,
): VerifiedNotification {
  const { payload, transaction, renewal } = notification;
  const data = objectOrEmpty(payload.data);
  return {
    tenantId,
    source: "storea",
    externalId: notification.notificationUUID,
    entry: classifyStorea(payload, transaction),
    data: payload,
    raw: payload,
    sandbox: notification.environment === "Sandbox",
    occurredAt: isoFromMillis(payload.signedDate),
    // What the notification itself carries, verified with it: no store call.
    state: transaction === null ? null : {
      transaction: normalizeTransaction(transaction, data.signedTransactionInfo as string),
      renewal: renewal === null
        ? null
        : normalizeRenewal(renewal, data.signedRenewalInfo as string),
      status: Number.isInteger(data.status) ? data.status : null,
    },
  };
}

/**
 * The dedup key of a store B voided purchase: its order id, whichever brought it first, its
 * notification or Google's voided purchases list (docs/recovery.md, "Recovering missed
 * notifications").
 */
export function voidedPurchaseKey(orderId: string): string {
  return `voided:${orderId}`;
}

/** A decoded store B developer notification of `tenantId` (from `envelope`) as its event. */
export function storebEvent(
  tenantId: string,
  notification: Record<string, unknown>,
  delivery: { messageId: string; envelope: unknown },
): VerifiedNotification {
  const voided = objectOrEmpty(notification.voidedPurchaseNotification);
  const orderId = typeof voided.orderId === "string" && voided.orderId !== ""
    ? voided.orderId
    : null;
  return {
    tenantId,
    source: "storeb",
    externalId: delivery.messageId,
    ...(orderId === null ? {} : { dedupKey: voidedPurchaseKey(orderId) }),
    entry: classifyStoreb(notification),
    data: notification,
    raw: delivery.envelope,
    occurredAt: isoFromMillis(Number(notification.eventTimeMillis)),
    // Fetched from the store before the first attempt, for a purchase's notifications.
    state: null,
    needsState: storebPurchaseOf(notification) !== null,
  };
}

/** The purchase a store B notification is about, as verify would ask for it; null for none. */
export function storebPurchaseOf(
  notification: Record<string, unknown>,
): {
  packageName: string;
  productId: string;
  purchaseToken: string;
  type: "subscription" | "product";
} | null {
  const packageName = notification.packageName;
  if (typeof packageName !== "string") return null;
  const subscription = objectOrEmpty(notification.subscriptionNotification);
  if (typeof subscription.purchaseToken === "string" && subscription.purchaseToken !== "") {
    return {
      packageName,
      // The subscriptions v2 lookup is by token alone; the id is kept for the record.
      productId: typeof subscription.subscriptionId === "string" ? subscription.subscriptionId : "",
      purchaseToken: subscription.purchaseToken,
      type: "subscription",
    };
  }
  const product = objectOrEmpty(notification.oneTimeProductNotification);
  if (
    typeof product.purchaseToken === "string" && product.purchaseToken !== "" &&
    typeof product.sku === "string" && product.sku !== ""
  ) {
    return {
      packageName,
      productId: product.sku,
      purchaseToken: product.purchaseToken,
      type: "product",
    };
  }
  return null;
}

/** Epoch milliseconds as ISO-8601, or null when it is not a usable time. */
function isoFromMillis(value: unknown): string | null {
  if (typeof value !== "number" || !Number.isFinite(value)) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}
