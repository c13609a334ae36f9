/**
 * An attacker replays genuine store A notifications: ones Apple signed months ago (published in
 * test data, logs, a TestFlight build), and ones the service accepted before, after retention has
 * pruned their events. The first are refused 401 `SIGNATURE_INVALID` as too old, with a log line;
 * the second answer as the duplicates they are, with the first event's id, and nothing is delivered
 * again (docs/security.md, "Old notifications").
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { databaseOf, startService, stopAndDrop } from "../helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "../helpers/fixtures.ts";
import {
  assertError,
  assertReceipt,
  cliOk,
  createTenantWithCallback,
  postJson,
} from "../helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../../simulators/storea_pki.ts";
import { StoreaSigner } from "../../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../../simulators/callback_receiver.ts";

const VECTORS = new URL("../fixtures/storea/real-sandbox/", import.meta.url);
const DAY_MS = 86_400_000;

Deno.test("replay: a real Apple notification signed months ago is refused as too old", async () => {
  const index = JSON.parse(await Deno.readTextFile(new URL("index.json", VECTORS)));
  const service = await startService();
  const dir = await Deno.makeTempDir();
  try {
    const { tenantId } = await createTenantWithCallback(service, null);
    const args = storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir));
    args[args.indexOf("--bundle-id") + 1] = index[0].bundleId;
    await cliOk(service, ...args);
    const signedPayload = (await Deno.readTextFile(new URL(index[0].file, VECTORS))).trim();
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;
    for (let i = 0; i < 3; i++) {
      const answer = await postJson(url, { signedPayload });
      assertError(answer, 401, "SIGNATURE_INVALID");
      assert.match(answer.json.message, /signed at 2025-.*more than 10d ago.*too old/);
    }
    // Said in the log, once for the three: the sender can repeat it at will.
    const lines = service.logs.filter((line) => line.msg === "storea_notification_too_old");
    assert.equal(lines.length, 1);
    assert.equal(lines[0].level, "warn");
    assert.equal(lines[0].tenantId, tenantId);
    assert.equal(lines[0].signedDate, new Date(index[0].signedDate).toISOString());
    const sql = databaseOf(service);
    try {
      const [{ count }] = await sql`SELECT count(*)::int AS count FROM events`;
      assert.equal(count, 0);
    } finally {
      await sql.end();
    }
  } finally {
    await stopAndDrop(service);
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("replay: a notification whose event retention pruned is still a duplicate", async () => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      STOREA_NOTIFICATION_MAX_AGE: "3d",
      EVENT_RETENTION_DAYS: "1",
    },
  });
  const sql = databaseOf(service);
  try {
    const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
    receiver.setSecrets([secret!]);
    await cliOk(service, ...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;
    // Signed two days ago: inside the receiver's 3 days, outside the 1 day of retention.
    const payload = await signer.notificationPayload({
      notificationType: "DID_RENEW",
      transaction: signer.sampleTransaction({}),
      signedDate: Date.now() - 2 * DAY_MS,
    });
    const signedPayload = await signer.signNotification(payload);
    const externalId = payload.notificationUUID;
    const eventId = assertReceipt(await postJson(url, { signedPayload }), {
      externalId,
      isNew: true,
      enqueuedDelivery: true,
    });
    await receiver.waitFor(1);
    // The event and its delivery as retention finds them two days later.
    await sql`UPDATE events SET received_at = now() - interval '2 days' WHERE id = ${eventId}`;
    await sql`
      UPDATE deliveries SET created_at = now() - interval '2 days',
                            updated_at = now() - interval '2 days'
      WHERE event_id = ${eventId}`;
    const pruned = await service.cli("retention", "run");
    assert.equal(pruned.code, 0, pruned.stderr);
    assert.deepEqual([pruned.json.deliveries, pruned.json.eventKeysKept], [1, 1]);

    // The attacker posts it again: a duplicate of the first event, and nothing is sent.
    const duplicate = assertReceipt(await postJson(url, { signedPayload }), {
      externalId,
      isNew: false,
      enqueuedDelivery: false,
    });
    assert.equal(duplicate, eventId, "the duplicate answers with the first event's id");
    const [{ deliveries }] = await sql`SELECT count(*)::int AS deliveries FROM deliveries`;
    assert.equal(deliveries, 0);
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(receiver.deliveries.length, 1);

    // Signed four days ago, beyond the receiver's 3 days: refused, whatever is kept.
    const old = await signer.signNotification(
      await signer.notificationPayload({
        notificationType: "DID_RENEW",
        transaction: signer.sampleTransaction({}),
        signedDate: Date.now() - 4 * DAY_MS,
      }),
    );
    const refused = await postJson(url, { signedPayload: old });
    assertError(refused, 401, "SIGNATURE_INVALID");
    assert.match(refused.json.message, /more than 3d ago/);
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});
