/**
 * `occurredAt` and `state` on every delivery (docs/deliveries.md, "State on every delivery"): store
 * A's from the notification itself, equal to what verify answers; store B's fetched from Google
 * Play with the tenant's credentials before the first attempt, equal to what verify answers, kept
 * for every retry, and replaced by `stateError` when it cannot be had (the delivery goes anyway).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type RunningService, startService, stopAndDrop } from "./helpers/service.ts";
import { storeaCredentialArgs, storebCredentialArgs } from "./helpers/fixtures.ts";
import {
  assertSignedDelivery,
  cliOk,
  createTenantWithCallback,
  postJson,
} from "./helpers/relay.ts";
import { createServiceAccount } from "../simulators/service_account.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
} from "../simulators/storeb_play.ts";
import {
  oneTimeProductNotification,
  pushEnvelope,
  startPushTokenIssuer,
  subscriptionNotification,
  testNotification,
} from "../simulators/storeb_push.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

const PACKAGE = "com.example.app";
const AUDIENCE = "https://relay.example.com/push";
const PUSH_ACCOUNT = "push@example-project.iam.gserviceaccount.com";

async function apiKeyOf(service: RunningService, tenantId: string): Promise<string> {
  return (await cliOk(service, "key", "create", tenantId)).key;
}

async function callApi(service: RunningService, key: string, path: string, body: unknown) {
  const response = await fetch(`${service.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return await response.json();
}

Deno.test("state: a store A delivery carries the notification's purchase, as verify answers it", async () => {
  const dir = await Deno.makeTempDir();
  const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir);
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...api.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
    },
  });
  try {
    const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
    receiver.setSecrets([secret!]);
    await cliOk(service, ...storeaCredentialArgs(tenantId, keyFile));
    const key = await apiKeyOf(service, tenantId);
    const transaction = signer.sampleTransaction({ transactionId: "2000000000000301" });
    const signedTransactionInfo = await api.addTransaction("production", transaction);
    const signedDate = Date.now() - 5_000;
    const payload = await signer.notificationPayload({
      notificationType: "DID_RENEW",
      signedTransactionInfo,
      renewalInfo: signer.sampleRenewalInfo({
        originalTransactionId: transaction.originalTransactionId,
      }),
      signedDate,
      status: 1,
    });
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;
    const answer = await postJson(url, { signedPayload: await signer.signNotification(payload) });
    assert.equal(answer.status, 200, JSON.stringify(answer.json));
    const [delivery] = await receiver.waitFor(1);
    const body = assertSignedDelivery(delivery, {
      event: "subscription.renewed",
      eventId: answer.json.eventId,
    });
    assert.equal(body.occurredAt, new Date(signedDate).toISOString());
    const verified = await callApi(service, key, "/v1/storea/verify", {
      transactionId: "2000000000000301",
    });
    assert.equal(verified.valid, true);
    assert.deepEqual(body.state.transaction, verified.transaction);
    assert.equal(body.state.status, 1);
    const renewal = body.state.renewal;
    assert.equal(renewal.signedRenewalInfo, payload.data.signedRenewalInfo);
    assert.equal(renewal.originalTransactionId, transaction.originalTransactionId);
    assert.equal(typeof renewal.renewalDate, "string");
    assert.equal(body.stateError, undefined);

    // A TEST notification carries no purchase.
    const test = await signer.notificationPayload({ notificationType: "TEST" });
    await postJson(url, { signedPayload: await signer.signNotification(test) });
    const [, testDelivery] = await receiver.waitFor(2);
    assert.equal((testDelivery.json as { state: unknown }).state, null);
  } finally {
    await stopAndDrop(service);
    await api.close();
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("state: a store B delivery carries the purchase fetched before its first attempt", async (t) => {
  const dir = await Deno.makeTempDir();
  const play = await startStorebSimulator();
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...play.serviceEnv,
      ...issuer.serviceEnv,
      DELIVERY_RETRY_SCHEDULE: "1s",
      DELIVERY_TIMEOUT: "2s",
    },
  });
  try {
    const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
    receiver.setSecrets([secret!]);
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const accountFile = join(dir, "account.json");
    await Deno.writeTextFile(accountFile, account.json);
    await cliOk(service, ...storebCredentialArgs(tenantId, accountFile, PUSH_ACCOUNT));
    const key = await apiKeyOf(service, tenantId);
    const push = async (notification: Record<string, unknown>) => {
      const token = await issuer.mint({ audience: AUDIENCE, email: PUSH_ACCOUNT });
      const answer = await postJson(
        `${service.url}/v1/webhooks/storeb/${tenantId}`,
        pushEnvelope(notification),
        { authorization: `Bearer ${token}` },
      );
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      return answer.json.eventId as string;
    };
    const bodyOf = async (eventId: string, count: number) => {
      const deliveries = await receiver.waitFor(count, 20_000);
      const found = deliveries.filter((d) => (d.json as { eventId: string }).eventId === eventId);
      assert.ok(found.length > 0, `no delivery of ${eventId}`);
      return found;
    };
    const purchaseReads = (purchaseToken: string) =>
      play.requests.filter((r) =>
        r.method === "GET" && r.pathname.includes(encodeURIComponent(purchaseToken))
      ).length;

    await t.step("a subscription's notification: verify's purchase, fetched once", async () => {
      const purchaseToken = `sub-${crypto.randomUUID()}`;
      play.addSubscription({
        packageName: PACKAGE,
        purchaseToken,
        purchase: sampleSubscriptionPurchase(),
      });
      // The first attempt fails: the retry must carry the very same bytes, fetched once.
      receiver.script({ status: 500 });
      const before = receiver.deliveries.length;
      const received = Date.now();
      const eventId = await push(subscriptionNotification(PACKAGE, {
        notificationType: 2,
        purchaseToken,
        subscriptionId: "monthly",
      }));
      const [first, second] = await bodyOf(eventId, before + 2);
      assert.equal(first.body, second.body, "every attempt sends the same payload");
      const body = assertSignedDelivery(second, { event: "subscription.renewed", eventId });
      const verified = await callApi(service, key, "/v1/storeb/verify", {
        packageName: PACKAGE,
        productId: "monthly",
        purchaseToken,
        type: "subscription",
      });
      assert.deepEqual(body.state.purchase, verified.purchase);
      const fetchedAt = Date.parse(body.state.fetchedAt);
      assert.ok(fetchedAt >= received - 1_000 && fetchedAt <= first.receivedAt, "fetchedAt");
      assert.equal(body.stateError, undefined);
      assert.equal(typeof body.occurredAt, "string");
      // One read for the delivery, one for the verify call above.
      assert.equal(purchaseReads(purchaseToken), 2);
    });

    await t.step("a one-time product's notification: the product purchase", async () => {
      const purchaseToken = `otp-${crypto.randomUUID()}`;
      play.addProduct({
        packageName: PACKAGE,
        productId: "coins_100",
        purchaseToken,
        purchase: sampleProductPurchase(),
      });
      const before = receiver.deliveries.length;
      const eventId = await push(oneTimeProductNotification(PACKAGE, {
        notificationType: 1,
        purchaseToken,
        sku: "coins_100",
      }));
      const [delivery] = await bodyOf(eventId, before + 1);
      const body = delivery.json as { state: { purchase: { kind: string; productId: string } } };
      assert.equal(body.state.purchase.kind, "storeb#productPurchase");
      assert.equal(body.state.purchase.productId, "coins_100");
    });

    await t.step("a purchase the store does not know: stateError, delivered anyway", async () => {
      const before = receiver.deliveries.length;
      const eventId = await push(subscriptionNotification(PACKAGE, {
        notificationType: 2,
        purchaseToken: `unknown-${crypto.randomUUID()}`,
      }));
      const [delivery] = await bodyOf(eventId, before + 1);
      const body = delivery.json as { state: unknown; stateError: { error: string } };
      assert.equal(body.state, null);
      assert.equal(body.stateError.error, "PURCHASE_NOT_FOUND");
    });

    await t.step("the store failing: GOOGLE_API_ERROR, delivered anyway", async () => {
      const purchaseToken = `down-${crypto.randomUUID()}`;
      play.script({ purchaseToken, status: 503, times: 5 });
      const before = receiver.deliveries.length;
      const eventId = await push(subscriptionNotification(PACKAGE, {
        notificationType: 2,
        purchaseToken,
      }));
      const [delivery] = await bodyOf(eventId, before + 1);
      const body = delivery.json as { state: unknown; stateError: { error: string } };
      assert.equal(body.state, null);
      assert.equal(body.stateError.error, "GOOGLE_API_ERROR");
      play.clearScripts();
    });

    await t.step("test notifications carry none, and nothing is fetched", async () => {
      const before = receiver.deliveries.length;
      const requests = play.requests.length;
      const eventId = await push(testNotification(PACKAGE));
      const [delivery] = await bodyOf(eventId, before + 1);
      assert.equal((delivery.json as { state: unknown }).state, null);
      assert.equal(play.requests.length, requests);
    });

    await t.step("turned off per tenant: null, no stateError, no call", async () => {
      const off = await cliOk(service, "tenant", "set-state-fetch", tenantId, "--storeb", "off");
      assert.equal(off.storebStateFetch, false);
      assert.equal((await cliOk(service, "tenant", "show", tenantId)).storebStateFetch, false);
      const purchaseToken = `off-${crypto.randomUUID()}`;
      play.addSubscription({
        packageName: PACKAGE,
        purchaseToken,
        purchase: sampleSubscriptionPurchase(),
      });
      const before = receiver.deliveries.length;
      const eventId = await push(subscriptionNotification(PACKAGE, {
        notificationType: 2,
        purchaseToken,
      }));
      const [delivery] = await bodyOf(eventId, before + 1);
      const body = delivery.json as Record<string, unknown>;
      assert.equal(body.state, null);
      assert.ok(!("stateError" in body));
      assert.equal(purchaseReads(purchaseToken), 0);
    });
  } finally {
    await stopAndDrop(service);
    await play.close();
    await issuer.close();
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});
