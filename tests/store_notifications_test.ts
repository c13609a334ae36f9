/**
 * simulators/store_notifications.ts: every notification type the catalog names, made for either
 * store, passes the service's own checks (signatures up to the test root, the push token's
 * audience and account, the tenant's bundle or package) and is classified as the type says.
 */
import assert from "node:assert/strict";
import {
  createStoreaTestPki,
  startPushTokenIssuer,
  storeaNotification,
  StoreaSigner,
  type StorebNotificationKind,
  storebPush,
} from "../simulators/mod.ts";
import { StoreaJwsVerifier } from "../src/storea/jws.ts";
import {
  type StoreaNotificationOrigin,
  verifyStoreaNotification,
} from "../src/storea/notification.ts";
import { PushTokenVerifier } from "../src/storeb/push_token.ts";
import { decodeStorebNotification, pushEnvelopeSchema } from "../src/storeb/notification.ts";
import { classifyStorea, classifyStoreb, namedNotificationTypes } from "../src/events/catalog.ts";

/** Posted to the receiver, as a store posts them, with the default age limit. */
const POSTED: StoreaNotificationOrigin = { via: "receiver", maxAgeMs: 10 * 86_400_000 };

const BUNDLE_ID = "com.example.tests";
const ORIGINAL_TRANSACTION_ID = "2000000987654321";
const PRODUCT_ID = "pro.yearly";
const CREDENTIALS = {
  bundleId: BUNDLE_ID,
  keyId: "KEY",
  issuerId: "issuer",
  privateKeyPem: "",
  environment: "auto" as const,
  appId: 1234567890,
};

/** Subtypes some types need to name an event, and a few whose shape differs. */
const STOREA_CASES: [type: string, subtype: string | undefined, event: string][] = [
  ["DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", "subscription.canceled"],
  ["DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", "subscription.uncanceled"],
  ["DID_RENEW", "BILLING_RECOVERY", "subscription.recovered"],
  ["DID_FAIL_TO_RENEW", "GRACE_PERIOD", "subscription.in_grace_period"],
  ["EXPIRED", "VOLUNTARY", "subscription.expired"],
  ["RENEWAL_EXTENSION", "SUMMARY", "subscription.extension_summary"],
  ["ONE_TIME_CHARGE", undefined, "product.purchased"],
  ["TEST", undefined, "test"],
];

Deno.test("store A: every named type is signed, verified and classified as its type", async () => {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.other" });
  const jws = new StoreaJwsVerifier({ rootCertificates: [pki.rootDer] });
  const types = namedNotificationTypes().storea;
  assert.ok(types.length >= 18, `only ${types.length} store A types named`);
  const cases = [
    ...types.filter((type) => type !== "DID_CHANGE_RENEWAL_STATUS")
      .map((type) => [type, undefined, null] as const),
    ...STOREA_CASES,
  ];
  for (const [type, subtype, expected] of cases) {
    const { body, payload } = await storeaNotification(signer, {
      notificationType: type,
      subtype,
      bundleId: BUNDLE_ID,
      appAppleId: CREDENTIALS.appId,
      originalTransactionId: ORIGINAL_TRANSACTION_ID,
      productId: PRODUCT_ID,
    });
    assert.equal(payload.notificationType, type);
    const verified = await verifyStoreaNotification(jws, body.signedPayload, CREDENTIALS, POSTED);
    const entry = classifyStorea(verified.payload, verified.transaction);
    const label = `${type}${subtype ? ` (${subtype})` : ""}`;
    assert.notEqual(entry.event, "unknown", label);
    if (expected !== null) assert.equal(entry.event, expected, label);
    assert.equal(entry.platformEvent, `storea.${type.toLowerCase()}`);
    assert.equal(entry.reason, subtype?.toLowerCase() ?? null);
    const withoutTransaction = type === "TEST" || subtype === "SUMMARY";
    assert.equal(verified.transaction === null, withoutTransaction, label);
    if (!withoutTransaction) {
      assert.equal(verified.transaction!.originalTransactionId, ORIGINAL_TRANSACTION_ID);
      assert.equal(verified.transaction!.productId, PRODUCT_ID);
    }
  }
});

Deno.test("store A: a type's state is in its transaction and renewal info", async () => {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki);
  const jws = new StoreaJwsVerifier({ rootCertificates: [pki.rootDer] });
  const make = async (notificationType: string, subtype?: string) => {
    const { body } = await storeaNotification(signer, {
      notificationType,
      subtype,
      originalTransactionId: ORIGINAL_TRANSACTION_ID,
      productId: PRODUCT_ID,
    });
    return await verifyStoreaNotification(jws, body.signedPayload, {
      ...CREDENTIALS,
      bundleId: signer.bundleId,
      appId: null,
    }, POSTED);
  };
  const expired = await make("EXPIRED", "BILLING_RETRY");
  assert.ok((expired.transaction!.expiresDate as number) < Date.now());
  assert.equal(expired.renewal!.expirationIntent, 2);
  assert.equal(expired.renewal!.autoRenewStatus, 0);
  assert.equal((expired.payload.data as { status: number }).status, 2);
  const refund = await make("REFUND");
  assert.equal(typeof refund.transaction!.revocationDate, "number");
  const charge = await make("ONE_TIME_CHARGE");
  assert.equal(charge.transaction!.type, "Consumable");
  assert.equal(charge.renewal, null);
  assert.equal(
    classifyStorea(charge.payload, charge.transaction).subject?.type,
    "product",
  );
});

Deno.test("store B: every named kind is pushed with a token the service accepts", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const verifier = new PushTokenVerifier({
      certsUrl: issuer.certsUrl,
      issuers: [issuer.issuer],
    });
    const audience = "https://relay.example.com/v1/webhooks/storeb/tenant_01";
    const account = "pubsub-push@tests.iam.gserviceaccount.com";
    const named = namedNotificationTypes();
    const kinds: [StorebNotificationKind, string][] = [
      ...named.storebSubscription.map((n): [StorebNotificationKind, string] => [
        { kind: "subscription", notificationType: n },
        `storeb.subscription.${n}`,
      ]),
      ...named.storebOneTimeProduct.map((n): [StorebNotificationKind, string] => [
        { kind: "one_time_product", notificationType: n },
        `storeb.one_time_product.${n}`,
      ]),
      [{ kind: "voided_purchase", refundType: 2 }, "storeb.voided_purchase"],
      [{ kind: "test" }, "storeb.test"],
    ];
    for (const [kind, platformEvent] of kinds) {
      const push = await storebPush(issuer, {
        notification: kind,
        packageName: "com.example.tests",
        purchaseToken: "token-1",
        productId: "premium_yearly",
        audience,
        pushServiceAccount: account,
      });
      const claims = await verifier.verify(`Bearer ${push.token}`, {
        audience,
        serviceAccountEmail: account,
      });
      assert.equal(claims.aud, audience);
      const envelope = pushEnvelopeSchema.parse(push.body);
      const { notification } = decodeStorebNotification(envelope, "com.example.tests");
      const entry = classifyStoreb(notification);
      assert.equal(entry.platformEvent, platformEvent);
      assert.notEqual(entry.event, "unknown", platformEvent);
      if (kind.kind === "voided_purchase") assert.equal(entry.reason, "partial_refund");
      if (kind.kind === "subscription") assert.equal(entry.subject?.key, "token-1");
    }
  } finally {
    await issuer.close();
  }
});
