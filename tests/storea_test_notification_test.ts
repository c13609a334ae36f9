/**
 * `storea test-notification` end to end: the CLI asks the App Store simulator for a test
 * notification, the simulator really posts a signed TEST notification to the service's store A
 * receiver, the service stores it and delivers it to a callback receiver, and the CLI follows the
 * chain and says which hop failed when one does.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  createTenantWithKey,
  databaseOf,
  runCli,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import { storeaCredentialArgs } from "./helpers/fixtures.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

const BUNDLE_ID = "com.example.app";
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

async function tenantWithStoreA(
  service: RunningService,
  keyFile: string,
  callbackUrl: string | null,
): Promise<{ tenantId: string; webhookSecret: string | null }> {
  const { tenantId } = await createTenantWithKey(service);
  const set = await service.cli(...storeaCredentialArgs(tenantId, keyFile));
  assert.equal(set.code, 0, set.stderr);
  if (callbackUrl === null) return { tenantId, webhookSecret: null };
  const callback = await service.cli("tenant", "set-callback", tenantId, "--url", callbackUrl);
  assert.equal(callback.code, 0, callback.stderr);
  return { tenantId, webhookSecret: callback.json.webhookSecret };
}

Deno.test("storea test-notification follows App Store -> service -> tenant", async (t) => {
  const dir = await Deno.makeTempDir();
  const { api, keyFile, rootPemPath } = await startStoreaWorld(dir, {
    notificationTimeoutMs: 3_000,
  });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...api.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
      UPSTREAM_TIMEOUT: "2s",
      DELIVERY_TIMEOUT: "2s",
    },
  });
  const { tenantId, webhookSecret } = await tenantWithStoreA(service, keyFile, receiver.url);
  receiver.setSecrets([webhookSecret!]);
  const receiverUrl = `${service.url}/v1/webhooks/storea/${tenantId}`;
  const pointAt = (url: string | null) => api.setNotificationUrl({ bundleId: BUNDLE_ID, url });
  const testNotification = (...args: string[]) =>
    service.cli("storea", "test-notification", "--tenant", tenantId, ...args);

  try {
    await t.step("the whole chain works: exit 0, received and delivered", async () => {
      pointAt(receiverUrl);
      const { code, json, stderr } = await testNotification();
      assert.equal(code, 0, stderr);
      assert.deepEqual(Object.keys(json), [
        "tenantId",
        "environment",
        "testNotificationToken",
        "sendAttempts",
        "received",
        "eventId",
        "delivery",
      ]);
      assert.equal(json.tenantId, tenantId);
      // The tenant's setting is auto: production is asked.
      assert.equal(json.environment, "production");
      assert.match(json.testNotificationToken, /^[0-9a-f-]{36}_\d+$/);
      assert.equal(json.sendAttempts.length, 1);
      assert.equal(json.sendAttempts[0].sendAttemptResult, "SUCCESS");
      assert.match(json.sendAttempts[0].attemptDate, ISO);
      assert.equal(json.received, true);
      assert.match(json.eventId, /^evt_/);
      assert.deepEqual(json.delivery, { status: "delivered", responseCode: 200 });

      const sent = api.sentNotifications.at(-1)!;
      assert.equal(sent.url, receiverUrl);
      assert.equal(sent.responseStatus, 200);
      const sql = databaseOf(service);
      try {
        const [event] =
          await sql`SELECT id, external_id, event FROM events WHERE id = ${json.eventId}`;
        assert.equal(event.external_id, sent.notificationUUID);
        assert.equal(event.event, "test");
      } finally {
        await sql.end();
      }
      const delivered = receiver.deliveries.find((d) =>
        d.headers["x-service-event-id"] === json.eventId
      );
      assert.ok(delivered?.signatureValid);
      assert.deepEqual(
        api.requests.map((r) => `${r.operation} ${r.environment}:${r.status}`).slice(0, 2),
        ["test_notification production:200", "test_notification_status production:200"],
      );
    });

    await t.step("--environment sandbox asks sandbox", async () => {
      api.requests.length = 0;
      const { code, json, stderr } = await testNotification("--environment", "sandbox");
      assert.equal(code, 0, stderr);
      assert.equal(json.environment, "sandbox");
      assert.ok(api.requests.every((r) => r.environment === "sandbox"));
    });

    await t.step("a failing callback: exit 1, the hop service -> tenant", async () => {
      receiver.script({ status: 500 });
      const { code, json } = await testNotification();
      assert.equal(code, 1);
      assert.equal(json.error, "TEST_DELIVERY_FAILED");
      assert.equal(json.failedHop, "service_to_tenant");
      assert.equal(json.received, true);
      assert.deepEqual(json.delivery, { status: "pending", responseCode: 500 });
      assert.match(json.message, /callback/);
    });

    await t.step(
      "the service's receiver unreachable: exit 1, the hop App Store -> service",
      async () => {
        const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
        const port = (closed.addr as Deno.NetAddr).port;
        closed.close();
        pointAt(`http://127.0.0.1:${port}/v1/webhooks/storea/${tenantId}`);
        const { code, json } = await testNotification();
        assert.equal(code, 1);
        assert.equal(json.error, "TEST_NOTIFICATION_NOT_RECEIVED");
        assert.equal(json.failedHop, "app_store_to_service");
        assert.deepEqual(
          json.sendAttempts.map((a: { sendAttemptResult: string }) => a.sendAttemptResult),
          [
            "NO_RESPONSE",
          ],
        );
        assert.equal(json.received, false);
        assert.equal(json.eventId, null);
        assert.equal(json.delivery, null);
      },
    );

    await t.step(
      "the receiver refusing it (another tenant's URL): UNSUCCESSFUL_HTTP_RESPONSE_CODE",
      async () => {
        pointAt(`${service.url}/v1/webhooks/storea/tenant_01KA1D4C7W5GQ0VZ3RJ8N2T6XE`);
        const { code, json } = await testNotification();
        assert.equal(code, 1);
        assert.equal(json.failedHop, "app_store_to_service");
        assert.equal(json.sendAttempts[0].sendAttemptResult, "UNSUCCESSFUL_HTTP_RESPONSE_CODE");
        assert.equal(api.sentNotifications.at(-1)!.responseStatus, 404);
      },
    );

    await t.step("a URL that answers 2xx but is not this service: the hop service", async () => {
      pointAt(receiver.url);
      const { code, json } = await testNotification();
      assert.equal(code, 1);
      assert.equal(json.error, "TEST_NOTIFICATION_NOT_STORED");
      assert.equal(json.failedHop, "service");
      assert.equal(json.sendAttempts[0].sendAttemptResult, "SUCCESS");
      assert.equal(json.received, false);
    });

    await t.step("no attempt within --wait: the hop App Store", async () => {
      pointAt(receiver.url);
      receiver.script({ hang: true });
      const { code, json } = await testNotification("--wait", "1s");
      assert.equal(code, 1);
      assert.equal(json.error, "TEST_NOTIFICATION_NOT_SENT");
      assert.equal(json.failedHop, "app_store");
      assert.deepEqual(json.sendAttempts, []);
    });

    await t.step("no notification URL at Apple: exit 1, the hop App Store API", async () => {
      pointAt(null);
      const { code, json } = await testNotification();
      assert.equal(code, 1);
      assert.equal(json.error, "APPLE_API_ERROR");
      assert.equal(json.failedHop, "app_store_api");
      assert.equal(json.testNotificationToken, null);
      assert.match(json.message, /notification URL/);
    });

    await t.step("a tenant without a callback URL: received, no delivery, exit 0", async () => {
      const quiet = await tenantWithStoreA(service, keyFile, null);
      pointAt(`${service.url}/v1/webhooks/storea/${quiet.tenantId}`);
      const { code, json, stderr } = await service.cli(
        "storea",
        "test-notification",
        "--tenant",
        quiet.tenantId,
      );
      assert.equal(code, 0, stderr);
      assert.equal(json.received, true);
      assert.equal(json.delivery, null);
    });

    await t.step("roots it cannot use stop it before Apple is asked to send", async () => {
      const garbage = join(dir, "garbage.pem");
      await Deno.writeTextFile(
        garbage,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
      );
      const calls = api.requests.length;
      const { code, json } = await runCli(
        ["storea", "test-notification", "--tenant", tenantId],
        { ...service.env, STOREA_ROOT_CERTS: garbage },
      );
      assert.equal(code, 1);
      assert.equal(json.error, "CONFIG_INVALID");
      assert.match(json.message, /STOREA_ROOT_CERTS/);
      assert.equal(api.requests.length, calls);
    });

    await t.step("bad usage and a tenant without store A credentials", async () => {
      assert.equal((await testNotification("--wait", "forever")).code, 2);
      assert.equal((await testNotification("--environment", "auto")).code, 2);
      const bare = await createTenantWithKey(service);
      const missing = await service.cli("storea", "test-notification", "--tenant", bare.tenantId);
      assert.equal(missing.code, 1);
      assert.equal(missing.json.error, "CREDENTIALS_MISSING");
    });
  } finally {
    await stopAndDrop(service);
    await receiver.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
