/** The event catalog (docs/events.md), row by row, and the real Apple notifications through it. */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import {
  classifyStorea,
  classifyStoreb,
  namedNotificationTypes,
  UNIFIED_EVENTS,
} from "../src/events/catalog.ts";
import { StoreaJwsVerifier } from "../src/storea/jws.ts";
import { STOREB_SUBSCRIPTION_EVENTS } from "./helpers/catalog.ts";

const SUBSCRIPTION = {
  originalTransactionId: "2000000100",
  productId: "pro.monthly",
  type: "Auto-Renewable Subscription",
};
const CONSUMABLE = { originalTransactionId: "2000000200", productId: "coins", type: "Consumable" };

Deno.test("store A: every notification type and subtype of the table", () => {
  const rows: [string, string | null, string][] = [
    ["SUBSCRIBED", "INITIAL_BUY", "subscription.purchased"],
    ["SUBSCRIBED", "RESUBSCRIBE", "subscription.purchased"],
    ["DID_RENEW", null, "subscription.renewed"],
    ["DID_RENEW", "BILLING_RECOVERY", "subscription.recovered"],
    ["DID_FAIL_TO_RENEW", "GRACE_PERIOD", "subscription.in_grace_period"],
    ["DID_FAIL_TO_RENEW", null, "subscription.on_hold"],
    ["DID_FAIL_TO_RENEW", "BILLING_RETRY", "subscription.on_hold"],
    ["GRACE_PERIOD_EXPIRED", null, "subscription.grace_period_expired"],
    ["DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", "subscription.canceled"],
    ["DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", "subscription.uncanceled"],
    ["DID_CHANGE_RENEWAL_PREF", "UPGRADE", "subscription.product_changed"],
    ["DID_CHANGE_RENEWAL_PREF", "DOWNGRADE", "subscription.product_changed"],
    ["DID_CHANGE_RENEWAL_PREF", null, "subscription.product_changed"],
    ["OFFER_REDEEMED", "UPGRADE", "subscription.offer_redeemed"],
    ["PRICE_INCREASE", "PENDING", "subscription.price_increase"],
    ["RENEWAL_EXTENDED", null, "subscription.extended"],
    ["RENEWAL_EXTENSION", "SUMMARY", "subscription.extension_summary"],
    ["EXPIRED", "VOLUNTARY", "subscription.expired"],
    ["EXPIRED", "BILLING_RETRY", "subscription.expired"],
    ["EXPIRED", "PRICE_INCREASE", "subscription.expired"],
    ["EXPIRED", "PRODUCT_NOT_FOR_SALE", "subscription.expired"],
    ["REVOKE", null, "subscription.revoked"],
    ["CONSUMPTION_REQUEST", null, "refund.consumption_requested"],
  ];
  for (const [notificationType, subtype, event] of rows) {
    const entry = classifyStorea({ notificationType, subtype }, SUBSCRIPTION);
    const label = `${notificationType}/${subtype}`;
    assert.equal(entry.event, event, label);
    assert.equal(entry.reason, subtype?.toLowerCase() ?? null, label);
    assert.equal(entry.platformEvent, `storea.${notificationType.toLowerCase()}`, label);
    assert.deepEqual(entry.subject, {
      key: "2000000100",
      productId: "pro.monthly",
      type: "subscription",
    }, label);
  }
});

Deno.test("store A: products, refunds, tests and unknown types", () => {
  assert.deepEqual(classifyStorea({ notificationType: "REVOKE" }, CONSUMABLE), {
    event: "product.revoked",
    reason: null,
    platformEvent: "storea.revoke",
    subject: { key: "2000000200", productId: "coins", type: "product" },
  });
  assert.deepEqual(classifyStorea({ notificationType: "ONE_TIME_CHARGE" }, CONSUMABLE), {
    event: "product.purchased",
    reason: null,
    platformEvent: "storea.one_time_charge",
    subject: { key: "2000000200", productId: "coins", type: "product" },
  });
  for (
    const [type, event] of [
      ["REFUND", "refund.issued"],
      ["REFUND_DECLINED", "refund.declined"],
      ["REFUND_REVERSED", "refund.reversed"],
    ]
  ) {
    const entry = classifyStorea({ notificationType: type }, SUBSCRIPTION);
    assert.equal(entry.event, event);
    assert.equal(entry.subject, null, `${type} ties to no single user record`);
  }
  assert.deepEqual(classifyStorea({ notificationType: "TEST" }, null), {
    event: "test",
    reason: null,
    platformEvent: "storea.test",
    subject: null,
  });
  assert.deepEqual(
    classifyStorea({ notificationType: "SOMETHING_NEW", subtype: "SHINY" }, SUBSCRIPTION),
    {
      event: "unknown",
      reason: "shiny",
      platformEvent: "storea.something_new",
      subject: null,
    },
  );
  // A known type without a transaction has no subject.
  assert.equal(classifyStorea({ notificationType: "DID_RENEW" }, null).subject, null);
  // Names of Object's own methods are unknown types like any other, not a lookup of the method.
  for (const type of ["constructor", "valueOf", "toString", "__proto__", "hasOwnProperty"]) {
    assert.deepEqual(classifyStorea({ notificationType: type }, SUBSCRIPTION), {
      event: "unknown",
      reason: null,
      platformEvent: `storea.${type.toLowerCase()}`,
      subject: null,
    }, type);
  }
  assert.equal(classifyStorea({}, null).platformEvent, "storea.unknown");
});

Deno.test("store B: every subscription type, in Google's numbering", () => {
  for (const [notificationType, event] of STOREB_SUBSCRIPTION_EVENTS) {
    const entry = classifyStoreb({
      version: "1.0",
      packageName: "com.example.app",
      subscriptionNotification: {
        version: "1.0",
        notificationType,
        purchaseToken: "token-1",
        subscriptionId: "pro.monthly",
      },
    });
    assert.deepEqual(entry, {
      event,
      reason: null,
      platformEvent: `storeb.subscription.${notificationType}`,
      subject: { key: "token-1", productId: "pro.monthly", type: "subscription" },
    }, String(notificationType));
  }
  const unknown = classifyStoreb({
    subscriptionNotification: { notificationType: 99, purchaseToken: "token-1" },
  });
  assert.deepEqual(unknown, {
    event: "unknown",
    reason: null,
    platformEvent: "storeb.subscription.99",
    subject: null,
  });
  // The SKU is optional in newer notifications.
  const noSku = classifyStoreb({
    subscriptionNotification: { notificationType: 2, purchaseToken: "token-1" },
  });
  assert.deepEqual(noSku.subject, { key: "token-1", productId: null, type: "subscription" });
});

Deno.test("store B: one-time products, voided purchases, tests and the unknown", () => {
  for (const [type, event] of [[1, "product.purchased"], [2, "product.canceled"]] as const) {
    assert.deepEqual(
      classifyStoreb({
        oneTimeProductNotification: { notificationType: type, purchaseToken: "t", sku: "coins" },
      }),
      {
        event,
        reason: null,
        platformEvent: `storeb.one_time_product.${type}`,
        subject: { key: "t", productId: "coins", type: "product" },
      },
    );
  }
  for (const [refundType, reason] of [[1, "full_refund"], [2, "partial_refund"]] as const) {
    assert.deepEqual(
      classifyStoreb({
        voidedPurchaseNotification: {
          purchaseToken: "t",
          orderId: "GPA.1",
          productType: 1,
          refundType,
        },
      }),
      { event: "refund.issued", reason, platformEvent: "storeb.voided_purchase", subject: null },
    );
  }
  assert.deepEqual(classifyStoreb({ testNotification: { version: "1.0" } }), {
    event: "test",
    reason: null,
    platformEvent: "storeb.test",
    subject: null,
  });
  assert.deepEqual(classifyStoreb({ somethingElse: {} }), {
    event: "unknown",
    reason: null,
    platformEvent: "storeb.unknown",
    subject: null,
  });
});

const VECTORS = fileURLToPath(new URL("./fixtures/storea/", import.meta.url));

Deno.test({
  name: "the real Apple notifications map to the catalog",
  fn: async () => {
    const expected: Record<string, string> = {
      "DID_RENEW/": "subscription.renewed",
      "SUBSCRIBED/RESUBSCRIBE": "subscription.purchased",
      "DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_DISABLED": "subscription.canceled",
      "EXPIRED/VOLUNTARY": "subscription.expired",
      "DID_CHANGE_RENEWAL_PREF/UPGRADE": "subscription.product_changed",
      "DID_CHANGE_RENEWAL_PREF/DOWNGRADE": "subscription.product_changed",
      "DID_CHANGE_RENEWAL_PREF/": "subscription.product_changed",
      "CONSUMPTION_REQUEST/": "refund.consumption_requested",
      "REFUND/": "refund.issued",
    };
    const verifier = new StoreaJwsVerifier();
    const index = JSON.parse(await Deno.readTextFile(`${VECTORS}real-sandbox/index.json`));
    for (const entry of index) {
      const jws = (await Deno.readTextFile(`${VECTORS}real-sandbox/${entry.file}`)).trim();
      const payload = await verifier.verify(jws);
      const data = payload.data as Record<string, string>;
      const transaction = await verifier.verify(data.signedTransactionInfo);
      const classified = classifyStorea(payload, transaction);
      const key = `${entry.notificationType}/${entry.subtype ?? ""}`;
      assert.equal(classified.event, expected[key], key);
      assert.equal(classified.platformEvent, `storea.${entry.notificationType.toLowerCase()}`);
      if (entry.notificationType === "REFUND") {
        assert.equal(classified.subject, null);
      } else {
        assert.deepEqual(classified.subject, {
          key: entry.originalTransactionId,
          productId: entry.productId,
          type: transaction.type === "Auto-Renewable Subscription" ? "subscription" : "product",
        }, entry.file);
      }
    }
  },
});

Deno.test("UNIFIED_EVENTS is exactly what the tables can name", () => {
  const named = namedNotificationTypes();
  const found = new Set<string>();
  const subtypes = [
    null,
    "BILLING_RECOVERY",
    "GRACE_PERIOD",
    "AUTO_RENEW_DISABLED",
    "AUTO_RENEW_ENABLED",
  ];
  for (const notificationType of [...named.storea, "SOMETHING_NEW"]) {
    for (const subtype of subtypes) {
      for (const transaction of [SUBSCRIPTION, CONSUMABLE]) {
        found.add(classifyStorea({ notificationType, subtype }, transaction).event);
      }
    }
  }
  const storeb = (notification: Record<string, unknown>) =>
    found.add(classifyStoreb({ packageName: "p", ...notification }).event);
  for (const notificationType of [...named.storebSubscription, 99]) {
    storeb({ subscriptionNotification: { notificationType, purchaseToken: "t" } });
  }
  for (const notificationType of named.storebOneTimeProduct) {
    storeb({ oneTimeProductNotification: { notificationType, purchaseToken: "t", sku: "s" } });
  }
  storeb({ voidedPurchaseNotification: { purchaseToken: "t", orderId: "o", refundType: 1 } });
  storeb({ testNotification: { version: "1.0" } });
  assert.deepEqual([...found].sort(), [...UNIFIED_EVENTS].sort());
});
