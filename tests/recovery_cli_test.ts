/**
 * `notifications recover`: with the schedule turned off (`RECOVERY_INTERVAL=0`), the command reads
 * a window of both stores' records, stores and delivers what the service never received (the
 * running service's dispatcher is woken to send it), and prints one line per store; and the
 * window is refused where the store or the service's memory does not reach.
 */
import assert from "node:assert/strict";
import { startService, stopAndDrop } from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  writeServiceAccountFile,
} from "./helpers/fixtures.ts";
import { cliOk, createTenantWithCallback, eventually } from "./helpers/relay.ts";
import { storeaNotification } from "../simulators/store_notifications.ts";
import { sampleVoidedPurchase, startStorebSimulator } from "../simulators/storeb_play.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { COMMANDS } from "../src/cli/mod.ts";
import { parseCommandArgs } from "../src/cli/args.ts";
import { UsageError } from "../src/cli/command.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

const BUNDLE_ID = "com.example.app";
const LINE_KEYS = [
  "tenantId",
  "store",
  "checked",
  "recovered",
  "known",
  "invalid",
  "failedSendAttempts",
];

Deno.test("notifications recover: --all is a flag", () => {
  const recover = COMMANDS.find((c) => c.words.join(" ") === "notifications recover")!;
  const base = ["--tenant", "tenant_x", "--since", "2026-01-01T00:00:00Z"];
  assert.equal(parseCommandArgs(recover, [...base, "--all"]).input.options.all, "true");
  assert.equal(parseCommandArgs(recover, base).input.options.all, undefined);
  // A flag takes no value, and is not confused with the next option's.
  assert.throws(() => parseCommandArgs(recover, [...base, "--all=yes"]), UsageError);
  const before = parseCommandArgs(recover, ["--all", ...base]).input.options;
  assert.deepEqual([before.all, before.tenant], ["true", "tenant_x"]);
});

Deno.test("notifications recover: reads both stores' records, one line each", async (t) => {
  const dir = await Deno.makeTempDir();
  const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir);
  const play = await startStorebSimulator();
  const account = await writeServiceAccountFile(dir);
  await play.addServiceAccount({
    clientEmail: account.clientEmail,
    privateKeyPem: JSON.parse(await Deno.readTextFile(account.path)).private_key,
  });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      ...api.serviceEnv,
      ...play.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
      RECOVERY_INTERVAL: "0",
      UPSTREAM_TIMEOUT: "2s",
    },
  });
  const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([secret!]);
  await cliOk(service, ...storeaCredentialArgs(tenantId, keyFile));
  await cliOk(service, ...storebCredentialArgs(tenantId, account.path));
  api.setNotificationUrl({
    bundleId: BUNDLE_ID,
    url: `${service.url}/v1/webhooks/storea/${tenantId}`,
  });
  const since = new Date(Date.now() - 3_600_000).toISOString();
  const recover = (...args: string[]) =>
    service.cli("notifications", "recover", "--tenant", tenantId, "--since", since, ...args);
  const lines = (stdout: string) => stdout.trim().split("\n").map((line) => JSON.parse(line));
  const notification = async (id: string) =>
    await storeaNotification(signer, {
      notificationType: "DID_RENEW",
      originalTransactionId: id,
      productId: "pro.monthly",
    });

  try {
    await t.step("a lost store A notification: recovered, delivered, one line", async () => {
      const { body, payload } = await notification("2000000000000001");
      api.recordNotification(body.signedPayload);
      const result = await recover("--store", "storea");
      assert.equal(result.code, 0, result.stderr);
      const [line, ...more] = lines(result.stdout);
      assert.deepEqual(more, []);
      assert.deepEqual(Object.keys(line), LINE_KEYS);
      assert.deepEqual(line, {
        tenantId,
        store: "storea",
        checked: 1,
        recovered: 1,
        known: 0,
        invalid: 0,
        failedSendAttempts: { TIMED_OUT: 1 },
      });
      // The service's dispatcher was woken: no retry sweep needed.
      const [delivery] = await receiver.waitFor(1, 15_000);
      assert.equal((delivery.json as { externalId: string }).externalId, payload.notificationUUID);
      // The tenant's setting is auto: both environments were read.
      const asked = api.requests.filter((r) => r.operation === "notification_history");
      assert.deepEqual(asked.map((r) => r.environment), ["production", "sandbox"]);
      assert.ok(asked.every((r) => r.body?.onlyFailures === true));
    });

    await t.step("run again: known, nothing delivered twice", async () => {
      const result = await recover("--store", "storea", "--environment", "production");
      assert.equal(result.code, 0, result.stderr);
      assert.deepEqual(lines(result.stdout), [{
        tenantId,
        store: "storea",
        checked: 1,
        recovered: 0,
        known: 1,
        invalid: 0,
        failedSendAttempts: { TIMED_OUT: 1 },
      }]);
      assert.equal(receiver.deliveries.length, 1);
    });

    await t.step("--all also reads what Apple delivered", async () => {
      const { body } = await notification("2000000000000002");
      assert.equal((await api.sendNotification(body.signedPayload)).sendAttemptResult, "SUCCESS");
      await receiver.waitFor(2, 15_000);
      const failuresOnly = lines((await recover("--store", "storea")).stdout)[0];
      assert.equal(failuresOnly.checked, 1);
      const all = await recover("--store", "storea", "--all");
      assert.equal(all.code, 0, all.stderr);
      const [line] = lines(all.stdout);
      assert.deepEqual([line.checked, line.recovered, line.known], [2, 0, 2]);
      assert.equal(api.requests.at(-1)!.body?.onlyFailures, undefined);
    });

    await t.step("no --store: a line for each store the tenant has credentials for", async () => {
      const voided = sampleVoidedPurchase({ voidedTimeMillis: String(Date.now() - 5 * 60_000) });
      play.addVoidedPurchase({ packageName: "com.example.app", voidedPurchase: voided });
      const result = await recover();
      assert.equal(result.code, 0, result.stderr);
      const [storea, storeb, ...more] = lines(result.stdout);
      assert.deepEqual(more, []);
      assert.equal(storea.store, "storea");
      assert.deepEqual(storeb, {
        tenantId,
        store: "storeb",
        checked: 1,
        recovered: 1,
        known: 0,
        invalid: 0,
        failedSendAttempts: {},
      });
      await eventually(
        () =>
          receiver.deliveries.some((d) =>
            (d.json as { externalId: string }).externalId === `voided:${voided.orderId}`
          ) || undefined,
        15_000,
        "the voided purchase's delivery",
      );
    });

    await t.step(
      "a window the store or the service's memory does not reach is refused",
      async () => {
        const old = new Date(Date.now() - 100 * 86_400_000).toISOString();
        const storea = await service.cli(
          "notifications",
          "recover",
          "--tenant",
          tenantId,
          "--since",
          old,
          "--store",
          "storea",
          "--environment",
          "production",
        );
        assert.equal(storea.code, 2);
        assert.equal(storea.json.error, "USAGE");
        assert.match(storea.json.message, /90 days.*EVENT_RETENTION_DAYS/);
        const storeb = await service.cli(
          "notifications",
          "recover",
          "--tenant",
          tenantId,
          "--since",
          new Date(Date.now() - 40 * 86_400_000).toISOString(),
          "--store",
          "storeb",
        );
        assert.equal(storeb.code, 2);
        assert.match(storeb.json.message, /30 days for store B/);
        const inverted = await recover("--until", new Date(Date.now() - 7_200_000).toISOString());
        assert.equal(inverted.code, 2);
        const notTime = await service.cli(
          "notifications",
          "recover",
          "--tenant",
          tenantId,
          "--since",
          "yesterday",
        );
        assert.equal(notTime.code, 2);
        assert.match(notTime.json.message, /ISO-8601/);
      },
    );

    await t.step("an inactive tenant is refused", async () => {
      await cliOk(service, "tenant", "deactivate", tenantId);
      const result = await recover();
      assert.equal(result.code, 1);
      assert.equal(result.json.error, "TENANT_INACTIVE");
      await cliOk(service, "tenant", "activate", tenantId);
    });

    await t.step("RECOVERY_INTERVAL=0: the service itself never read the stores", () => {
      assert.equal(service.logs.filter((line) => line.msg === "recovery_run").length, 0);
    });
  } finally {
    await stopAndDrop(service);
    await receiver.close();
    await play.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
