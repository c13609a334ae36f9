/**
 * `purchase-relay trigger`: with `deno task dev` running, the printed trigger commands make the
 * service deliver a signed event of the chosen type to the tenant's callback (here a callback
 * receiver on loopback); it is refused in production and without `deno task dev`. And its
 * reading of STORE and TYPE, without processes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { parseTriggerChoice } from "../src/cli/trigger.ts";
import { UsageError } from "../src/cli/command.ts";
import { freshDatabase, runCli, TEST_ENCRYPTION_KEY } from "./helpers/service.ts";
import { runPrinted, shellWords, startDevLoop } from "./helpers/dev_loop.ts";
import { createTenantStoreKeys, writeTenantStoreKeys } from "../scripts/simulated_stores.ts";

Deno.test("trigger: a store A type with subtype and a store B subscription type, delivered signed", async () => {
  const database = await freshDatabase();
  const env = { ...database.env, ENCRYPTION_KEY: TEST_ENCRYPTION_KEY, NODE_ENV: "test" };
  const dev = await startDevLoop({ ...env, PORT: "0" });
  const receiver = await startCallbackReceiver({
    secrets: [dev.banner.webhookSecret],
    rejectInvalidSignatures: true,
  });
  try {
    const { banner } = dev;
    // The printed set-callback line, pointed at this receiver instead of localhost:3000.
    assert.ok(banner.setCallbackLine.endsWith("--url http://localhost:3000/webhooks"));
    const setCallback = await runPrinted(
      banner.setCallbackLine.replace("http://localhost:3000/webhooks", receiver.url),
      env,
    );
    assert.equal(setCallback.code, 0, setCallback.stderr);
    assert.equal(setCallback.json.callbackUrl, receiver.url);

    const printed = banner.triggerLines.find((line) => / trigger storea DID_RENEW /.test(line));
    assert.ok(printed, banner.triggerLines.join("\n"));
    const storea = await runPrinted(
      printed.replace("DID_RENEW", "DID_RENEW --subtype BILLING_RECOVERY"),
      env,
    );
    assert.equal(storea.code, 0, storea.stderr);
    assert.equal(storea.json.event, "subscription.recovered");
    assert.equal(storea.json.reason, "billing_recovery");
    assert.equal(storea.json.platformEvent, "storea.did_renew");
    assert.equal(storea.json.isNew, true);
    assert.equal(storea.json.delivery.status, "delivered", storea.stdout);
    assert.equal(storea.json.delivery.responseCode, 200);

    const storebLine = banner.triggerLines.find((line) =>
      / trigger storeb subscription\.4 /.test(line)
    );
    assert.ok(storebLine, banner.triggerLines.join("\n"));
    const storeb = await runPrinted(storebLine, env);
    assert.equal(storeb.code, 0, storeb.stderr);
    assert.equal(storeb.json.event, "subscription.purchased");
    assert.equal(storeb.json.platformEvent, "storeb.subscription.4");

    const [first, second] = await receiver.waitFor(2, 15_000);
    for (const delivery of [first, second]) {
      assert.ok(delivery.signatureValid, delivery.body);
      assert.equal(delivery.answeredStatus, 200);
    }
    // deno-lint-ignore no-explicit-any
    const a = first.json as any, b = second.json as any;
    assert.deepEqual(
      [a.event, a.reason, a.platformEvent, a.source, a.tenantId, a.eventId],
      [
        "subscription.recovered",
        "billing_recovery",
        "storea.did_renew",
        "storea",
        banner.tenantId,
        storea.json.eventId,
      ],
    );
    assert.equal(first.headers["x-service-event"], "subscription.recovered");
    // The subject is the simulated purchase the printed store A verify command verifies.
    const storeaVerify = JSON.parse(shellWords(banner.curlLines[0]).at(-1)!);
    assert.equal(a.subject.key, storeaVerify.transactionId);
    assert.deepEqual(
      [b.event, b.platformEvent, b.source, b.eventId],
      ["subscription.purchased", "storeb.subscription.4", "storeb", storeb.json.eventId],
    );
    const storebVerify = JSON.parse(shellWords(banner.curlLines[1]).at(-1)!);
    assert.equal(b.subject.key, storebVerify.purchaseToken);

    // Refused in production, before anything is signed: no event, no delivery.
    const refused = await runPrinted(printed, {
      ...env,
      NODE_ENV: "production",
    });
    assert.equal(refused.code, 1, refused.stderr);
    assert.equal(refused.json.error, "DEV_ONLY");
    const deliveries = await runCli(["deliveries", "list", "--tenant", banner.tenantId], env);
    assert.equal(deliveries.json.deliveries.length, 2, deliveries.stdout);
    assert.equal(receiver.deliveries.length, 2);
  } finally {
    await receiver.close();
    assert.equal(await dev.stop(), 0, dev.output());
    await database.drop();
  }
});

Deno.test("trigger: refused without deno task dev, and with a stale signer file", async () => {
  const database = await freshDatabase({ migrated: true });
  try {
    const tenant = await runCli(["tenant", "create", "--name", "No dev"], database.env);
    assert.equal(tenant.code, 0, tenant.stderr);
    const args = ["trigger", "storea", "DID_RENEW", "--tenant", tenant.json.id];
    const missing = await runCli(args, database.env);
    assert.equal(missing.code, 1, missing.stderr);
    assert.equal(missing.json.error, "SIMULATORS_NOT_RUNNING");
    assert.match(missing.json.message, /deno task dev/);

    // A dev loop that was killed leaves its file behind; nothing answers at its address.
    const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (closed.addr as Deno.NetAddr).port;
    closed.close();
    await Deno.mkdir(join(database.dataDir, "dev"), { recursive: true });
    await Deno.writeTextFile(
      join(database.dataDir, "dev", "signer.json"),
      JSON.stringify({
        url: `http://127.0.0.1:${port}/sign`,
        token: "stale",
        serviceUrl: `http://127.0.0.1:${port}`,
      }),
    );
    // Nothing is asked of the signer for a tenant whose receiver would refuse it.
    const withoutCredentials = await runCli(args, database.env);
    assert.equal(withoutCredentials.code, 1, withoutCredentials.stderr);
    assert.equal(withoutCredentials.json.error, "CREDENTIALS_MISSING");

    const keys = await writeTenantStoreKeys(database.dataDir, await createTenantStoreKeys());
    const credentials = await runCli([
      "storea",
      "set-credentials",
      tenant.json.id,
      "--bundle-id",
      "com.example.app",
      "--key-id",
      "KEY1234567",
      "--issuer-id",
      crypto.randomUUID(),
      "--private-key-file",
      keys.storeaKeyPath,
    ], database.env);
    assert.equal(credentials.code, 0, credentials.stderr);
    const stale = await runCli(args, database.env);
    assert.equal(stale.code, 1, stale.stderr);
    assert.equal(stale.json.error, "SIMULATORS_NOT_RUNNING");
    assert.match(stale.json.message, /did not answer/);
  } finally {
    await database.drop();
  }
});

Deno.test("trigger: STORE and TYPE are read as the catalog names them", () => {
  assert.deepEqual(parseTriggerChoice("storea", "did_renew", { subtype: "billing_recovery" }), {
    store: "storea",
    notificationType: "DID_RENEW",
    subtype: "BILLING_RECOVERY",
  });
  assert.deepEqual(parseTriggerChoice("storeb", "subscription.4"), {
    store: "storeb",
    notification: { kind: "subscription", notificationType: 4 },
  });
  assert.deepEqual(parseTriggerChoice("storeb", "voided", { subtype: "partial_refund" }), {
    store: "storeb",
    notification: { kind: "voided_purchase", refundType: 2 },
  });
  assert.deepEqual(parseTriggerChoice("storeb", "voided_purchase"), {
    store: "storeb",
    notification: { kind: "voided_purchase", refundType: 1 },
  });
  assert.deepEqual(parseTriggerChoice("storeb", "test"), {
    store: "storeb",
    notification: { kind: "test" },
  });
  assert.deepEqual(parseTriggerChoice("storeb", "one_time_product.2"), {
    store: "storeb",
    notification: { kind: "one_time_product", notificationType: 2 },
  });
  const refusals: [string, string, string | undefined, RegExp][] = [
    ["storea", "NOT_A_TYPE", undefined, /no notification type NOT_A_TYPE.*DID_RENEW/],
    ["storea", "DID_CHANGE_RENEWAL_STATUS", undefined, /AUTO_RENEW_DISABLED/],
    ["storea", "DID_RENEW", "not a subtype!", /is not a subtype/],
    ["storeb", "subscription.14", undefined, /no notification subscription\.14/],
    ["storeb", "subscription.4", "VOLUNTARY", /--subtype is for store A/],
    ["storeb", "voided", "half_refund", /full_refund or partial_refund/],
    ["storec", "test", undefined, /storea or storeb/],
  ];
  for (const [store, type, subtype, message] of refusals) {
    assert.throws(
      () => parseTriggerChoice(store, type, { subtype }),
      (error) => error instanceof UsageError && message.test(error.message),
      `${store} ${type} ${subtype}`,
    );
  }
});
