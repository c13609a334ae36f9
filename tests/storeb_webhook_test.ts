/**
 * `POST /v1/webhooks/storeb/:tenantId` end to end: push envelopes carrying tokens minted by a fake
 * Google OIDC issuer go in over HTTP, signed deliveries come out at a callback receiver that checks
 * their signatures.
 */
import assert from "node:assert/strict";
import { databaseOf, startService, stopAndDrop } from "./helpers/service.ts";
import { STOREB_SUBSCRIPTION_EVENTS } from "./helpers/catalog.ts";
import { storebCredentialArgs, writeServiceAccountFile } from "./helpers/fixtures.ts";
import {
  assertError,
  assertReceipt,
  assertSignedDelivery,
  cliOk,
  createTenantWithCallback,
  deliveryReaches,
  eventually,
  type JsonAnswer,
  postJson,
} from "./helpers/relay.ts";
import {
  oneTimeProductNotification,
  pushEnvelope,
  type PushTokenClaimsInput,
  startPushTokenIssuer,
  subscriptionNotification,
  testNotification,
  voidedPurchaseNotification,
} from "../simulators/storeb_push.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

const PACKAGE_NAME = "com.example.app";
/** The push audience of storebCredentialArgs. */
const AUDIENCE = "https://relay.example.com/push";
const PUSH_ACCOUNT = "push@example-project.iam.gserviceaccount.com";
/** The verifier's default refetch cooldown (src/storeb/push_token.ts). */
const JWKS_COOLDOWN_MS = 30_000;

/** One store B row of docs/events.md and what its delivery must say. */
interface CatalogCase {
  name: string;
  notification: Record<string, unknown>;
  event: string;
  platformEvent: string;
  reason: string | null;
  subject: { key: string; productId: string | null; type: string } | null;
}

/** Purchase tokens put in notifications; none may ever reach the logs. */
const purchaseTokens: string[] = [];

function purchaseToken(label: string): string {
  const token = `ptok-${label}-${crypto.randomUUID()}`;
  purchaseTokens.push(token);
  return token;
}

/** The subscription types of docs/events.md (Google's numbering) and an unknown one. */
const SUBSCRIPTION_EVENTS: (readonly [number, string])[] = [
  ...STOREB_SUBSCRIPTION_EVENTS,
  [99, "unknown"],
];

function catalogCases(): CatalogCase[] {
  const cases: CatalogCase[] = SUBSCRIPTION_EVENTS.map(([type, event]) => {
    const key = purchaseToken(`sub${type}`);
    return {
      name: `subscription ${type}`,
      notification: subscriptionNotification(PACKAGE_NAME, {
        notificationType: type,
        purchaseToken: key,
        subscriptionId: "pro.monthly",
      }),
      event,
      platformEvent: `storeb.subscription.${type}`,
      reason: null,
      // Unknown notifications carry no subject.
      subject: event === "unknown" ? null : { key, productId: "pro.monthly", type: "subscription" },
    };
  });
  // Google leaves subscriptionId out for newer integrations: productId is then null.
  const bare = purchaseToken("sub4-bare");
  cases.push({
    name: "subscription 4 without subscriptionId",
    notification: subscriptionNotification(PACKAGE_NAME, {
      notificationType: 4,
      purchaseToken: bare,
    }),
    event: "subscription.purchased",
    platformEvent: "storeb.subscription.4",
    reason: null,
    subject: { key: bare, productId: null, type: "subscription" },
  });
  for (const [type, event] of [[1, "product.purchased"], [2, "product.canceled"]] as const) {
    const key = purchaseToken(`otp${type}`);
    cases.push({
      name: `one-time product ${type}`,
      notification: oneTimeProductNotification(PACKAGE_NAME, {
        notificationType: type,
        purchaseToken: key,
        sku: "coins.100",
      }),
      event,
      platformEvent: `storeb.one_time_product.${type}`,
      reason: null,
      subject: { key, productId: "coins.100", type: "product" },
    });
  }
  for (const [refundType, reason] of [[1, "full_refund"], [2, "partial_refund"]] as const) {
    cases.push({
      name: `voided purchase, refundType ${refundType}`,
      notification: voidedPurchaseNotification(PACKAGE_NAME, {
        purchaseToken: purchaseToken(`voided${refundType}`),
        orderId: `GPA.1234-5678-9012-3456${refundType}`,
        productType: 2,
        refundType,
      }),
      event: "refund.issued",
      platformEvent: "storeb.voided_purchase",
      reason,
      subject: null,
    });
  }
  cases.push({
    name: "test notification",
    notification: testNotification(PACKAGE_NAME),
    event: "test",
    platformEvent: "storeb.test",
    reason: null,
    subject: null,
  });
  cases.push({
    name: "none of the four objects",
    notification: { version: "1.0", packageName: PACKAGE_NAME, eventTimeMillis: "1" },
    event: "unknown",
    platformEvent: "storeb.unknown",
    reason: null,
    subject: null,
  });
  return cases;
}

Deno.test("store B push notifications in, signed deliveries out", async (t) => {
  const dir = await Deno.makeTempDir();
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...issuer.serviceEnv,
      DELIVERY_RETRY_SCHEDULE: "1s,1s",
      DELIVERY_TIMEOUT: "2s",
    },
  });
  const sql = databaseOf(service);
  const { path: accountFile } = await writeServiceAccountFile(dir);
  const credentialArgs = (tenantId: string) =>
    storebCredentialArgs(tenantId, accountFile, PUSH_ACCOUNT);
  const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([secret!]);
  await cliOk(service, ...credentialArgs(tenantId));

  /** Every token minted; none may ever reach the logs. */
  const minted: string[] = [];
  const mint = async (claims: Partial<PushTokenClaimsInput> = {}) => {
    const token = await issuer.mint({ audience: AUDIENCE, email: PUSH_ACCOUNT, ...claims });
    minted.push(token);
    return token;
  };
  const endpoint = (id: string) => `${service.url}/v1/webhooks/storeb/${id}`;
  const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
  /** POSTs `body` with a fresh valid token unless `authorization` is given (null: none). */
  const push = async (
    body: unknown,
    options: { to?: string; authorization?: string | null } = {},
  ): Promise<JsonAnswer> => {
    const authorization = options.authorization === undefined
      ? `Bearer ${await mint()}`
      : options.authorization;
    return await postJson(
      endpoint(options.to ?? tenantId),
      body,
      authorization === null ? {} : { authorization },
    );
  };
  const renewal = () =>
    subscriptionNotification(PACKAGE_NAME, {
      notificationType: 2,
      purchaseToken: purchaseToken("renewal"),
      subscriptionId: "pro.monthly",
    });
  const eventCount = async (externalId: string) => {
    const [{ count }] = await sql`
      SELECT count(*)::int AS count FROM events
      WHERE tenant_id = ${tenantId} AND external_id = ${externalId}`;
    return count;
  };

  try {
    await t.step("a renewal is answered with a receipt and delivered, signed", async () => {
      const token = purchaseToken("first");
      const notification = subscriptionNotification(PACKAGE_NAME, {
        notificationType: 2,
        purchaseToken: token,
        subscriptionId: "pro.monthly",
      });
      const envelope = pushEnvelope(notification);
      const eventId = assertReceipt(await push(envelope), {
        externalId: envelope.message.messageId,
        isNew: true,
        enqueuedDelivery: true,
      });
      const [delivery] = await receiver.waitFor(1);
      const body = assertSignedDelivery(delivery, { event: "subscription.renewed", eventId });
      assert.equal(body.reason, null);
      assert.equal(body.platformEvent, "storeb.subscription.2");
      assert.equal(body.externalId, envelope.message.messageId);
      assert.ok(Math.abs(Date.parse(body.timestamp) - Date.now()) < 30_000);
      assert.equal(new Date(body.timestamp).toISOString(), body.timestamp);
      assert.equal(body.tenantId, tenantId);
      assert.equal(body.source, "storeb");
      assert.deepEqual(body.subject, {
        key: token,
        productId: "pro.monthly",
        type: "subscription",
      });
      // data: the decoded developer notification, unchanged.
      assert.deepEqual(body.data, notification);
      // raw: the push envelope exactly as posted.
      assert.deepEqual(body.raw, envelope);
      const row = await deliveryReaches(sql, eventId, "delivered");
      assert.equal(row.last_response_code, 200);
      assert.equal(row.last_response_body, '{"ok":true}');
    });

    await t.step("raw is the push envelope exactly as posted, unknown fields too", async () => {
      receiver.deliveries.length = 0;
      const envelope = { ...pushEnvelope(renewal()), deliveryAttempt: 1 };
      const answer = await push(envelope);
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      const [delivery] = await receiver.waitFor(1);
      // deno-lint-ignore no-explicit-any
      assert.deepEqual((delivery.json as any).raw, envelope);
    });

    await t.step(
      "a duplicate messageId answers with the first event id, sends nothing",
      async () => {
        receiver.deliveries.length = 0;
        const envelope = pushEnvelope(renewal());
        const messageId = envelope.message.messageId;
        const eventId = assertReceipt(await push(envelope), {
          externalId: messageId,
          isNew: true,
          enqueuedDelivery: true,
        });
        await receiver.waitFor(1);
        for (let i = 0; i < 3; i++) {
          // Pub/Sub's redelivery: a fresh token, the same message.
          const again = await push(envelope);
          assert.equal(
            assertReceipt(again, { externalId: messageId, isNew: false, enqueuedDelivery: false }),
            eventId,
          );
        }
        // The message id alone decides: another notification under the same id is a duplicate.
        const other = await push(pushEnvelope(renewal(), { messageId }));
        assert.equal(
          assertReceipt(other, { externalId: messageId, isNew: false, enqueuedDelivery: false }),
          eventId,
        );
        await new Promise((resolve) => setTimeout(resolve, 500));
        assert.equal(receiver.deliveries.length, 1);
        assert.equal(await eventCount(messageId), 1);
        const [{ count }] = await sql`
        SELECT count(*)::int AS count FROM deliveries WHERE event_id = ${eventId}`;
        assert.equal(count, 1);
      },
    );

    await t.step("every store B row of the catalog, delivered through HTTP", async () => {
      receiver.deliveries.length = 0;
      const cases = catalogCases();
      const byMessageId = new Map<string, CatalogCase>();
      for (const row of cases) {
        const envelope = pushEnvelope(row.notification);
        byMessageId.set(envelope.message.messageId, row);
        assertReceipt(await push(envelope), {
          externalId: envelope.message.messageId,
          isNew: true,
          enqueuedDelivery: true,
        });
      }
      const deliveries = await receiver.waitFor(cases.length);
      assert.equal(deliveries.length, cases.length);
      const seen = new Set<string>();
      for (const delivery of deliveries) {
        // deno-lint-ignore no-explicit-any
        const body = delivery.json as any;
        const row = byMessageId.get(body.externalId);
        assert.ok(row, `unexpected delivery ${body.externalId}`);
        seen.add(row.name);
        assert.equal(body.event, row.event, row.name);
        assert.equal(delivery.headers["x-service-event"], row.event, row.name);
        assert.equal(body.platformEvent, row.platformEvent, row.name);
        assert.equal(body.reason, row.reason, row.name);
        assert.deepEqual(body.subject, row.subject, row.name);
        assert.equal(body.source, "storeb");
        assert.deepEqual(body.data, row.notification, row.name);
        assert.equal(delivery.signatureValid, true, row.name);
      }
      assert.equal(seen.size, cases.length);
      // Google's keys were fetched once for all of these tokens.
      assert.equal(issuer.certsRequests, 1);
    });

    await t.step("message_id alone is accepted as the message id", async () => {
      const envelope = pushEnvelope(renewal());
      const { messageId: _, ...message } = envelope.message;
      assertReceipt(await push({ ...envelope, message }), {
        externalId: envelope.message.message_id,
        isNew: true,
        enqueuedDelivery: true,
      });
    });

    await t.step("401 UNAUTHENTICATED: unknown tenant, or a token that is not valid", async () => {
      const envelope = pushEnvelope(renewal());
      const unknown = "tenant_01JAAAAAAAAAAAAAAAAAAAAAAA";
      // An unknown tenant gives 401 even with a valid token (no enumeration).
      const unknownAnswer = await push(envelope, { to: unknown });
      assertError(unknownAnswer, 401, "UNAUTHENTICATED");
      assertError(await push(envelope, { to: "not-a-tenant" }), 401, "UNAUTHENTICATED");
      // The token comes first: a bad body for an unknown tenant is still 401.
      assertError(await push("{not json", { to: unknown }), 401, "UNAUTHENTICATED");

      const missing = await push(envelope, { authorization: null });
      assertError(missing, 401, "UNAUTHENTICATED");
      // Same wording for an unknown tenant and a known one, so ids cannot be probed.
      assert.equal(missing.json.message, unknownAnswer.json.message);
      assert.deepEqual(Object.keys(missing.json).sort(), Object.keys(unknownAnswer.json).sort());

      const refused: [string, string][] = [
        ["Basic", "Basic x"],
        ["empty bearer", "Bearer "],
        ["garbage", "Bearer garbage"],
        ["three garbage parts", "Bearer a.b.c"],
        [
          "expired",
          `Bearer ${await mint({
            issuedAt: Math.floor(Date.now() / 1000) - 7200,
            expiresInSeconds: 3600,
          })}`,
        ],
        ["wrong issuer", `Bearer ${await mint({ issuer: "https://issuer.example.com" })}`],
        ["email_verified false", `Bearer ${await mint({ emailVerified: false })}`],
        ["no email_verified", `Bearer ${await mint({ omit: ["email_verified"] })}`],
        ["no exp", `Bearer ${await mint({ omit: ["exp"] })}`],
      ];
      for (const [what, authorization] of refused) {
        const answer = await push(envelope, { authorization });
        assert.equal(answer.status, 401, `${what}: ${JSON.stringify(answer.json)}`);
        assertError(answer, 401, "UNAUTHENTICATED");
        assert.equal(answer.json.message, unknownAnswer.json.message, what);
      }
      // A bad body does not change the answer: the token is checked first.
      assertError(await push("", { authorization: "Bearer garbage" }), 401, "UNAUTHENTICATED");

      // A tenant without store B credentials has no audience to check a token against.
      const bare = await createTenantWithCallback(service, receiver.url);
      assertError(await push(envelope, { to: bare.tenantId }), 401, "UNAUTHENTICATED");
      assert.equal(await eventCount(envelope.message.messageId), 0);
    });

    await t.step(
      "401 SIGNATURE_INVALID: bad signature, unknown key, audience, account",
      async () => {
        const envelope = pushEnvelope(renewal());
        const refused: [string, Partial<PushTokenClaimsInput>][] = [
          ["wrong key", { wrongKey: true }],
          ["unknown key", { unknownKey: true }],
          ["other audience", { audience: "https://relay.example.com/other" }],
          ["other account", { email: "someone@other-project.iam.gserviceaccount.com" }],
        ];
        for (const [what, claims] of refused) {
          const answer = await push(envelope, { authorization: `Bearer ${await mint(claims)}` });
          assert.equal(answer.status, 401, `${what}: ${JSON.stringify(answer.json)}`);
          assertError(answer, 401, "SIGNATURE_INVALID");
        }
        assert.equal(await eventCount(envelope.message.messageId), 0);
        // The account is compared case-insensitively, as email addresses are.
        const upper = await mint({ email: PUSH_ACCOUNT.toUpperCase() });
        assert.equal((await push(envelope, { authorization: `Bearer ${upper}` })).status, 200);
      },
    );

    await t.step("404 TENANT_NOT_FOUND for an inactive tenant, after the token", async () => {
      const inactive = await createTenantWithCallback(service, receiver.url);
      await cliOk(service, ...credentialArgs(inactive.tenantId));
      await cliOk(service, "tenant", "deactivate", inactive.tenantId);
      const envelope = pushEnvelope(renewal());
      assertError(await push(envelope, { to: inactive.tenantId }), 404, "TENANT_NOT_FOUND");
      // An invalid token is refused before the tenant's state is told.
      assertError(
        await push(envelope, { to: inactive.tenantId, authorization: "Bearer garbage" }),
        401,
        "UNAUTHENTICATED",
      );
      assertError(
        await push(envelope, { to: inactive.tenantId, authorization: null }),
        401,
        "UNAUTHENTICATED",
      );
      assertError(
        await push(envelope, {
          to: inactive.tenantId,
          authorization: `Bearer ${await mint({ wrongKey: true })}`,
        }),
        401,
        "SIGNATURE_INVALID",
      );
    });

    await t.step("400 INVALID_REQUEST for a bad envelope, after a valid token", async () => {
      const encode = (value: unknown) => new TextEncoder().encode(JSON.stringify(value)).toBase64();
      const withData = (data: string) => {
        const envelope = pushEnvelope(renewal());
        return { ...envelope, message: { ...envelope.message, data } };
      };
      const expectInvalid = async (body: unknown, what: string, pattern?: RegExp) => {
        const answer = await push(body);
        assert.equal(answer.status, 400, `${what}: ${JSON.stringify(answer.json)}`);
        assertError(answer, 400, "INVALID_REQUEST");
        if (pattern) assert.match(answer.json.message, pattern, what);
      };
      const empty = await fetch(endpoint(tenantId), {
        method: "POST",
        headers: { "content-type": "application/json", ...bearer(await mint()) },
      });
      assertError(
        { status: empty.status, headers: empty.headers, json: await empty.json() },
        400,
        "INVALID_REQUEST",
      );
      await expectInvalid("{not json", "non-JSON");
      await expectInvalid("[]", "an array body");
      await expectInvalid({}, "{}");
      await expectInvalid({ message: {} }, "an empty message");
      const { data: _data, ...withoutData } = pushEnvelope(renewal()).message;
      await expectInvalid({ message: withoutData }, "message without data");
      const { messageId: _id, message_id: _id2, ...withoutId } = pushEnvelope(renewal()).message;
      await expectInvalid({ message: withoutId }, "message without messageId", /messageId/);
      await expectInvalid(withData(""), "empty data");
      await expectInvalid(withData("not base64 at all!"), "data not base64");
      await expectInvalid(withData(btoa("not json")), "data base64 but not JSON");
      await expectInvalid(withData(encode([renewal()])), "data JSON but an array");
      await expectInvalid(withData(encode("a string")), "data JSON but a string");
      const { packageName: _p, ...noPackage } = renewal();
      await expectInvalid(withData(encode(noPackage)), "no packageName", /packageName/);
      await expectInvalid(
        withData(encode({ ...renewal(), packageName: "com.other.app" })),
        "another app's packageName",
        /packageName/,
      );
      // The message id is a text column, which cannot hold U+0000: unchecked, the insert fails.
      const nul = pushEnvelope(renewal(), { messageId: "1\u00002" });
      await expectInvalid(nul, "a NUL in the message id", /NUL/);
      // A voided purchase is known by its order id, stored in the same column: the same rules.
      const voided = (orderId: string) =>
        pushEnvelope(voidedPurchaseNotification(PACKAGE_NAME, {
          purchaseToken: purchaseToken("voided-odd-order"),
          orderId,
          productType: 2,
          refundType: 1,
        }));
      await expectInvalid(voided("GPA.1\u00002"), "a NUL in the order id", /NUL/);
      await expectInvalid(voided("GPA.1\ud8002"), "a lone surrogate in the order id", /surrogate/);
      // Deep JSON parsed fine, but serializing it again overflowed the stack: a 500.
      const deep = `${"[".repeat(100_000)}${"]".repeat(100_000)}`;
      const deepEnvelope = `{"deep":${deep},${JSON.stringify(pushEnvelope(renewal())).slice(1)}`;
      await expectInvalid(deepEnvelope, "a deeply nested envelope", /deeper/);
      const deepNotification = `{"deep":${deep},${JSON.stringify(renewal()).slice(1)}`;
      await expectInvalid(
        withData(new TextEncoder().encode(deepNotification).toBase64()),
        "a deeply nested notification",
        /deeper/,
      );
      const tooLarge = await push(withData("A".repeat(1024 * 1024 + 4)));
      assertError(tooLarge, 400, "INVALID_REQUEST");
      assert.match(tooLarge.json.message, /exceeds/);
      const wrongType = await fetch(endpoint(tenantId), {
        method: "POST",
        headers: { "content-type": "text/plain", ...bearer(await mint()) },
        body: JSON.stringify(pushEnvelope(renewal())),
      });
      assert.equal(wrongType.status, 400);
      await wrongType.body?.cancel();
    });

    await t.step("after a key rotation, a token with the new key is accepted", async () => {
      // The verifier refetches for an unknown kid at most once per 30 s cooldown after its last
      // fetch (made by the first step); the wait overlaps with the steps above.
      const before = issuer.certsRequests;
      const oldToken = await mint();
      await issuer.rotateKeys();
      const rotatedAt = Date.now();
      const envelope = pushEnvelope(renewal());
      const answer = await eventually(
        async () => {
          const attempt = await push(envelope);
          if (attempt.status === 200) return attempt;
          // Until the refetch, the new kid is unknown: refused, not a 500.
          assertError(attempt, 401, "SIGNATURE_INVALID");
          await new Promise((resolve) => setTimeout(resolve, 250));
          return undefined;
        },
        JWKS_COOLDOWN_MS + 5_000,
        "acceptance of a token signed with the rotated key",
      );
      assertReceipt(answer, {
        externalId: envelope.message.messageId,
        isNew: true,
        enqueuedDelivery: true,
      });
      assert.ok(Date.now() - rotatedAt < JWKS_COOLDOWN_MS + 5_000);
      // One fetch for the rotation, however many refused tokens came before it.
      assert.equal(issuer.certsRequests, before + 1);
      // The new JWKS publishes only the new key: the old one is no longer trusted.
      assertError(
        await push(pushEnvelope(renewal()), { authorization: `Bearer ${oldToken}` }),
        401,
        "SIGNATURE_INVALID",
      );
    });

    await t.step(
      "500 INTERNAL_ERROR when the event cannot be stored; the retry is accepted",
      async () => {
        const envelope = pushEnvelope(renewal());
        await sql`ALTER TABLE events RENAME TO events_away`;
        try {
          assertError(await push(envelope), 500, "INTERNAL_ERROR");
        } finally {
          await sql`ALTER TABLE events_away RENAME TO events`;
        }
        // Pub/Sub redelivers on a non-2xx: nothing was acknowledged, so nothing is lost.
        const retry = await push(envelope);
        assert.equal(retry.status, 200);
        assert.equal(retry.json.isNew, true);
      },
    );

    await t.step("logs never carry a push token nor a purchase token", () => {
      const raw = service.rawStdout();
      assert.ok(raw.includes('"msg":"notification_received"'));
      assert.ok(minted.length > 20);
      for (const token of minted) {
        assert.ok(!raw.includes(token), "a push token was logged");
        assert.ok(!raw.includes(token.split(".")[2]), "a push token's signature was logged");
      }
      assert.ok(purchaseTokens.length > 20);
      for (const token of purchaseTokens) {
        assert.ok(!raw.includes(token), `a purchase token was logged: ${token}`);
      }
    });
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await receiver.close();
    await issuer.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("store B: 500 INTERNAL_ERROR while the issuer's keys cannot be fetched", async () => {
  const dir = await Deno.makeTempDir();
  const issuer = await startPushTokenIssuer();
  const service = await startService({
    // Nothing listens on port 9 (discard): the keys cannot be fetched, and none are cached.
    env: { STOREB_OIDC_CERTS_URL: "http://127.0.0.1:9/oauth2/v3/certs" },
  });
  try {
    const { tenantId } = await createTenantWithCallback(service, null);
    const { path } = await writeServiceAccountFile(dir);
    await cliOk(service, ...storebCredentialArgs(tenantId, path));
    const token = await issuer.mint({ audience: AUDIENCE, email: PUSH_ACCOUNT });
    const answer = await postJson(
      `${service.url}/v1/webhooks/storeb/${tenantId}`,
      pushEnvelope(testNotification(PACKAGE_NAME)),
      { authorization: `Bearer ${token}` },
    );
    // Not a 401: the token may be fine, and Pub/Sub retries a 5xx.
    assertError(answer, 500, "INTERNAL_ERROR");
  } finally {
    await stopAndDrop(service);
    await issuer.close();
    await Deno.remove(dir, { recursive: true });
  }
});
