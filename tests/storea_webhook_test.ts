/**
 * `POST /v1/webhooks/storea/:tenantId` end to end: notifications signed by the test PKI go in over
 * HTTP, signed deliveries come out at a callback receiver that checks their signatures.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { databaseOf, startService, stopAndDrop } from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import {
  assertError,
  assertReceipt,
  assertSignedDelivery,
  cliOk,
  createTenantWithCallback,
  deliveryOf,
  deliveryReaches,
  eventually,
  postJson,
} from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner, type StoreaTransactionPayload } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

const BUNDLE_ID = "com.example.app";
const APP_ID = 1234567890;
const VECTORS = new URL("./fixtures/storea/real-sandbox/", import.meta.url);

/** Every row of the store A table of docs/events.md, and what its delivery must say. */
const CATALOG_ROWS: {
  type: string;
  subtype?: string;
  product?: StoreaTransactionPayload["type"];
  event: string;
  withSubject: boolean;
}[] = [
  {
    type: "SUBSCRIBED",
    subtype: "INITIAL_BUY",
    event: "subscription.purchased",
    withSubject: true,
  },
  {
    type: "SUBSCRIBED",
    subtype: "RESUBSCRIBE",
    event: "subscription.purchased",
    withSubject: true,
  },
  { type: "DID_RENEW", event: "subscription.renewed", withSubject: true },
  {
    type: "DID_RENEW",
    subtype: "BILLING_RECOVERY",
    event: "subscription.recovered",
    withSubject: true,
  },
  {
    type: "DID_FAIL_TO_RENEW",
    subtype: "GRACE_PERIOD",
    event: "subscription.in_grace_period",
    withSubject: true,
  },
  { type: "DID_FAIL_TO_RENEW", event: "subscription.on_hold", withSubject: true },
  {
    type: "GRACE_PERIOD_EXPIRED",
    event: "subscription.grace_period_expired",
    withSubject: true,
  },
  {
    type: "DID_CHANGE_RENEWAL_STATUS",
    subtype: "AUTO_RENEW_DISABLED",
    event: "subscription.canceled",
    withSubject: true,
  },
  {
    type: "DID_CHANGE_RENEWAL_STATUS",
    subtype: "AUTO_RENEW_ENABLED",
    event: "subscription.uncanceled",
    withSubject: true,
  },
  {
    type: "DID_CHANGE_RENEWAL_PREF",
    subtype: "DOWNGRADE",
    event: "subscription.product_changed",
    withSubject: true,
  },
  { type: "OFFER_REDEEMED", event: "subscription.offer_redeemed", withSubject: true },
  { type: "PRICE_INCREASE", event: "subscription.price_increase", withSubject: true },
  { type: "RENEWAL_EXTENDED", event: "subscription.extended", withSubject: true },
  { type: "RENEWAL_EXTENSION", event: "subscription.extension_summary", withSubject: true },
  { type: "EXPIRED", subtype: "VOLUNTARY", event: "subscription.expired", withSubject: true },
  { type: "REVOKE", event: "subscription.revoked", withSubject: true },
  { type: "REVOKE", product: "Non-Consumable", event: "product.revoked", withSubject: true },
  {
    type: "ONE_TIME_CHARGE",
    product: "Consumable",
    event: "product.purchased",
    withSubject: true,
  },
  { type: "REFUND", event: "refund.issued", withSubject: false },
  { type: "REFUND_DECLINED", event: "refund.declined", withSubject: false },
  { type: "REFUND_REVERSED", event: "refund.reversed", withSubject: false },
  { type: "CONSUMPTION_REQUEST", event: "refund.consumption_requested", withSubject: true },
  { type: "SOMETHING_NEW", subtype: "ODD", event: "unknown", withSubject: false },
];

Deno.test("store A notifications in, signed deliveries out", async (t) => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID, environment: "Production" });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s,1s",
      DELIVERY_TIMEOUT: "2s",
    },
  });
  const sql = databaseOf(service);
  const keyFile = await writeStoreaKeyFile(dir);
  const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([secret!]);
  await cliOk(service, ...storeaCredentialArgs(tenantId, keyFile), "--app-id", String(APP_ID));
  const endpoint = (id: string) => `${service.url}/v1/webhooks/storea/${id}`;
  const notify = async (
    options: Parameters<StoreaSigner["notificationPayload"]>[0],
    to = tenantId,
  ) => {
    const payload = await signer.notificationPayload({ appAppleId: APP_ID, ...options });
    const signedPayload = await signer.signNotification(payload);
    return { payload, answer: await postJson(endpoint(to), { signedPayload }) };
  };
  const transaction = (fields: Partial<StoreaTransactionPayload> = {}) =>
    signer.sampleTransaction({ originalTransactionId: "1000000000000001", ...fields });

  try {
    await t.step("a renewal is answered with a receipt and delivered, signed", async () => {
      const tx = transaction({ productId: "pro.monthly" });
      const { payload, answer } = await notify({
        notificationType: "DID_RENEW",
        transaction: tx,
        renewalInfo: signer.sampleRenewalInfo({}),
      });
      const eventId = assertReceipt(answer, {
        externalId: payload.notificationUUID,
        isNew: true,
        enqueuedDelivery: true,
      });
      const [delivery] = await receiver.waitFor(1);
      const body = assertSignedDelivery(delivery, { event: "subscription.renewed", eventId });
      assert.equal(body.reason, null);
      assert.equal(body.platformEvent, "storea.did_renew");
      assert.equal(body.externalId, payload.notificationUUID);
      assert.ok(Math.abs(Date.parse(body.timestamp) - Date.now()) < 30_000);
      assert.equal(new Date(body.timestamp).toISOString(), body.timestamp);
      assert.equal(body.tenantId, tenantId);
      assert.equal(body.source, "storea");
      assert.deepEqual(body.subject, {
        key: "1000000000000001",
        productId: "pro.monthly",
        type: "subscription",
      });
      // data and raw: the decoded signedPayload, unchanged (nested JWS strings included).
      assert.deepEqual(body.data, JSON.parse(JSON.stringify(payload)));
      assert.deepEqual(body.raw, body.data);
      assert.equal(body.data.version, "2.0");
      assert.equal(body.data.data.appAppleId, APP_ID);
      const row = await deliveryReaches(sql, eventId, "delivered");
      assert.equal(row.last_response_code, 200);
      assert.equal(row.last_response_body, '{"ok":true}');
    });

    await t.step("a duplicate answers with the first event id and sends nothing", async () => {
      const payload = await signer.notificationPayload({
        notificationType: "DID_RENEW",
        transaction: transaction(),
        appAppleId: APP_ID,
      });
      const signedPayload = await signer.signNotification(payload);
      const first = await postJson(endpoint(tenantId), { signedPayload });
      const eventId = assertReceipt(first, {
        externalId: payload.notificationUUID,
        isNew: true,
        enqueuedDelivery: true,
      });
      await receiver.waitFor(2);
      for (let i = 0; i < 3; i++) {
        const again = await postJson(endpoint(tenantId), { signedPayload });
        assert.equal(
          assertReceipt(again, {
            externalId: payload.notificationUUID,
            isNew: false,
            enqueuedDelivery: false,
          }),
          eventId,
        );
      }
      // A re-signed copy (Apple's retry) has the same UUID and is a duplicate too.
      const resigned = await postJson(endpoint(tenantId), {
        signedPayload: await signer.signNotification({ ...payload }),
      });
      assert.equal(resigned.json.eventId, eventId);
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.equal(receiver.deliveries.length, 2);
      const [{ count }] = await sql`
        SELECT count(*)::int AS count FROM events WHERE external_id = ${payload.notificationUUID}`;
      assert.equal(count, 1);
    });

    await t.step("every store A row of the catalog, delivered through HTTP", async () => {
      receiver.deliveries.length = 0;
      for (const row of CATALOG_ROWS) {
        const { answer } = await notify({
          notificationType: row.type,
          subtype: row.subtype,
          transaction: transaction({
            productId: "pro.item",
            type: row.product ?? "Auto-Renewable Subscription",
          }),
        });
        assert.equal(answer.status, 200, `${row.type}: ${JSON.stringify(answer.json)}`);
      }
      const deliveries = await receiver.waitFor(CATALOG_ROWS.length);
      for (const row of CATALOG_ROWS) {
        const found = deliveries.find((d) => {
          // deno-lint-ignore no-explicit-any
          const body = d.json as any;
          return body.data.notificationType === row.type && body.data.subtype === row.subtype &&
            (body.subject?.type ?? null) !==
              (row.product === "Non-Consumable" ? "subscription" : "");
        });
        assert.ok(found, `no delivery for ${row.type}/${row.subtype}`);
      }
      for (const delivery of deliveries) {
        // deno-lint-ignore no-explicit-any
        const body = delivery.json as any;
        const row = CATALOG_ROWS.find((r) =>
          r.type === body.data.notificationType && r.subtype === body.data.subtype &&
          (r.type !== "REVOKE" || (r.product === "Non-Consumable") ===
              (body.subject?.type === "product"))
        )!;
        assert.ok(row, `unexpected delivery ${body.platformEvent}`);
        assert.equal(body.event, row.event, row.type);
        assert.equal(delivery.headers["x-service-event"], row.event);
        assert.equal(body.platformEvent, `storea.${row.type.toLowerCase()}`);
        assert.equal(body.reason, row.subtype?.toLowerCase() ?? null);
        assert.equal(body.subject !== null, row.withSubject, row.type);
        if (row.withSubject) assert.equal(body.subject.key, "1000000000000001");
        assert.equal(delivery.signatureValid, true);
      }
    });

    await t.step("TEST has no transaction and no subject", async () => {
      receiver.deliveries.length = 0;
      const { answer } = await notify({ notificationType: "TEST" });
      assert.equal(answer.status, 200);
      const [delivery] = await receiver.waitFor(1);
      // deno-lint-ignore no-explicit-any
      const body = delivery.json as any;
      assert.equal(body.event, "test");
      assert.equal(body.platformEvent, "storea.test");
      assert.equal(body.subject, null);
    });

    await t.step("Sandbox and Production arrive on the same URL", async () => {
      const { answer } = await notify({
        notificationType: "DID_RENEW",
        environment: "Sandbox",
        transaction: transaction({ environment: "Sandbox" }),
        appAppleId: undefined,
      });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
    });

    await t.step("400 INVALID_REQUEST for a bad body", async () => {
      const url = endpoint(tenantId);
      assertError(await postJson(url, {}), 400, "INVALID_REQUEST");
      assertError(await postJson(url, { signedPayload: "" }), 400, "INVALID_REQUEST");
      assertError(await postJson(url, { signedPayload: 42 }), 400, "INVALID_REQUEST");
      assertError(await postJson(url, "{not json"), 400, "INVALID_REQUEST");
      assertError(await postJson(url, "[]"), 400, "INVALID_REQUEST");
      const empty = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
      });
      assertError(
        { status: empty.status, headers: empty.headers, json: await empty.json() },
        400,
        "INVALID_REQUEST",
      );
      const big = { signedPayload: "x".repeat(1024 * 1024 + 1) };
      const tooLarge = await postJson(url, big);
      assertError(tooLarge, 400, "INVALID_REQUEST");
      assert.match(tooLarge.json.message, /exceeds/);
      const wrongType = await fetch(url, {
        method: "POST",
        headers: { "content-type": "text/plain" },
        body: "{}",
      });
      assert.equal(wrongType.status, 400);
      await wrongType.body?.cancel();
      // The body is checked before the tenant.
      assertError(await postJson(endpoint("tenant_nope"), {}), 400, "INVALID_REQUEST");
    });

    await t.step("400 INVALID_REQUEST for a signed payload the database cannot hold", async () => {
      const url = endpoint(tenantId);
      const base = await signer.notificationPayload({
        notificationType: "DID_RENEW",
        transaction: transaction(),
        appAppleId: APP_ID,
      });
      const expectInvalid = async (signedPayload: string, pattern: RegExp) => {
        const answer = await postJson(url, { signedPayload });
        assertError(answer, 400, "INVALID_REQUEST");
        assert.match(answer.json.message, pattern);
      };
      // Text columns cannot hold U+0000: unchecked, the insert would fail with a 500.
      await expectInvalid(
        await signer.signNotification({ ...base, notificationUUID: "a\u0000b" }),
        /NUL/,
      );
      await expectInvalid(
        await signer.signNotification({ ...base, notificationType: "DID_\u0000RENEW" }),
        /NUL/,
      );
      await expectInvalid(
        await signer.signNotification({ ...base, notificationUUID: "\ud800" }),
        /unpaired surrogate/,
      );
      // Parsed fine, but serializing it again overflowed the stack: a 500.
      const deep = `{"deep":${"[".repeat(100_000)}${"]".repeat(100_000)},${
        JSON.stringify(base).slice(1)
      }`;
      await expectInvalid(await signer.signRaw(new TextEncoder().encode(deep)), /deeper/);
    });

    await t.step("404 TENANT_NOT_FOUND for an unknown or inactive tenant", async () => {
      const { payload: _, answer } = await notify(
        { notificationType: "TEST" },
        "tenant_01JAAAAAAAAAAAAAAAAAAAAAAA",
      );
      assertError(answer, 404, "TENANT_NOT_FOUND");
      assertError(
        (await notify({ notificationType: "TEST" }, "not-a-tenant")).answer,
        404,
        "TENANT_NOT_FOUND",
      );
      const other = await createTenantWithCallback(service, receiver.url);
      await cliOk(service, ...storeaCredentialArgs(other.tenantId, keyFile));
      await cliOk(service, "tenant", "deactivate", other.tenantId);
      assertError(
        (await notify({ notificationType: "TEST" }, other.tenantId)).answer,
        404,
        "TENANT_NOT_FOUND",
      );
      // Checked before the signature: a forged payload for an unknown tenant is still 404.
      assertError(
        await postJson(endpoint("tenant_01JAAAAAAAAAAAAAAAAAAAAAAA"), { signedPayload: "a.b.c" }),
        404,
        "TENANT_NOT_FOUND",
      );
    });

    await t.step("400 CREDENTIALS_MISSING before the signature is looked at", async () => {
      const bare = await createTenantWithCallback(service, receiver.url);
      assertError(
        (await notify({ notificationType: "TEST" }, bare.tenantId)).answer,
        400,
        "CREDENTIALS_MISSING",
      );
      assertError(
        await postJson(endpoint(bare.tenantId), { signedPayload: "a.b.c" }),
        400,
        "CREDENTIALS_MISSING",
      );
    });

    await t.step("401 SIGNATURE_INVALID for anything that does not verify", async () => {
      const url = endpoint(tenantId);
      const good = await signer.notificationPayload({
        notificationType: "DID_RENEW",
        transaction: transaction(),
        appAppleId: APP_ID,
      });
      const expectInvalid = async (signedPayload: string, pattern?: RegExp) => {
        const answer = await postJson(url, { signedPayload });
        assertError(answer, 401, "SIGNATURE_INVALID");
        if (pattern) assert.match(answer.json.message, pattern);
      };
      await expectInvalid("not-a-jws");
      await expectInvalid("a.b.c");
      // Signed by a PKI the service does not trust.
      const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
      await expectInvalid(await stranger.signNotification(good));
      // Tampered after signing.
      const signed = await signer.signNotification(good);
      const [h, p, s] = signed.split(".");
      const tampered = JSON.parse(new TextDecoder().decode(Uint8Array.fromBase64(p, {
        alphabet: "base64url",
      })));
      tampered.notificationType = "REFUND";
      const forged = new TextEncoder().encode(JSON.stringify(tampered)).toBase64({
        alphabet: "base64url",
        omitPadding: true,
      });
      await expectInvalid(`${h}.${forged}.${s}`);
      // Not ES256, or a chain of two.
      await expectInvalid(await signer.signRaw(good, { alg: "ES384" }));
      await expectInvalid(await signer.signRaw(good, { x5c: pki.x5c.slice(0, 2) }));
      // A nested transaction signed by an untrusted PKI.
      await expectInvalid(
        await signer.signNotification(
          await signer.notificationPayload({
            notificationType: "DID_RENEW",
            signedTransactionInfo: await stranger.signTransaction(transaction()),
            appAppleId: APP_ID,
          }),
        ),
        /signedTransactionInfo/,
      );
      await expectInvalid(
        await signer.signNotification(
          await signer.notificationPayload({
            notificationType: "DID_RENEW",
            transaction: transaction(),
            signedRenewalInfo: "x.y.z",
            appAppleId: APP_ID,
          }),
        ),
        /signedRenewalInfo/,
      );
      // Another app's notification, by bundle id or (in Production) by app id.
      await expectInvalid(
        await signer.signNotification(
          await signer.notificationPayload({
            notificationType: "DID_RENEW",
            bundleId: "com.other.app",
            transaction: transaction({ bundleId: "com.other.app" }),
            appAppleId: APP_ID,
          }),
        ),
        /bundle id/,
      );
      // The tenant's bundle id outside, another app's transaction inside, each properly signed:
      // the transaction is what the delivery describes, so it must be the tenant's too.
      const spliced = await signer.notificationPayload({
        notificationType: "DID_RENEW",
        bundleId: BUNDLE_ID,
        transaction: transaction({ bundleId: "com.other.app" }),
        appAppleId: APP_ID,
      });
      assert.equal(spliced.data.bundleId, BUNDLE_ID);
      await expectInvalid(await signer.signNotification(spliced), /transaction.*bundle id/);
      await expectInvalid(
        await signer.signNotification(
          await signer.notificationPayload({
            notificationType: "DID_RENEW",
            transaction: transaction(),
            appAppleId: 999,
          }),
        ),
        /app id/,
      );
      const [{ count }] = await sql`
        SELECT count(*)::int AS count FROM events
        WHERE external_id IN (${good.notificationUUID}, ${spliced.notificationUUID})`;
      assert.equal(count, 0);
    });

    await t.step("no callback URL: the event is kept and sent after deliveries retry", async () => {
      const waiting = await createTenantWithCallback(service, null);
      await cliOk(service, ...storeaCredentialArgs(waiting.tenantId, keyFile));
      const { payload, answer } = await notify({
        notificationType: "DID_RENEW",
        transaction: transaction(),
      }, waiting.tenantId);
      const eventId = assertReceipt(answer, {
        externalId: payload.notificationUUID,
        isNew: true,
        enqueuedDelivery: false,
      });
      const row = await deliveryOf(sql, eventId);
      assert.equal(row.status, "failed");
      assert.match(row.last_error, /no callback URL/);

      const set = await cliOk(
        service,
        "tenant",
        "set-callback",
        waiting.tenantId,
        "--url",
        receiver.url,
      );
      receiver.setSecrets([secret!, set.webhookSecret]);
      const retried = await cliOk(
        service,
        "deliveries",
        "retry",
        "--tenant",
        waiting.tenantId,
        "--status",
        "failed",
      );
      assert.deepEqual(retried.queued, [row.id]);
      // Wait for this event's delivery: a retry of an earlier step's event may land first.
      const late = await eventually(
        // deno-lint-ignore no-explicit-any
        () => receiver.deliveries.find((d) => (d.json as any)?.eventId === eventId),
        10_000,
        "the retried delivery",
      );
      assert.equal(late.signatureValid, true);
    });

    await t.step(
      "500 INTERNAL_ERROR when the event cannot be stored; the retry is accepted",
      async () => {
        const signedPayload = await signer.signNotification(
          await signer.notificationPayload({
            notificationType: "DID_RENEW",
            transaction: transaction(),
            appAppleId: APP_ID,
          }),
        );
        await sql`ALTER TABLE events RENAME TO events_away`;
        try {
          assertError(await postJson(endpoint(tenantId), { signedPayload }), 500, "INTERNAL_ERROR");
        } finally {
          await sql`ALTER TABLE events_away RENAME TO events`;
        }
        const retry = await postJson(endpoint(tenantId), { signedPayload });
        assert.equal(retry.status, 200);
        assert.equal(retry.json.isNew, true);
      },
    );

    await t.step("logs never carry the signed payload", () => {
      const raw = service.rawStdout();
      assert.ok(!raw.includes(pki.x5c[0].slice(0, 40)), "a certificate of the x5c was logged");
      assert.ok(raw.includes('"msg":"notification_received"'));
    });
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "the 14 real Apple notifications are accepted with the built-in trust and mapped",
  async fn() {
    const index = JSON.parse(await Deno.readTextFile(new URL("index.json", VECTORS)));
    const receiver = await startCallbackReceiver();
    // Apple signed them in October 2025: accepted only with an age limit that reaches back that
    // far (tests/adversarial/storea_replay_test.ts refuses them with the default one).
    const service = await startService({ env: { STOREA_NOTIFICATION_MAX_AGE: "36500d" } });
    const dir = await Deno.makeTempDir();
    try {
      const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
      receiver.setSecrets([secret!]);
      const args = storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir));
      args[args.indexOf("--bundle-id") + 1] = index[0].bundleId;
      await cliOk(service, ...args, "--app-id", String(index[0].appAppleId));
      for (const entry of index) {
        const signedPayload = (await Deno.readTextFile(new URL(entry.file, VECTORS))).trim();
        const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
          signedPayload,
        });
        assertReceipt(answer, {
          externalId: entry.notificationUUID,
          isNew: true,
          enqueuedDelivery: true,
        });
      }
      const deliveries = await receiver.waitFor(index.length);
      for (const entry of index) {
        // deno-lint-ignore no-explicit-any
        const body = deliveries.map((d) => d.json as any).find((b) =>
          b.externalId === entry.notificationUUID
        );
        assert.ok(body, entry.file);
        assert.equal(body.platformEvent, `storea.${entry.notificationType.toLowerCase()}`);
        assert.equal(body.reason, entry.subtype?.toLowerCase() ?? null);
        assert.equal(body.data.data.environment, "Sandbox");
        assert.equal(body.event, REAL_EVENTS[entry.notificationType], entry.file);
        if (entry.notificationType === "REFUND") {
          assert.equal(body.subject, null);
        } else {
          assert.deepEqual(body.subject, {
            key: entry.originalTransactionId,
            productId: entry.productId,
            type: "subscription",
          });
        }
      }
      assert.ok(deliveries.every((d) => d.signatureValid));
    } finally {
      await stopAndDrop(service);
      await receiver.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/** The unified events the real notifications map to (docs/events.md). */
const REAL_EVENTS: Record<string, string> = {
  DID_RENEW: "subscription.renewed",
  SUBSCRIBED: "subscription.purchased",
  DID_CHANGE_RENEWAL_STATUS: "subscription.canceled", // all AUTO_RENEW_DISABLED
  EXPIRED: "subscription.expired",
  DID_CHANGE_RENEWAL_PREF: "subscription.product_changed",
  CONSUMPTION_REQUEST: "refund.consumption_requested",
  REFUND: "refund.issued",
};
