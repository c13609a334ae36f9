/**
 * `trigger ... --lost`: a notification lost on the way, then recovered. The store simulators keep
 * it as the stores would (store A: in the App Store's notification history with a failed attempt;
 * store B: a voided purchase, in Google Play's list) and nothing is posted; the command waits for
 * the service's recovery to find it, and prints the event and its delivery. Here the signer of
 * `deno task dev` is played by the test, holding the simulators, as the dev loop's does
 * (scripts/dev_signer.ts), on the same protocol (src/cli/trigger.ts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startService, stopAndDrop } from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_PUSH_SERVICE_ACCOUNT,
  writeServiceAccountFile,
} from "./helpers/fixtures.ts";
import { cliOk, createTenantWithCallback } from "./helpers/relay.ts";
import { DEV_SIGNER_FILE, parseTriggerChoice, type SignRequest } from "../src/cli/trigger.ts";
import { UsageError } from "../src/cli/command.ts";
import type { StoreaSendAttemptResult } from "../simulators/storea_api.ts";
import { storeaNotification } from "../simulators/store_notifications.ts";
import { startStorebSimulator } from "../simulators/storeb_play.ts";
import {
  pushEnvelope,
  startPushTokenIssuer,
  voidedPurchaseNotification,
} from "../simulators/storeb_push.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

Deno.test("trigger --lost: what it accepts", () => {
  assert.deepEqual(parseTriggerChoice("storea", "did_renew", { lost: "yes" }).lost, {
    sendAttemptResult: "TIMED_OUT",
  });
  assert.deepEqual(parseTriggerChoice("storea", "DID_RENEW", { lost: "tls_issue" }).lost, {
    sendAttemptResult: "TLS_ISSUE",
  });
  assert.throws(() => parseTriggerChoice("storea", "DID_RENEW", { lost: "SUCCESS" }), UsageError);
  // Google reports no send attempt: none is made up.
  assert.deepEqual(parseTriggerChoice("storeb", "voided_purchase", { lost: "yes" }).lost, {
    sendAttemptResult: null,
  });
  // Google keeps no record of the other notifications it failed to deliver.
  assert.throws(() => parseTriggerChoice("storeb", "subscription.4", { lost: "yes" }), UsageError);
  assert.equal(parseTriggerChoice("storea", "DID_RENEW").lost, undefined);
});

Deno.test("trigger --lost: lost on the way, then recovered and delivered", async (t) => {
  const dir = await Deno.makeTempDir();
  const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir);
  const play = await startStorebSimulator();
  const account = await writeServiceAccountFile(dir);
  await play.addServiceAccount({
    clientEmail: account.clientEmail,
    privateKeyPem: JSON.parse(await Deno.readTextFile(account.path)).private_key,
  });
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...api.serviceEnv,
      ...play.serviceEnv,
      ...issuer.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
      RECOVERY_INTERVAL: "1s",
      UPSTREAM_TIMEOUT: "2s",
    },
  });
  const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([secret!]);
  await cliOk(service, ...storeaCredentialArgs(tenantId, keyFile));
  await cliOk(service, ...storebCredentialArgs(tenantId, account.path));

  // The dev loop's signer, keeping lost notifications in the simulators.
  const token = crypto.randomUUID();
  let keepsLost = true;
  const devSigner = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (req) => {
      if (req.headers.get("authorization") !== `Bearer ${token}`) {
        return new Response(null, {
          status: 401,
        });
      }
      const request = await req.json() as SignRequest;
      if (request.store === "storea") {
        const { body } = await storeaNotification(signer, {
          notificationType: request.notificationType,
          subtype: request.subtype ?? undefined,
          bundleId: request.bundleId,
          originalTransactionId: "2000000000000001",
          productId: "pro.monthly",
        });
        if (request.lost && keepsLost) {
          api.recordNotification(body.signedPayload, {
            sendAttempts: [{
              attemptDate: Date.now(),
              sendAttemptResult: request.lost.sendAttemptResult as StoreaSendAttemptResult,
            }],
          });
        }
        return Response.json({
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
          ...(request.lost && keepsLost ? { recorded: true } : {}),
        });
      }
      const refundType = request.notification.kind === "voided_purchase"
        ? request.notification.refundType
        : 1;
      const notification = voidedPurchaseNotification(request.packageName, {
        purchaseToken: `tok-${crypto.randomUUID()}`,
        orderId: `GPA.1234-5678-9012-${Math.floor(Math.random() * 90000) + 10000}`,
        productType: 1,
        refundType,
      });
      const voided = notification.voidedPurchaseNotification as Record<string, string>;
      // Google lists a purchase a little after it voided it.
      const voidedAt = String(Date.now() - 2 * 60_000);
      play.addVoidedPurchase({
        packageName: request.packageName,
        voidedPurchase: {
          kind: "androidpublisher#voidedPurchase",
          purchaseToken: voided.purchaseToken,
          purchaseTimeMillis: String(Date.now() - 86_400_000),
          voidedTimeMillis: voidedAt,
          orderId: voided.orderId,
          voidedSource: 0,
          voidedReason: 1,
          ...(refundType === 2 ? { voidedQuantity: 1 } : {}),
        },
        type: "subscription",
      });
      const pushToken = await issuer.mint({
        audience: request.pushAudience,
        email: TEST_PUSH_SERVICE_ACCOUNT,
      });
      return Response.json({
        headers: { authorization: `Bearer ${pushToken}`, "content-type": "application/json" },
        body: JSON.stringify(pushEnvelope(notification)),
        recorded: true,
      });
    },
  );
  const signerFile = join(service.db.dataDir, DEV_SIGNER_FILE);
  await Deno.mkdir(join(service.db.dataDir, "dev"), { recursive: true });
  await Deno.writeTextFile(
    signerFile,
    JSON.stringify({
      url: `http://127.0.0.1:${devSigner.addr.port}/sign`,
      token,
      serviceUrl: service.url,
    }),
  );

  try {
    await t.step("store A: kept in Apple's history, never posted, then recovered", async () => {
      const result = await service.cli(
        "trigger",
        "storea",
        "DID_RENEW",
        "--tenant",
        tenantId,
        "--lost",
        "NO_RESPONSE",
      );
      assert.equal(result.code, 0, result.stderr);
      const out = result.json;
      assert.equal(out.recovered, true, result.stdout);
      assert.deepEqual(out.lost, { sendAttemptResult: "NO_RESPONSE" });
      assert.equal(out.event, "subscription.renewed");
      assert.equal(out.externalId, api.notificationHistory.at(-1)!.notificationUUID);
      assert.match(out.eventId, /^evt_/);
      assert.equal(out.delivery.status, "delivered");
      // Nothing was posted to the receiver: the recovery found it.
      assert.equal(api.sentNotifications.length, 0);
      assert.ok(
        service.logs.some((line) =>
          line.msg === "notification_recovered" && line.eventId === out.eventId
        ),
      );
    });

    await t.step("store B: a voided purchase in Google's list, then recovered", async () => {
      const result = await service.cli(
        "trigger",
        "storeb",
        "voided_purchase",
        "--tenant",
        tenantId,
        "--lost",
        "yes",
      );
      assert.equal(result.code, 0, result.stderr);
      const out = result.json;
      assert.equal(out.recovered, true, result.stdout);
      assert.equal(out.event, "refund.issued");
      assert.equal(out.platformEvent, "storeb.voided_purchase");
      assert.match(out.externalId, /^voided:GPA\./);
      assert.equal(out.delivery.status, "delivered");
    });

    await t.step("a dev loop that cannot keep lost notifications says so", async () => {
      keepsLost = false;
      const result = await service.cli(
        "trigger",
        "storea",
        "DID_RENEW",
        "--tenant",
        tenantId,
        "--lost",
        "yes",
      );
      assert.equal(result.code, 1);
      assert.equal(result.json.error, "SIMULATORS_CANNOT_LOSE");
    });
  } finally {
    await devSigner.shutdown();
    await stopAndDrop(service);
    await receiver.close();
    await issuer.close();
    await play.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
