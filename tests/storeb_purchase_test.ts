/** Store B normalization of the verify response's `purchase`, with plain inputs. */
import assert from "node:assert/strict";
import { ServiceError } from "../src/errors.ts";
import {
  moneyToMicros,
  normalizeProductPurchase,
  normalizeSubscriptionPurchase,
} from "../src/storeb/purchase.ts";

const REQUEST = {
  packageName: "com.example.app",
  productId: "monthly",
  purchaseToken: "token-1",
};

const SUBSCRIPTION = {
  kind: "androidpublisher#subscriptionPurchaseV2",
  regionCode: "JP",
  startTime: "2025-03-01T08:00:00.250Z",
  subscriptionState: "SUBSCRIPTION_STATE_ACTIVE",
  latestOrderId: "GPA.1111-2222-3333-44444..5",
  acknowledgementState: "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED",
  externalAccountIdentifiers: { obfuscatedExternalAccountId: "user-42" },
  lineItems: [
    {
      productId: "premium",
      expiryTime: "2025-04-01T08:00:00.250Z",
      autoRenewingPlan: {
        autoRenewEnabled: true,
        recurringPrice: { currencyCode: "JPY", units: "1200", nanos: 0 },
      },
      offerDetails: { basePlanId: "monthly" },
      latestSuccessfulOrderId: "GPA.1111-2222-3333-44444..4",
    },
    {
      productId: "addon",
      expiryTime: "2030-01-01T00:00:00Z",
      autoRenewingPlan: { autoRenewEnabled: false },
    },
  ],
  somethingNew: { kept: true },
};

Deno.test("storeb purchase: a subscription is normalized from line item 0", () => {
  const upstream = structuredClone(SUBSCRIPTION);
  const { appUserId, purchase } = normalizeSubscriptionPurchase(upstream, REQUEST);
  assert.equal(appUserId, "user-42");
  assert.deepEqual(purchase, {
    kind: "storeb#subscriptionPurchaseV2",
    packageName: "com.example.app",
    productId: "premium",
    purchaseToken: "token-1",
    startTime: "2025-03-01T08:00:00.250Z",
    expiryTime: "2025-04-01T08:00:00.250Z",
    autoRenewing: true,
    priceCurrencyCode: "JPY",
    priceAmountMicros: "1200000000",
    countryCode: "JP",
    paymentState: null,
    acknowledgementState: 1,
    orderId: "GPA.1111-2222-3333-44444..5",
    obfuscatedExternalAccountId: "user-42",
    rawResponse: SUBSCRIPTION,
  });
  assert.equal(purchase.rawResponse, upstream, "the upstream object itself, unchanged");
});

Deno.test("storeb purchase: subscription fallbacks and absent fields", () => {
  const { appUserId, purchase } = normalizeSubscriptionPurchase({
    startTime: "2025-03-01T08:00:00Z",
    acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING",
    lineItems: [{
      productId: "premium",
      expiryTime: "2025-04-01T08:00:00Z",
      prepaidPlan: { allowExtendAfterTime: "2025-03-20T00:00:00Z" },
      latestSuccessfulOrderId: "GPA.9",
    }],
  }, REQUEST);
  assert.equal(appUserId, null);
  assert.equal(purchase.orderId, "GPA.9", "line item 0's latestSuccessfulOrderId");
  assert.equal(purchase.acknowledgementState, 0);
  assert.equal(purchase.autoRenewing, false, "a prepaid plan does not renew");
  assert.equal(purchase.priceAmountMicros, null);
  assert.equal(purchase.priceCurrencyCode, null);
  assert.equal(purchase.countryCode, null);
  assert.equal(purchase.obfuscatedExternalAccountId, null);
  assert.equal(purchase.paymentState, null);

  const empty = normalizeSubscriptionPurchase({}, REQUEST).purchase;
  for (const field of ["productId", "startTime", "expiryTime", "orderId", "countryCode"] as const) {
    assert.equal(empty[field], null, field);
  }
  assert.equal(empty.acknowledgementState, 0);
  assert.equal(empty.autoRenewing, false);
  // Wrong types become null rather than leaking through.
  const odd = normalizeSubscriptionPurchase({
    startTime: 17,
    regionCode: ["US"],
    lineItems: "no",
    externalAccountIdentifiers: { obfuscatedExternalAccountId: 5 },
  }, REQUEST);
  assert.equal(odd.purchase.startTime, null);
  assert.equal(odd.purchase.countryCode, null);
  assert.equal(odd.purchase.productId, null);
  assert.equal(odd.appUserId, null);
});

Deno.test("storeb purchase: a product is normalized from the top level", () => {
  const upstream = {
    kind: "androidpublisher#productPurchase",
    purchaseTimeMillis: "1735689600123",
    purchaseState: 0,
    consumptionState: 1,
    developerPayload: "",
    orderId: "GPA.5555-6666-7777-88888",
    purchaseType: 0,
    acknowledgementState: 1,
    obfuscatedExternalAccountId: "user-7",
    regionCode: "DE",
  };
  const { appUserId, purchase } = normalizeProductPurchase(upstream, {
    ...REQUEST,
    productId: "coins_100",
  });
  assert.equal(appUserId, "user-7");
  assert.deepEqual(purchase, {
    kind: "storeb#productPurchase",
    packageName: "com.example.app",
    productId: "coins_100",
    purchaseToken: "token-1",
    purchaseTimeMillis: "1735689600123",
    purchaseState: 0,
    consumptionState: 1,
    acknowledgementState: 1,
    orderId: "GPA.5555-6666-7777-88888",
    obfuscatedExternalAccountId: "user-7",
    rawResponse: upstream,
  });
  const sparse = normalizeProductPurchase({ purchaseTimeMillis: 1735689600123 }, REQUEST);
  assert.equal(sparse.purchase.purchaseTimeMillis, "1735689600123", "a number becomes a string");
  assert.equal(sparse.purchase.purchaseState, null, "never defaulted to 0 (purchased)");
  assert.equal(sparse.purchase.consumptionState, null);
  assert.equal(sparse.purchase.acknowledgementState, null);
  assert.equal(sparse.purchase.orderId, null);
  assert.equal(sparse.appUserId, null);
});

Deno.test("storeb purchase: a body that is not an object is 502 GOOGLE_API_ERROR", () => {
  for (const body of [undefined, null, "text", 42, [SUBSCRIPTION]]) {
    for (const normalize of [normalizeSubscriptionPurchase, normalizeProductPurchase]) {
      assert.throws(
        () => normalize(body, REQUEST),
        (e) =>
          e instanceof ServiceError && e.code === "GOOGLE_API_ERROR" && e.status === 502 &&
          e.details?.status === 200,
      );
    }
  }
});

Deno.test("storeb purchase: Money to micros is exact", () => {
  const cases: [unknown, string | null][] = [
    [{ currencyCode: "USD", units: "9", nanos: 990_000_000 }, "9990000"],
    [{ currencyCode: "USD", nanos: 990_000_000 }, "990000"],
    [{ currencyCode: "USD", units: "5" }, "5000000"],
    [{ currencyCode: "USD" }, "0"],
    [{ units: "-1", nanos: -750_000_000 }, "-1750000"],
    [{ units: "0", nanos: -500 }, "-0.5"],
    [{ units: "0", nanos: 1 }, "0.001"],
    [{ units: "12", nanos: 345_678_901 }, "12345678.901"],
    // int64 extremes: far beyond Number's 2^53 and still exact.
    [{ units: "9223372036854775807", nanos: 999_999_999 }, "9223372036854775807999999.999"],
    [{ units: "-9223372036854775808", nanos: 0 }, "-9223372036854775808000000"],
    [{ units: 3, nanos: 0 }, "3000000"],
    [{ units: "1.5" }, null],
    [{ units: "9", nanos: 1_000_000_000 }, null],
    [{ units: "9", nanos: 0.5 }, null],
    [null, null],
    [undefined, null],
    ["9.99", null],
  ];
  for (const [money, micros] of cases) {
    assert.equal(moneyToMicros(money), micros, JSON.stringify(money));
  }
});
