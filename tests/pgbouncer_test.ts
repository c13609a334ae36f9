/**
 * The service behind PgBouncer in transaction mode (docs/postgresql.md, "Connection poolers"):
 * real service processes and the real CLI whose `DATABASE_URL` goes through a PgBouncer the test
 * starts itself, with two server connections for everything, so that transactions keep landing
 * in sessions other than the one before.
 *
 * - Undeclared, the pooler is found at boot and refused with a clear error.
 * - With `DATABASE_POOLER=transaction` and `DATABASE_LISTEN_URL`: two replicas migrate an empty
 *   database at once, verify, receive notifications, deliver them (first attempt at once,
 *   retries), the CLI works, and `deliveries retry` wakes a dispatcher through `LISTEN`.
 * - Without `DATABASE_LISTEN_URL`: the dispatchers poll, and `deliveries retry` is sent within
 *   the poll interval.
 *
 * PgBouncer pools a PostgreSQL server, so these run with `TEST_DATABASE_URL` set (the PostgreSQL
 * run) and are skipped on the embedded engine.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import postgres from "postgres";
import {
  ENGINE,
  freshDatabase,
  runCli,
  type RunningService,
  startService,
  type TestDatabase,
} from "./helpers/service.ts";
import { type PgBouncer, startPgBouncer } from "./helpers/pgbouncer.ts";
import { storeaCredentialArgs, TEST_ISSUER_ID, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { cliOk, deliveryReaches, eventually, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startStoreaApiSimulator } from "../simulators/storea_api.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { NOTIFY_POLL_INTERVAL_MS } from "../src/db/pooler.ts";
import { ConfigError, readConfig } from "../src/config.ts";

const ADMIN_URL = Deno.env.get("TEST_DATABASE_URL") ?? "";
const onPostgres = { ignore: ENGINE !== "postgresql" };
if (ENGINE !== "postgresql") {
  console.log("pgbouncer_test: PgBouncer runs in front of PostgreSQL only (TEST_DATABASE_URL)");
}

/** A transaction-mode PgBouncer in front of the test server, with two server connections. */
function transactionPooler(): Promise<PgBouncer> {
  return startPgBouncer({ upstream: ADMIN_URL, poolMode: "transaction", poolSize: 2 });
}

/** `db` reached through `bouncer`, with `env` added. */
function throughPooler(
  db: TestDatabase,
  bouncer: PgBouncer,
  env: Record<string, string>,
): TestDatabase {
  return { ...db, env: { ...db.env, DATABASE_URL: bouncer.through(db.env.DATABASE_URL), ...env } };
}

/**
 * Waits, if need be, until the minute sweep (`Deno.cron` at second 0 of each minute) is at least
 * `clearMs` away, so that work done within `clearMs` can only come from a wake-up.
 */
async function clearOfMinuteSweep(clearMs: number): Promise<void> {
  const intoMinute = Date.now() % 60_000;
  if (intoMinute < 1_000 || intoMinute + clearMs > 59_000) {
    await new Promise((resolve) => setTimeout(resolve, 61_000 - intoMinute));
  }
}

/** Asserts that `deliveries retry` gets a delivered delivery sent again within `withinMs`. */
async function retryIsWokenWithin(
  service: RunningService,
  receiver: { accepted(): { headers: Record<string, string> }[] },
  deliveryId: string,
  eventId: string,
  withinMs: number,
): Promise<void> {
  const sentBefore = () =>
    receiver.accepted().filter((d) => d.headers["x-service-event-id"] === eventId).length;
  const before = sentBefore();
  await clearOfMinuteSweep(withinMs + 10_000);
  const retried = await cliOk(service, "deliveries", "retry", deliveryId);
  assert.deepEqual(retried.queued, [deliveryId]);
  await eventually(
    () => sentBefore() > before ? true : undefined,
    withinMs,
    "the retried delivery sent again before the minute sweep",
  );
}

Deno.test({
  name: "pgbouncer: an undeclared transaction pooler is refused at boot and by the CLI",
  ...onPostgres,
}, async () => {
  const bouncer = await transactionPooler();
  const direct = await freshDatabase();
  try {
    const db = throughPooler(direct, bouncer, {});
    const service = await startService({ db, waitUntilListening: false });
    const fatal = await service.waitForLog((line) => line.level === "fatal");
    assert.equal((await service.exited).code, 1);
    assert.equal(fatal.msg, "startup_failed");
    assert.equal(fatal.code, "POOLER_MODE_MISMATCH");
    assert.match(fatal.reason, /DATABASE_URL leads to a connection pooler in transaction mode/);
    assert.match(fatal.reason, /set DATABASE_POOLER=transaction/);

    const cli = await runCli(["tenant", "list"], db.env);
    assert.equal(cli.code, 1);
    assert.equal(cli.json.error, "POOLER_MODE_MISMATCH", cli.stderr);

    // A LISTEN URL through the pooler is refused too: LISTEN would hear nothing there.
    const listening = await startService({
      db: throughPooler(direct, bouncer, {
        DATABASE_POOLER: "transaction",
        DATABASE_LISTEN_URL: bouncer.through(direct.env.DATABASE_URL),
      }),
      waitUntilListening: false,
    });
    const refused = await listening.waitForLog((line) => line.level === "fatal");
    assert.equal(refused.code, "POOLER_MODE_MISMATCH");
    assert.match(refused.reason, /^DATABASE_LISTEN_URL leads to a connection pooler/);
    assert.equal((await listening.exited).code, 1);
  } finally {
    await direct.drop();
    await bouncer.stop();
  }
});

Deno.test({
  name: "pgbouncer: replicas behind a transaction pooler migrate, verify, receive and deliver",
  ...onPostgres,
}, async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-pgbouncer-" });
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
  const receiver = await startCallbackReceiver();
  const bouncer = await transactionPooler();
  const direct = await freshDatabase();
  const db = throughPooler(direct, bouncer, {
    DATABASE_POOLER: "transaction",
    DATABASE_LISTEN_URL: direct.env.DATABASE_URL,
  });
  const env = {
    ...api.serviceEnv,
    STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
    DELIVERY_RETRY_SCHEDULE: "1s,1s,1s",
    DELIVERY_TIMEOUT: "2s",
  };
  const replicas: RunningService[] = [];
  const sql = postgres(direct.env.DATABASE_URL, { max: 1, onnotice: () => {} });
  try {
    await t.step("two replicas booting at once on an empty database migrate it once", async () => {
      replicas.push(
        ...await Promise.all([startService({ db, env }), startService({ db, env })]),
      );
      const migrationFiles = [...Deno.readDirSync(new URL("../migrations/", import.meta.url))]
        .filter((entry) => entry.name.endsWith(".sql")).length;
      const applied = await sql`SELECT name FROM schema_migrations`;
      assert.equal(applied.length, migrationFiles);
      const appliers = replicas.filter((r) => r.logs.some((l) => l.msg === "migrations_applied"));
      assert.equal(appliers.length, 1, "one replica applied them, the other found them done");
      for (const replica of replicas) {
        assert.ok(!replica.logs.some((l) => l.msg === "delivery_wakeup_polling"));
      }
    });

    const [first, second] = replicas;
    let tenantId = "";
    let apiKey = "";
    await t.step("the CLI works through the pooler", async () => {
      const tenant = await cliOk(
        first,
        "tenant",
        "create",
        "--name",
        "Pooled",
        "--callback-url",
        receiver.url,
      );
      tenantId = tenant.id;
      receiver.setSecrets([tenant.webhookSecret]);
      await cliOk(first, ...storeaCredentialArgs(tenantId, keyFile));
      apiKey = (await cliOk(first, "key", "create", tenantId, "--env", "test")).key;
      const listed = await cliOk(second, "tenant", "list");
      assert.ok(JSON.stringify(listed).includes(tenantId));
    });

    await t.step("both replicas verify purchases", async () => {
      for (const [i, replica] of replicas.entries()) {
        const transactionId = `200000000000090${i}`;
        await api.addTransaction("production", signer.sampleTransaction({ transactionId }));
        const answer = await postJson(
          `${replica.url}/v1/storea/verify`,
          { transactionId },
          { authorization: `Bearer ${apiKey}` },
        );
        assert.equal(answer.status, 200, JSON.stringify(answer.json));
        assert.equal(answer.json.valid, true);
        assert.equal(answer.json.transaction.transactionId, transactionId);
      }
    });

    let retriedDelivery = { id: "", eventId: "" };
    await t.step("notifications are delivered once each, with retries", async () => {
      // The first answers fail, so retries (claimed by either replica) are part of the run.
      receiver.script({ status: 500, times: 4 });
      const count = 16;
      const eventIds = await Promise.all(Array.from({ length: count }, async (_, i) => {
        const answer = await postJson(`${replicas[i % 2].url}/v1/webhooks/storea/${tenantId}`, {
          signedPayload: await signer.signNotification(
            await signer.notificationPayload({
              notificationType: "DID_RENEW",
              transaction: signer.sampleTransaction({}),
            }),
          ),
        });
        assert.equal(answer.status, 200, JSON.stringify(answer.json));
        return answer.json.eventId as string;
      }));
      const rows = await Promise.all(
        eventIds.map((eventId) => deliveryReaches(sql, eventId, "delivered", 30_000)),
      );
      const perEvent = new Map<string, number>();
      for (const delivery of receiver.accepted()) {
        assert.equal(delivery.signatureValid, true);
        const id = delivery.headers["x-service-event-id"];
        perEvent.set(id, (perEvent.get(id) ?? 0) + 1);
      }
      assert.deepEqual([...perEvent.keys()].sort(), [...eventIds].sort(), "every event delivered");
      assert.deepEqual([...perEvent.values()].filter((n) => n !== 1), [], "none twice");
      assert.equal(rows.filter((row) => row.attempts > 1).length > 0, true, "some were retried");
      retriedDelivery = { id: rows[0].id, eventId: eventIds[0] };
    });

    await t.step("deliveries retry wakes a dispatcher through LISTEN", async () => {
      // Well within the poll interval: a LISTEN wakes at once, and nothing here polls.
      await retryIsWokenWithin(
        first,
        receiver,
        retriedDelivery.id,
        retriedDelivery.eventId,
        NOTIFY_POLL_INTERVAL_MS - 1_000,
      );
    });

    await t.step("the pooled sessions hold no named prepared statements", async () => {
      // Two transactions at once take both server connections of the pool.
      const pooled = postgres(bouncer.through(direct.env.DATABASE_URL), {
        max: 2,
        prepare: false,
        onnotice: () => {},
      });
      try {
        const sessions = await Promise.all([0, 1].map(() =>
          pooled.begin(async (tx) => {
            const [row] = await tx`
              SELECT pg_backend_pid() AS pid, (SELECT count(*)::int FROM pg_prepared_statements) AS n`;
            await tx`SELECT pg_sleep(0.2)`;
            return row;
          })
        ));
        assert.equal(new Set(sessions.map((s) => s.pid)).size, 2);
        assert.deepEqual(sessions.map((s) => s.n), [0, 0]);
      } finally {
        await pooled.end();
      }
    });
  } finally {
    await Promise.all(replicas.map((replica) => replica.stop()));
    await sql.end();
    await direct.drop();
    await bouncer.stop();
    await receiver.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "pgbouncer: without DATABASE_LISTEN_URL the dispatcher polls for requeued work",
  ...onPostgres,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-pgbouncer-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const receiver = await startCallbackReceiver();
  const bouncer = await transactionPooler();
  const direct = await freshDatabase();
  const sql = postgres(direct.env.DATABASE_URL, { max: 1, onnotice: () => {} });
  let service: RunningService | undefined;
  try {
    service = await startService({
      db: throughPooler(direct, bouncer, { DATABASE_POOLER: "transaction" }),
      env: { STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")) },
    });
    const polling = await service.waitForLog((l) => l.msg === "delivery_wakeup_polling");
    assert.equal(polling.intervalMs, NOTIFY_POLL_INTERVAL_MS);
    assert.match(polling.hint, /DATABASE_LISTEN_URL/);

    const tenant = await cliOk(
      service,
      "tenant",
      "create",
      "--name",
      "P",
      "--callback-url",
      receiver.url,
    );
    receiver.setSecrets([tenant.webhookSecret]);
    await cliOk(service, ...storeaCredentialArgs(tenant.id, await writeStoreaKeyFile(dir)));
    const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenant.id}`, {
      signedPayload: await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      ),
    });
    assert.equal(answer.status, 200, JSON.stringify(answer.json));
    const eventId = answer.json.eventId;
    // The first attempt needs no wake-up: the receiving process sends it at once.
    const row = await deliveryReaches(sql, eventId, "delivered", 5_000);
    assert.equal(row.attempts, 1);

    // One poll interval, plus the time of one claim.
    await retryIsWokenWithin(service, receiver, row.id, eventId, NOTIFY_POLL_INTERVAL_MS + 3_000);
  } finally {
    await service?.stop();
    await sql.end();
    await direct.drop();
    await bouncer.stop();
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("config: DATABASE_POOLER, DATABASE_LISTEN_URL and DATABASE_CA_FILE", () => {
  const url = "postgres://u:topsecret@pooler.internal:6432/relay";
  const defaults = readConfig({ DATABASE_URL: url });
  assert.equal(defaults.databasePooler, "none");
  assert.equal(defaults.databaseListenUrl, null);
  assert.equal(defaults.databaseCaFile, null);
  const pooled = readConfig({
    DATABASE_URL: url,
    DATABASE_POOLER: "transaction",
    DATABASE_LISTEN_URL: "postgresql://u:topsecret@db.internal:5432/relay",
    DATABASE_CA_FILE: "/etc/purchase-relay/db-ca.pem",
  });
  assert.equal(pooled.databasePooler, "transaction");
  assert.equal(pooled.databaseListenUrl, "postgresql://u:topsecret@db.internal:5432/relay");
  assert.equal(pooled.databaseCaFile, "/etc/purchase-relay/db-ca.pem");

  const refusals: [Record<string, string>, string, RegExp][] = [
    [{ DATABASE_URL: url, DATABASE_POOLER: "session" }, "DATABASE_POOLER", /not one of none/],
    [{ DATABASE_POOLER: "transaction" }, "DATABASE_POOLER", /DATABASE_URL is not/],
    [{ DATABASE_LISTEN_URL: url }, "DATABASE_LISTEN_URL", /DATABASE_URL is not/],
    [{ DATABASE_CA_FILE: "/ca.pem" }, "DATABASE_CA_FILE", /DATABASE_URL is not/],
    [
      { DATABASE_URL: url, DATABASE_LISTEN_URL: "mysql://u:topsecret@db/relay" },
      "DATABASE_LISTEN_URL",
      /must start with postgres:\/\//,
    ],
  ];
  for (const [env, variable, reason] of refusals) {
    assert.throws(() => readConfig(env), (error) => {
      assert.ok(error instanceof ConfigError);
      assert.equal(error.variable, variable);
      assert.match(error.message, reason);
      assert.ok(!error.message.includes("topsecret"), "a URL is never quoted");
      return true;
    });
  }
});
