/**
 * Routing per tenant (docs/configuration.md, "Routing deliveries"): a sandbox callback URL for store A
 * Sandbox notifications, and an event filter, set with the CLI and honoured by the receivers'
 * statements and by the dispatcher's claims.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { databaseOf, startService, stopAndDrop } from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import {
  assertReceipt,
  cliOk,
  createTenantWithCallback,
  deliveryOf,
  postJson,
} from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { matchesEventFilter, parseEventFilter } from "../src/events/filter.ts";
import { FILTERED_OUT_ERROR } from "../src/delivery/enqueue.ts";

Deno.test("event filter: names and prefix patterns of the catalog, or all", () => {
  assert.equal(parseEventFilter("all"), null);
  assert.deepEqual(parseEventFilter(" subscription.* , refund.issued,refund.issued "), [
    "subscription.*",
    "refund.issued",
  ]);
  assert.throws(() => parseEventFilter("subscription.renewd"), /subscription\.renewd matches no/);
  assert.throws(() => parseEventFilter("subscriptions.*"), /matches no event/);
  assert.throws(() => parseEventFilter(" , "), /give event names/);
  const filter = ["subscription.*", "refund.issued"];
  assert.ok(matchesEventFilter("subscription.renewed", filter));
  assert.ok(matchesEventFilter("refund.issued", filter));
  assert.ok(!matchesEventFilter("refund.declined", filter));
  assert.ok(!matchesEventFilter("subscriptionx.renewed", filter));
  assert.ok(matchesEventFilter("test", null));
});

Deno.test("routing: sandbox notifications to the sandbox URL, filtered events not sent", async (t) => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const production = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const sandbox = new StoreaSigner(pki, { bundleId: "com.example.app", environment: "Sandbox" });
  const main = await startCallbackReceiver();
  const sandboxReceiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s",
    },
  });
  const sql = databaseOf(service);
  try {
    const { tenantId, secret } = await createTenantWithCallback(service, main.url);
    main.setSecrets([secret!]);
    sandboxReceiver.setSecrets([secret!]);
    await cliOk(service, ...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;
    const notify = async (signer: StoreaSigner, notificationType = "DID_RENEW") => {
      const payload = await signer.notificationPayload({
        notificationType,
        transaction: signer.sampleTransaction({}),
      });
      const answer = await postJson(url, { signedPayload: await signer.signNotification(payload) });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      return answer.json as { eventId: string; enqueuedDelivery: boolean };
    };
    const sentTo = (receiver: typeof main, eventId: string) =>
      receiver.deliveries.some((d) => (d.json as { eventId: string }).eventId === eventId);

    await t.step(
      "without a sandbox URL, Sandbox notifications go to the callback URL",
      async () => {
        const { eventId } = await notify(sandbox);
        const [delivery] = await main.waitFor(1);
        assert.equal((delivery.json as { eventId: string }).eventId, eventId);
        assert.ok(delivery.signatureValid);
      },
    );

    await t.step("with one, they go there, signed with the same secret", async () => {
      const set = await cliOk(
        service,
        "tenant",
        "set-callback",
        tenantId,
        "--sandbox-url",
        sandboxReceiver.url,
      );
      assert.deepEqual([set.callbackUrl, set.sandboxCallbackUrl], [main.url, sandboxReceiver.url]);
      assert.equal(set.webhookSecret, undefined, "the secret is kept");
      const shown = await cliOk(service, "tenant", "show", tenantId);
      assert.deepEqual([shown.sandboxCallbackUrl, shown.events], [sandboxReceiver.url, null]);
      const { eventId } = await notify(sandbox);
      const [delivery] = await sandboxReceiver.waitFor(1);
      assert.equal((delivery.json as { eventId: string }).eventId, eventId);
      assert.ok(delivery.signatureValid);
      // Production still goes to the callback URL.
      const prod = await notify(production);
      await main.waitFor(2);
      assert.ok(sentTo(main, prod.eventId));
      assert.ok(!sentTo(main, eventId), "not to the callback URL too");
    });

    await t.step("a delivery claimed later is routed the same way", async () => {
      // The first attempt is refused, so the retry comes from the dispatcher's claim.
      sandboxReceiver.script({ status: 503 });
      const before = sandboxReceiver.deliveries.length;
      const { eventId } = await notify(sandbox);
      const deliveries = await sandboxReceiver.waitFor(before + 2, 30_000);
      const attempts = deliveries.filter((d) =>
        (d.json as { eventId: string }).eventId === eventId
      );
      assert.equal(attempts.length, 2, "the retry went to the sandbox URL too");
    });

    await t.step("an event filter stores what it leaves out, and sends nothing", async () => {
      const set = await cliOk(service, "tenant", "set-events", tenantId, "--events", "refund.*");
      assert.deepEqual(set.events, ["refund.*"]);
      const before = main.deliveries.length;
      const renewal = await notify(production);
      assert.equal(renewal.enqueuedDelivery, false);
      const row = await deliveryOf(sql, renewal.eventId);
      assert.equal(row.status, "failed");
      assert.equal(row.last_error, FILTERED_OUT_ERROR);
      const refund = await notify(production, "REFUND");
      assert.equal(refund.enqueuedDelivery, true);
      const deliveries = await main.waitFor(before + 1);
      assert.deepEqual(
        deliveries.slice(before).map((d) => (d.json as { event: string }).event),
        ["refund.issued"],
      );
      const bad = await service.cli("tenant", "set-events", tenantId, "--events", "refunds.*");
      assert.equal(bad.code, 1);
      assert.equal(bad.json.error, "INVALID_EVENT_FILTER");
      const all = await cliOk(service, "tenant", "set-events", tenantId, "--events", "all");
      assert.equal(all.events, null);
      assert.equal((await notify(production)).enqueuedDelivery, true);
    });

    await t.step("none removes the sandbox URL", async () => {
      const set = await cliOk(service, "tenant", "set-callback", tenantId, "--sandbox-url", "none");
      assert.equal(set.sandboxCallbackUrl, null);
      assert.equal(set.callbackUrl, main.url);
      const usage = await service.cli("tenant", "set-callback", tenantId);
      assert.equal(usage.code, 2);
    });
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await main.close();
    await sandboxReceiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("routing: a duplicate keeps its first receipt whatever the filter says", async () => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const main = await startCallbackReceiver();
  const service = await startService({
    env: { STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")) },
  });
  try {
    const { tenantId, secret } = await createTenantWithCallback(service, main.url);
    main.setSecrets([secret!]);
    await cliOk(service, ...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
    await cliOk(service, "tenant", "set-events", tenantId, "--events", "test");
    const payload = await signer.notificationPayload({
      notificationType: "DID_RENEW",
      transaction: signer.sampleTransaction({}),
    });
    const signedPayload = await signer.signNotification(payload);
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;
    const first = assertReceipt(await postJson(url, { signedPayload }), {
      externalId: payload.notificationUUID,
      isNew: true,
      enqueuedDelivery: false,
    });
    const again = assertReceipt(await postJson(url, { signedPayload }), {
      externalId: payload.notificationUUID,
      isNew: false,
      enqueuedDelivery: false,
    });
    assert.equal(again, first);
  } finally {
    await stopAndDrop(service);
    await main.close();
    await Deno.remove(dir, { recursive: true });
  }
});
