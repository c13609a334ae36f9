/**
 * The scheduled recovery of store A end to end, on a real service process with a short
 * `RECOVERY_INTERVAL`: a notification the App Store failed to deliver, found only in its history,
 * is delivered once to the tenant's callback; a known one is never delivered twice; an invalid one
 * never; Apple's failed attempts are reported once; the checkpoint survives a restart; and a 429
 * postpones the tenant's next run to Apple's `Retry-After`.
 */
import assert from "node:assert/strict";
import {
  connectTestDatabase,
  createTenantWithKey,
  databaseOf,
  type LogLine,
  startService,
} from "./helpers/service.ts";
import { storeaCredentialArgs } from "./helpers/fixtures.ts";
import { assertSignedDelivery, eventually, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { storeaRateLimitedAnswer } from "../simulators/storea_api.ts";
import { storeaNotification } from "../simulators/store_notifications.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

const BUNDLE_ID = "com.example.app";
const HOUR_MS = 3_600_000;

Deno.test("recovery of store A: lost notifications delivered once, known and invalid never", async (t) => {
  const dir = await Deno.makeTempDir();
  const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir);
  const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
  const receiver = await startCallbackReceiver();
  const env = {
    ...api.serviceEnv,
    STOREA_ROOT_CERTS: rootPemPath,
    RECOVERY_INTERVAL: "1s",
    UPSTREAM_TIMEOUT: "2s",
  };
  let service = await startService({ env });
  const db = service.db;
  const { tenantId } = await createTenantWithKey(service);
  const set = await service.cli(...storeaCredentialArgs(tenantId, keyFile));
  assert.equal(set.code, 0, set.stderr);
  const callback = await service.cli("tenant", "set-callback", tenantId, "--url", receiver.url);
  assert.equal(callback.code, 0, callback.stderr);
  receiver.setSecrets([callback.json.webhookSecret]);

  const lost = (type: string, id: string, from = signer) =>
    storeaNotification(from, {
      notificationType: type,
      originalTransactionId: id,
      productId: "pro.monthly",
    });
  const deliveriesOf = (uuid: string) =>
    receiver.deliveries.filter((d) => (d.json as { externalId?: string })?.externalId === uuid);
  /** The next `count` runs of the tenant in production that start from now. */
  const runs = async (count: number, environment = "production"): Promise<LogLine[]> => {
    const from = service.logs.length;
    const ours = () =>
      service.logs.slice(from).filter((line) =>
        line.msg === "recovery_run" && line.tenantId === tenantId &&
        line.environment === environment
      );
    return await eventually(
      () => ours().length >= count ? ours() : undefined,
      30_000,
      `${count} recovery runs`,
    );
  };

  try {
    await t.step("a notification only in Apple's history is delivered, once", async () => {
      const { body, payload } = await lost("DID_RENEW", "2000000000000001");
      const attemptDate = Date.now() - 60_000;
      api.recordNotification(body.signedPayload, {
        sendAttempts: [
          { attemptDate, sendAttemptResult: "TIMED_OUT" },
          { attemptDate: attemptDate + 1000, sendAttemptResult: "NO_RESPONSE" },
        ],
      });
      const [delivery] = await receiver.waitFor(1, 30_000);
      const eventId = delivery.headers["x-service-event-id"];
      const sent = assertSignedDelivery(delivery, { event: "subscription.renewed", eventId });
      // Exactly as the receiver would have made it from Apple's post.
      assert.equal(sent.externalId, payload.notificationUUID);
      assert.equal(sent.source, "storea");
      assert.equal(sent.platformEvent, "storea.did_renew");
      assert.deepEqual(sent.data, payload);
      assert.deepEqual(sent.raw, payload);
      assert.equal(sent.occurredAt, new Date(payload.signedDate).toISOString());
      assert.equal(sent.state.transaction.originalTransactionId, "2000000000000001");

      const recovered = await service.waitForLog((line) =>
        line.msg === "notification_recovered" && line.eventId === eventId
      );
      assert.equal(recovered.via, "schedule");
      const failures = await service.waitForLog((line) =>
        line.msg === "store_send_failures" && line.tenantId === tenantId
      );
      assert.equal(failures.level, "warn");
      assert.equal(failures.environment, "production");
      assert.deepEqual(failures.results, { TIMED_OUT: 1, NO_RESPONSE: 1 });
      assert.equal(failures.latestAttemptAt, new Date(attemptDate + 1000).toISOString());

      // The next runs read the same window again (the overlap): known, nothing sent again, and
      // the same failed attempts are not reported again.
      const later = await runs(2);
      assert.ok(later.every((run) => run.outcome === "complete"), JSON.stringify(later));
      assert.ok(later.some((run) => run.known >= 1 && run.recovered === 0));
      assert.equal(deliveriesOf(payload.notificationUUID).length, 1);
      assert.equal(
        service.logs.filter((line) => line.msg === "store_send_failures").length,
        1,
      );

      // Automatic runs ask Apple only for its failures, in both environments of `auto`.
      const history = api.requests.filter((r) => r.operation === "notification_history");
      assert.ok(history.every((r) => r.body?.onlyFailures === true));
      assert.deepEqual(
        new Set(history.map((r) => r.environment)),
        new Set(["production", "sandbox"]),
      );
      // A tenant's first run looks back 3 days.
      const first = history[0].body!;
      assert.ok(
        Math.abs((first.endDate as number) - (first.startDate as number) - 72 * HOUR_MS) < 60_000,
      );
    });

    await t.step("a notification the service stored is known: never delivered twice", async () => {
      const { body, payload } = await lost("DID_RENEW", "2000000000000002");
      // Apple posted it and the service stored it, but Apple saw no answer in time.
      const posted = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, body);
      assert.equal(posted.status, 200);
      await eventually(() => deliveriesOf(payload.notificationUUID).length === 1 || undefined);
      api.recordNotification(body.signedPayload, {
        sendAttempts: [{ attemptDate: Date.now(), sendAttemptResult: "TIMED_OUT" }],
      });
      const later = await runs(2);
      assert.ok(later.some((run) => run.known >= 2), JSON.stringify(later));
      assert.equal(deliveriesOf(payload.notificationUUID).length, 1);
    });

    await t.step("an invalid notification is counted and logged, never relayed", async () => {
      const { body, payload } = await lost("DID_RENEW", "2000000000000003", stranger);
      api.recordNotification(body.signedPayload);
      const invalid = await service.waitForLog((line) =>
        line.msg === "recovery_notification_invalid" && line.tenantId === tenantId
      );
      assert.equal(invalid.level, "warn");
      assert.equal(invalid.error, "SIGNATURE_INVALID");
      const later = await runs(1);
      assert.ok(later[0].invalid >= 1);
      const sql = databaseOf(service);
      try {
        const rows = await sql`
          SELECT 1 FROM events WHERE external_id = ${payload.notificationUUID}`;
        assert.equal(rows.length, 0);
      } finally {
        await sql.end();
      }
      assert.equal(deliveriesOf(payload.notificationUUID).length, 0);
    });

    await t.step("a 429 postpones the tenant's next run to Apple's Retry-After", async () => {
      await runs(1);
      const retryAt = Date.now() + 5_000;
      api.script(
        "production",
        storeaRateLimitedAnswer({ retryAt, operation: "notification_history" }),
      );
      const failed = await service.waitForLog((line) =>
        line.msg === "recovery_failed" && line.tenantId === tenantId
      );
      assert.equal(failed.level, "warn");
      assert.equal(failed.error, "RATE_LIMITED");
      assert.ok(Date.parse(failed.retryAt) >= retryAt, `${failed.retryAt} before Retry-After`);
      const refused = api.requests.findLast((r) =>
        r.operation === "notification_history" && r.status === 429
      )!;
      await runs(1);
      const next = api.requests.find((r) =>
        r.operation === "notification_history" && r.environment === "production" &&
        r.at > refused.at
      )!;
      assert.ok(next.at >= retryAt, `asked again ${retryAt - next.at} ms before Retry-After`);
      // Sandbox is another checkpoint: it went on meanwhile.
      assert.ok(
        api.requests.some((r) =>
          r.operation === "notification_history" && r.environment === "sandbox" &&
          r.at > refused.at && r.at < retryAt
        ),
      );
    });

    await t.step("the checkpoint survives a restart: the next run starts from it", async () => {
      assert.equal(await service.stop(), 0);
      // The service is gone: the database is opened here (the embedded engine's too).
      const stopped = await connectTestDatabase(db);
      const sql = stopped.sql;
      let checkedUntil: number;
      try {
        const [row] = await sql`
          SELECT checked_until, lease_owner FROM recovery_checkpoints
          WHERE tenant_id = ${tenantId} AND store = 'storea' AND environment = 'production'`;
        assert.equal(row.lease_owner, null, "the lease was given back at shutdown");
        checkedUntil = new Date(row.checked_until).getTime();
      } finally {
        await stopped.close();
      }
      const requests = api.requests.length;
      service = await startService({ env, db });
      const [run] = await runs(1);
      // The overlap before the checkpoint, not three days back.
      assert.equal(run.windowStart, new Date(checkedUntil - HOUR_MS).toISOString());
      const asked = api.requests.slice(requests).find((r) =>
        r.operation === "notification_history" && r.environment === "production"
      )!;
      assert.equal(asked.body!.startDate, checkedUntil - HOUR_MS);
    });
  } finally {
    await service.stop();
    await db.drop();
    await receiver.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
