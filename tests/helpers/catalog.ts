/**
 * The store B subscription rows of the event catalog (docs/events.md), written out independently of
 * `src/events/catalog.ts` so the tests that use them can fail when it changes.
 */

/** Google's subscription notificationType numbers and their unified events. */
export const STOREB_SUBSCRIPTION_EVENTS: readonly (readonly [number, string])[] = [
  [1, "subscription.recovered"],
  [2, "subscription.renewed"],
  [3, "subscription.canceled"],
  [4, "subscription.purchased"],
  [5, "subscription.on_hold"],
  [6, "subscription.in_grace_period"],
  [7, "subscription.uncanceled"],
  [8, "subscription.price_increase"],
  [9, "subscription.extended"],
  [10, "subscription.paused"],
  [11, "subscription.pause_schedule_changed"],
  [12, "subscription.revoked"],
  [13, "subscription.expired"],
  [17, "subscription.product_changed"],
  [18, "subscription.canceled"],
  [19, "subscription.price_increase"],
  [20, "subscription.pending_purchase_canceled"],
  [22, "subscription.price_increase"],
];
