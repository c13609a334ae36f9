/**
 * A rotation of `ENCRYPTION_KEY` in running services, by the procedure of docs/operations.md
 * ("Rotating `ENCRYPTION_KEY`"): deploy `ENCRYPTION_KEY=new` with `ENCRYPTION_KEY_PREVIOUS=old`,
 * run `encryption rotate-key` under traffic, remove the previous key. Real service processes
 * verify against the App Store simulator, receive signed notifications and deliver them signed to
 * a callback receiver that refuses bad signatures, at every step. On PostgreSQL two replicas, one
 * still on the old configuration while the other has the new one; on the embedded engine one
 * process, restarted at each step.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  ENGINE,
  freshDatabase,
  runCli,
  type RunningService,
  startService,
  TEST_ENCRYPTION_KEY,
} from "./helpers/service.ts";
import { storeaCredentialArgs, TEST_ISSUER_ID, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { eventually, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startStoreaApiSimulator } from "../simulators/storea_api.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

const NEW_KEY = new Uint8Array(32).fill(9).toBase64();
const TRANSACTION_ID = "2000000000000101";

Deno.test("key rotation: services keep verifying and delivering through it", async () => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const api = await startStoreaApiSimulator({ signer });
  const keyFile = await writeStoreaKeyFile(dir);
  await api.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: "com.example.app",
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  await api.addTransaction(
    "production",
    signer.sampleTransaction({ transactionId: TRANSACTION_ID }),
  );
  const receiver = await startCallbackReceiver({ rejectInvalidSignatures: true });
  const db = await freshDatabase();
  const common = {
    ...api.serviceEnv,
    STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
    VALIDATION_AUDIT_ENABLED: "true",
    DELIVERY_RETRY_SCHEDULE: "1s,1s,1s",
  };
  const oldConfig = { ...common, ENCRYPTION_KEY: TEST_ENCRYPTION_KEY };
  const rotating = {
    ...common,
    ENCRYPTION_KEY: NEW_KEY,
    ENCRYPTION_KEY_PREVIOUS: TEST_ENCRYPTION_KEY,
  };
  const newConfig = { ...common, ENCRYPTION_KEY: NEW_KEY };
  const running = new Set<RunningService>();
  const start = async (env: Record<string, string>) => {
    const service = await startService({ db, env });
    running.add(service);
    return service;
  };
  const stop = async (service: RunningService) => {
    running.delete(service);
    assert.equal(await service.stop(), 0);
  };

  let verifies = 0;
  const eventIds: string[] = [];
  try {
    let a = await start(oldConfig);
    const tenant = await a.cli("tenant", "create", "--name", "T", "--callback-url", receiver.url);
    assert.equal(tenant.code, 0, tenant.stderr);
    const tenantId = tenant.json.id;
    receiver.setSecrets([tenant.json.webhookSecret]);
    assert.equal((await a.cli(...storeaCredentialArgs(tenantId, keyFile))).code, 0);
    const key = await a.cli("key", "create", tenantId);
    assert.equal(key.code, 0, key.stderr);

    /** One verify and one notification through `service`: both answered 200. */
    const traffic = async (service: RunningService) => {
      const verify = await postJson(
        `${service.url}/v1/storea/verify`,
        { transactionId: TRANSACTION_ID },
        { authorization: `Bearer ${key.json.key}` },
      );
      assert.equal(verify.status, 200, JSON.stringify(verify.json));
      assert.equal(verify.json.valid, true);
      verifies++;
      const signedPayload = await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      );
      const notified = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
        signedPayload,
      });
      assert.equal(notified.status, 200, JSON.stringify(notified.json));
      eventIds.push(notified.json.eventId);
    };
    /** Every notification so far was delivered, with a signature the tenant accepts. */
    const allDelivered = () =>
      eventually(
        () => {
          const delivered = new Set(
            receiver.accepted().map((d) => d.headers["x-service-event-id"]),
          );
          return eventIds.every((id) => delivered.has(id)) ? true : undefined;
        },
        20_000,
        `${eventIds.length} deliveries`,
      );
    const ready = async (service: RunningService) => {
      const answer = await fetch(`${service.url}/ready`);
      return { status: answer.status, json: await answer.json() };
    };

    await traffic(a);
    await allDelivered();

    // 1. The new configuration is rolled out. On PostgreSQL a replica starts with it while the
    // first one still has the old one; both serve.
    let b: RunningService;
    if (ENGINE === "postgresql") {
      b = await start(rotating);
      await traffic(a);
      await traffic(b);
      assert.deepEqual((await ready(a)).json.checks, { db: "ok", encryption: "ok" });
      assert.equal((await ready(a)).json.encryptionKey, undefined);
      await stop(a);
      a = await start(rotating);
    } else {
      await stop(a);
      a = b = await start(rotating);
    }
    const before = await ready(b);
    assert.equal(before.status, 200, JSON.stringify(before.json));
    assert.equal(before.json.encryptionKey, "ENCRYPTION_KEY_PREVIOUS");
    const previousSet = b.logs.find((line) => line.msg === "encryption_key_previous_set");
    assert.equal(previousSet?.canaryOpensWith, "ENCRYPTION_KEY_PREVIOUS");
    await traffic(a);
    await traffic(b);
    await allDelivered();

    // 2. rotate-key, while both keep receiving verifies and notifications.
    // The stream goes on past the credentials cache's second, so that values sealed with the
    // new key are opened too.
    const rotation = runCli(["encryption", "rotate-key"], { ...db.env, ...rotating });
    let rotatedAt: number | null = null;
    rotation.finally(() => rotatedAt = Date.now()).catch(() => {});
    const during = async (service: RunningService) => {
      while (rotatedAt === null || Date.now() - rotatedAt < 1_500) await traffic(service);
    };
    await Promise.all([during(a), during(b)]);
    const result = await rotation;
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.json.resealed.storeaCredentials, 1);
    assert.equal(result.json.resealed.webhookSecrets, 1);
    for (const service of new Set([a, b])) {
      const answer = await ready(service);
      assert.equal(answer.status, 200);
      assert.equal(answer.json.encryptionKey, "ENCRYPTION_KEY");
    }
    await allDelivered();
    if (ENGINE === "postgresql") {
      // A replica forgotten on the old configuration is taken out of the load balancer.
      const forgotten = await start(oldConfig);
      const answer = await ready(forgotten);
      assert.equal(answer.status, 503);
      assert.match(answer.json.checks.encryption, /^fail: ENCRYPTION_KEY is not the key/);
      await stop(forgotten);
    }

    // 3. The previous key is removed: the new one alone serves everything.
    for (const service of new Set([a, b])) await stop(service);
    a = await start(newConfig);
    b = ENGINE === "postgresql" ? await start(newConfig) : a;
    for (const service of new Set([a, b])) {
      const answer = await ready(service);
      assert.deepEqual(answer.json, {
        status: "ok",
        version: "dev",
        checks: { db: "ok", encryption: "ok" },
      });
      await traffic(service);
    }
    await allDelivered();
    for (const service of [...running]) await stop(service);

    // The audit has every verify, before, during and after the rotation, under one hash.
    const lookup = await runCli(
      ["audit", "lookup", tenantId, "--subject", TRANSACTION_ID, "--limit", "10000"],
      { ...db.env, ...newConfig },
    );
    assert.equal(lookup.code, 0, lookup.stderr);
    assert.equal(lookup.json.entries.length, verifies);
  } finally {
    for (const service of running) await service.stop();
    await db.drop();
    await receiver.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
