/**
 * Two service processes on one PostgreSQL database, both running the recovery every second: they
 * never read the same tenant's store and environment at the same time (the checkpoint's lease),
 * and a notification lost on the way is delivered once, whichever finds it. The embedded engine
 * serves one process only; its lease logic is tested in one process by
 * tests/recovery_checkpoints_test.ts.
 */
import assert from "node:assert/strict";
import {
  createTenantWithKey,
  ENGINE,
  type RunningService,
  startService,
} from "./helpers/service.ts";
import { storeaCredentialArgs } from "./helpers/fixtures.ts";
import { eventually } from "./helpers/relay.ts";
import { storeaNotification } from "../simulators/store_notifications.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

Deno.test({
  name: "recovery replicas: one at a time per tenant and environment, each notification once",
  ignore: ENGINE !== "postgresql",
  async fn() {
    const dir = await Deno.makeTempDir();
    const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir);
    // Every history call takes a while, so two runs at once would overlap.
    for (const environment of ["production", "sandbox"] as const) {
      api.script(environment, {
        operation: "notification_history",
        delayMs: 700,
        times: Infinity,
      });
    }
    const receiver = await startCallbackReceiver();
    const env = {
      ...api.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
      RECOVERY_INTERVAL: "1s",
      UPSTREAM_TIMEOUT: "3s",
    };
    const first = await startService({ env });
    const services: RunningService[] = [first];
    try {
      services.push(await startService({ env, db: first.db }));
      const { tenantId } = await createTenantWithKey(first);
      const set = await first.cli(...storeaCredentialArgs(tenantId, keyFile));
      assert.equal(set.code, 0, set.stderr);
      const callback = await first.cli("tenant", "set-callback", tenantId, "--url", receiver.url);
      assert.equal(callback.code, 0, callback.stderr);
      receiver.setSecrets([callback.json.webhookSecret]);

      const lost = [];
      for (let i = 0; i < 3; i++) {
        const { body, payload } = await storeaNotification(signer, {
          notificationType: "DID_RENEW",
          originalTransactionId: `200000000000010${i}`,
          productId: "pro.monthly",
        });
        api.recordNotification(body.signedPayload);
        lost.push(payload.notificationUUID);
      }
      const runsOf = (service: RunningService) =>
        service.logs.filter((line) => line.msg === "recovery_run" && line.tenantId === tenantId);
      await eventually(
        () => services.every((s) => runsOf(s).length >= 4) || undefined,
        60_000,
        "runs by both replicas",
      );
      await receiver.waitFor(3, 30_000);

      // No two calls for the same environment were in flight together.
      for (const environment of ["production", "sandbox"]) {
        const calls = api.requests
          .filter((r) => r.operation === "notification_history" && r.environment === environment)
          .sort((a, b) => a.at - b.at);
        assert.ok(calls.length >= 4, `${environment}: ${calls.length} calls`);
        for (let i = 1; i < calls.length; i++) {
          assert.ok(
            calls[i].at >= calls[i - 1].answeredAt,
            `${environment}: a call at ${calls[i].at} while another ran until ${
              calls[i - 1].answeredAt
            }`,
          );
        }
      }
      // Nor did two runs of one checkpoint overlap, by the replicas' own accounts.
      const spans = services.flatMap((service) =>
        runsOf(service).map((run) => ({
          key: run.environment,
          end: Date.parse(run.ts),
          start: Date.parse(run.ts) - run.durationMs,
        }))
      );
      for (const a of spans) {
        for (const b of spans) {
          if (a === b || a.key !== b.key) continue;
          assert.ok(a.end <= b.start + 5 || b.end <= a.start + 5, JSON.stringify([a, b]));
        }
      }
      // Each lost notification delivered once.
      const ids = receiver.deliveries.map((d) => (d.json as { externalId: string }).externalId);
      for (const uuid of lost) assert.equal(ids.filter((id) => id === uuid).length, 1);
    } finally {
      for (const service of services) await service.stop();
      await first.db.drop();
      await receiver.close();
      await api.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
