/**
 * The relay across processes: two service processes on one database deliver each event exactly
 * once, and a process killed right after answering 200 still has its event delivered once it (or
 * another process) runs again.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { databaseOf, ENGINE, runCli, startService, stopAndDrop } from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { deliveryReaches, eventually, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

interface Fixture {
  env: Record<string, string>;
  signer: StoreaSigner;
  dir: string;
}

async function fixture(): Promise<Fixture> {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  return {
    dir,
    signer: new StoreaSigner(pki, { bundleId: "com.example.app" }),
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s,1s,1s",
      DELIVERY_TIMEOUT: "1s",
      // Fewer slots per process than the tenant's cap (8): one process cannot hold all of the
      // tenant's work, so both take part whichever claims faster (claims and records are batched).
      DELIVERY_CONCURRENCY: "4",
    },
  };
}

async function signedRenewal(signer: StoreaSigner): Promise<string> {
  return await signer.signNotification(
    await signer.notificationPayload({
      notificationType: "DID_RENEW",
      transaction: signer.sampleTransaction({}),
    }),
  );
}

Deno.test({
  name: "two processes on one database deliver every event exactly once",
  // Replicas run on PostgreSQL; the embedded engine serves one service process.
  ignore: ENGINE === "embedded",
}, async () => {
  const { env, signer, dir } = await fixture();
  const receiver = await startCallbackReceiver();
  const first = await startService({ env });
  const second = await startService({ env, db: first.db });
  try {
    const tenant = await first.cli(
      "tenant",
      "create",
      "--name",
      "T",
      "--callback-url",
      receiver.url,
    );
    assert.equal(tenant.code, 0, tenant.stderr);
    const tenantId = tenant.json.id;
    receiver.setSecrets([tenant.json.webhookSecret]);
    const creds = await first.cli(...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
    assert.equal(creds.code, 0, creds.stderr);
    // Some callbacks fail once, so retries (claimed by either process) are part of the run; fewer
    // than FAILING_CALLBACK_STREAK in a row, or the tenant would get one slot in the cluster and
    // whichever process holds it could send everything alone.
    receiver.script({ status: 500, times: 4 });

    const count = 60;
    const eventIds = new Set<string>();
    const services = [first, second];
    await Promise.all(Array.from({ length: count }, async (_, i) => {
      const service = services[i % 2];
      const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
        signedPayload: await signedRenewal(signer),
      });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      eventIds.add(answer.json.eventId);
    }));
    assert.equal(eventIds.size, count);

    const accepted = await eventually(
      () => {
        const done = receiver.accepted();
        return done.length >= count ? done : undefined;
      },
      30_000,
      `${count} deliveries`,
    );
    await new Promise((resolve) => setTimeout(resolve, 1500)); // time for any duplicate
    const perEvent = new Map<string, number>();
    for (const delivery of receiver.accepted()) {
      const id = delivery.headers["x-service-event-id"];
      perEvent.set(id, (perEvent.get(id) ?? 0) + 1);
    }
    assert.equal(perEvent.size, count, "every event delivered");
    assert.deepEqual([...perEvent.values()].filter((n) => n !== 1), [], "none twice");
    assert.ok(accepted.every((d) => eventIds.has(d.headers["x-service-event-id"])));
    // Both processes did some of the sending.
    const senders = new Set(
      [first, second].filter((s) => s.logs.some((l) => l.msg === "delivery_attempt")),
    );
    assert.equal(senders.size, 2, "both dispatchers took part");
  } finally {
    await second.stop();
    await stopAndDrop(first);
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a process killed right after a 200 still has its event delivered", async () => {
  const { env, signer, dir } = await fixture();
  const receiver = await startCallbackReceiver();
  const service = await startService({ env });
  const db = service.db;
  let restarted: Awaited<ReturnType<typeof startService>> | undefined;
  try {
    const tenant = await service.cli(
      "tenant",
      "create",
      "--name",
      "T",
      "--callback-url",
      receiver.url,
    );
    const tenantId = tenant.json.id;
    receiver.setSecrets([tenant.json.webhookSecret]);
    await service.cli(...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
    // The first attempt hangs, so the kill lands while it is in flight (or before it starts).
    receiver.script({ hang: true });
    const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
      signedPayload: await signedRenewal(signer),
    });
    assert.equal(answer.status, 200);
    const eventId = answer.json.eventId;
    await service.stop("SIGKILL");

    restarted = await startService({ env, db });
    const sql = databaseOf(restarted);
    try {
      const row = await deliveryReaches(sql, eventId, "delivered", 20_000);
      assert.equal(row.last_response_code, 200);
    } finally {
      await sql.end();
    }
    const delivered = receiver.accepted().filter((d) =>
      d.headers["x-service-event-id"] === eventId
    );
    assert.equal(delivered.length, 1);
    assert.equal(delivered[0].signatureValid, true);
    const listed = await runCli(["deliveries", "list", "--tenant", tenantId], restarted.env);
    assert.equal(listed.json.deliveries[0].status, "delivered");
  } finally {
    if (restarted) await stopAndDrop(restarted);
    else await db.drop();
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "a second service on a served embedded database refuses to start",
  ignore: ENGINE !== "embedded",
}, async () => {
  const first = await startService();
  try {
    const second = await startService({ db: first.db, waitUntilListening: false });
    const fatal = await second.waitForLog((l) => l.msg === "startup_failed");
    assert.equal(fatal.level, "fatal");
    assert.equal(fatal.code, "DATABASE_UNAVAILABLE");
    assert.match(JSON.stringify(fatal), /already served by another process/);
    assert.equal((await second.exited).code, 1);
  } finally {
    await stopAndDrop(first);
  }
});
