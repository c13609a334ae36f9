/**
 * The scheduled recovery of store B end to end, on a real service process with a short
 * `RECOVERY_INTERVAL`: a purchase Google voided whose notification never came is delivered once,
 * as the event its notification would have made; it and its notification are one event whichever
 * comes first; a purchase voided for want of an acknowledgement is reported once; and a 429
 * postpones the tenant's next run to Google's `Retry-After`.
 */
import assert from "node:assert/strict";
import { type LogLine, startService, stopAndDrop } from "./helpers/service.ts";
import { storebCredentialArgs, writeServiceAccountFile } from "./helpers/fixtures.ts";
import {
  assertReceipt,
  assertSignedDelivery,
  cliOk,
  createTenantWithCallback,
  eventually,
  postJson,
} from "./helpers/relay.ts";
import {
  pushEnvelope,
  startPushTokenIssuer,
  subscriptionNotification,
  voidedPurchaseNotification,
} from "../simulators/storeb_push.ts";
import { sampleVoidedPurchase, startStorebSimulator } from "../simulators/storeb_play.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

const PACKAGE_NAME = "com.example.app";
const AUDIENCE = "https://relay.example.com/push";
const PUSH_ACCOUNT = "push@example-project.iam.gserviceaccount.com";

Deno.test("recovery of store B: voided purchases, deduplicated with their notifications", async (t) => {
  const dir = await Deno.makeTempDir();
  const play = await startStorebSimulator();
  const issuer = await startPushTokenIssuer();
  const account = await writeServiceAccountFile(dir);
  await play.addServiceAccount({
    clientEmail: account.clientEmail,
    privateKeyPem: JSON.parse(await Deno.readTextFile(account.path)).private_key,
  });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...play.serviceEnv,
      ...issuer.serviceEnv,
      RECOVERY_INTERVAL: "1s",
      UPSTREAM_TIMEOUT: "2s",
    },
  });
  const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([secret!]);
  await cliOk(service, ...storebCredentialArgs(tenantId, account.path));
  // No state fetch: these tests are about the voided purchases, not the purchases' lookups.
  await cliOk(service, "tenant", "set-state-fetch", tenantId, "--storeb", "off");
  const receiverUrl = `${service.url}/v1/webhooks/storeb/${tenantId}`;
  const push = async (notification: Record<string, unknown>) =>
    postJson(receiverUrl, pushEnvelope(notification), {
      authorization: `Bearer ${await issuer.mint({ audience: AUDIENCE, email: PUSH_ACCOUNT })}`,
    });
  const deliveriesOf = (externalId: string) =>
    receiver.deliveries.filter((d) =>
      (d.json as { externalId?: string })?.externalId === externalId
    );
  const runs = async (count: number): Promise<LogLine[]> => {
    const from = service.logs.length;
    const ours = () =>
      service.logs.slice(from).filter((line) =>
        line.msg === "recovery_run" && line.tenantId === tenantId && line.store === "storeb"
      );
    return await eventually(
      () => ours().length >= count ? ours() : undefined,
      30_000,
      `${count} recovery runs`,
    );
  };
  const voidedAt = () => String(Date.now() - 5 * 60_000);

  try {
    await t.step("a voided purchase only in Google's list is delivered once", async () => {
      // An earlier notification says the token is a subscription's.
      const token = `sub-${crypto.randomUUID()}`;
      const earlier = await push(
        subscriptionNotification(PACKAGE_NAME, { notificationType: 4, purchaseToken: token }),
      );
      assert.equal(earlier.status, 200);
      await receiver.waitFor(1, 15_000);
      const voided = sampleVoidedPurchase({ purchaseToken: token, voidedTimeMillis: voidedAt() });
      play.addVoidedPurchase({
        packageName: PACKAGE_NAME,
        voidedPurchase: voided,
        type: "subscription",
      });
      const externalId = `voided:${voided.orderId}`;
      const delivery = await eventually(() => deliveriesOf(externalId)[0], 30_000, "the delivery");
      const sent = assertSignedDelivery(delivery, {
        event: "refund.issued",
        eventId: delivery.headers["x-service-event-id"],
      });
      assert.equal(sent.reason, "full_refund");
      assert.equal(sent.platformEvent, "storeb.voided_purchase");
      assert.equal(sent.subject, null);
      assert.equal(sent.source, "storeb");
      assert.deepEqual(sent.data, {
        version: "1.0",
        packageName: PACKAGE_NAME,
        eventTimeMillis: voided.voidedTimeMillis,
        voidedPurchaseNotification: {
          purchaseToken: token,
          orderId: voided.orderId,
          productType: 1,
          refundType: 1,
        },
      });
      assert.deepEqual(sent.raw, voided);
      assert.equal(sent.occurredAt, new Date(Number(voided.voidedTimeMillis)).toISOString());
      assert.equal(sent.state, null);

      await runs(2);
      assert.equal(deliveriesOf(externalId).length, 1);
      // The list was asked as the service's contract says.
      const listed = play.calls({ operation: "voided_purchases" });
      const params = new URLSearchParams(listed[0].search);
      assert.equal(params.get("type"), "1");
      assert.equal(params.get("includeQuantityBasedPartialRefund"), "true");
      assert.ok(Number(params.get("startTime")) < Date.now() - 71 * 3_600_000, "3 days back");
    });

    await t.step("the notification first, then the list: one event", async () => {
      const orderId = `GPA.1111-2222-3333-${Math.floor(Math.random() * 90000) + 10000}`;
      const token = `tok-${crypto.randomUUID()}`;
      const answer = await push(voidedPurchaseNotification(PACKAGE_NAME, {
        purchaseToken: token,
        orderId,
        productType: 2,
        refundType: 1,
      }));
      const eventId = assertReceipt(answer, {
        externalId: answer.json.externalId,
        isNew: true,
        enqueuedDelivery: true,
      });
      play.addVoidedPurchase({
        packageName: PACKAGE_NAME,
        voidedPurchase: sampleVoidedPurchase({
          orderId,
          purchaseToken: token,
          voidedTimeMillis: voidedAt(),
        }),
      });
      const later = await runs(2);
      assert.ok(later.some((run) => run.known >= 1), JSON.stringify(later));
      await eventually(
        () =>
          receiver.deliveries.some((d) => d.headers["x-service-event-id"] === eventId) || undefined,
      );
      assert.equal(
        receiver.deliveries.filter((d) => d.headers["x-service-event-id"] === eventId).length,
        1,
      );
      assert.equal(deliveriesOf(`voided:${orderId}`).length, 0, "no second event");
    });

    await t.step("the list first, then the notification: a duplicate of the first", async () => {
      const voided = sampleVoidedPurchase({ voidedTimeMillis: voidedAt(), voidedQuantity: 1 });
      play.addVoidedPurchase({ packageName: PACKAGE_NAME, voidedPurchase: voided });
      const externalId = `voided:${voided.orderId}`;
      const delivery = await eventually(() => deliveriesOf(externalId)[0], 30_000, "the delivery");
      const sent = delivery.json as Record<string, unknown>;
      assert.equal(sent.reason, "partial_refund");
      const answer = await push(voidedPurchaseNotification(PACKAGE_NAME, {
        purchaseToken: voided.purchaseToken,
        orderId: voided.orderId,
        productType: 2,
        refundType: 2,
      }));
      assert.equal(answer.status, 200);
      assert.equal(answer.json.eventId, sent.eventId);
      assert.equal(answer.json.isNew, false);
      assert.equal(answer.json.enqueuedDelivery, false);
      await runs(1);
      assert.equal(
        receiver.deliveries.filter((d) => d.headers["x-service-event-id"] === sent.eventId).length,
        1,
      );
    });

    await t.step("voided for want of an acknowledgement: reported once", async () => {
      const voided = sampleVoidedPurchase({ voidedTimeMillis: voidedAt(), voidedReason: 8 });
      play.addVoidedPurchase({ packageName: PACKAGE_NAME, voidedPurchase: voided });
      const warned = await service.waitForLog((line) =>
        line.msg === "purchase_voided_unacknowledged" && line.orderId === voided.orderId
      );
      assert.equal(warned.level, "warn");
      assert.equal(warned.tenantId, tenantId);
      assert.match(warned.eventId, /^evt_/);
      assert.ok(!JSON.stringify(warned).includes(voided.purchaseToken), "no purchase token");
      await runs(2);
      assert.equal(
        service.logs.filter((line) =>
          line.msg === "purchase_voided_unacknowledged" && line.orderId === voided.orderId
        ).length,
        1,
      );
    });

    await t.step("a 429 postpones the tenant's next run to Google's Retry-After", async () => {
      await runs(1);
      play.script({ operation: "voided_purchases", status: 429, headers: { "retry-after": "5" } });
      const failed = await service.waitForLog((line) =>
        line.msg === "recovery_failed" && line.tenantId === tenantId && line.store === "storeb"
      );
      assert.equal(failed.error, "RATE_LIMITED");
      const calls = play.calls({ operation: "voided_purchases" });
      const refusedAt = calls.at(-1)!.at;
      await runs(1);
      const next = play.calls({ operation: "voided_purchases" }).find((c) => c.at > refusedAt)!;
      assert.ok(next.at - refusedAt >= 5_000, `asked again after ${next.at - refusedAt} ms`);
    });
  } finally {
    await stopAndDrop(service);
    await receiver.close();
    await issuer.close();
    await play.close();
    await Deno.remove(dir, { recursive: true });
  }
});
