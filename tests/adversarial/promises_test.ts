/**
 * Promises the service makes that a regression would break without any other test noticing,
 * checked against the real database as someone who can read it, or take it away, would:
 * - secrets given to the CLI are stored sealed: no column holds a key, a service account or a
 *   webhook secret in clear (docs/security.md, "Secrets at rest");
 * - while the database is unreachable both receivers answer 500, never 200, so the stores send
 *   again and nothing is acknowledged that was not stored;
 * - the verify path writes nothing synchronously: it answers while the database refuses writes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import postgres from "postgres";
import {
  createTenantWithKey,
  databaseOf,
  ENGINE,
  freshDatabase,
  type RunningService,
  startService,
  stopAndDrop,
} from "../helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_ISSUER_ID,
  writeServiceAccountFile,
} from "../helpers/fixtures.ts";
import { cliOk, type JsonAnswer, postJson } from "../helpers/relay.ts";
import { relayFixture, signedRenewal, TcpProxy } from "../../resilience/support.ts";
import { startCallbackReceiver } from "../../simulators/callback_receiver.ts";
import {
  pushEnvelope,
  startPushTokenIssuer,
  subscriptionNotification,
} from "../../simulators/storeb_push.ts";
import { startStoreaApiSimulator } from "../../simulators/storea_api.ts";
import { sampleSubscriptionPurchase, startStorebSimulator } from "../../simulators/storeb_play.ts";
import { createServiceAccount } from "../../simulators/service_account.ts";

const ADMIN_URL = Deno.env.get("TEST_DATABASE_URL");
const PACKAGE = "com.example.app"; // the bundle and package of the fixtures' credentials
const AUDIENCE = "https://relay.example.com/push"; // the push audience of storebCredentialArgs
const PUSH_ACCOUNT = "push@example-project.iam.gserviceaccount.com";

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The base64 lines of a PEM, and the same joined: what a leak of the key would contain. */
function pemFragments(pem: string): string[] {
  const lines = pem.split("\n").map((line) => line.trim())
    .filter((line) => line.length >= 16 && !line.startsWith("-----"));
  return [...lines, lines.join("")];
}

/** Every row of every table of the service's schema, as JSON text. */
async function everyStoredValue(sql: postgres.Sql): Promise<string> {
  const tables = await sql<{ name: string }[]>`
    SELECT table_name AS name FROM information_schema.tables
    WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`;
  assert.ok(tables.length >= 5, `tables: ${tables.map((t) => t.name)}`);
  const rows: string[] = [];
  for (const { name } of tables) {
    for (const row of await sql`SELECT to_jsonb(t)::text AS row FROM ${sql(name)} t`) {
      rows.push(row.row);
    }
  }
  return rows.join("\n");
}

Deno.test("secrets given to the CLI are stored sealed: no column holds one in clear", async () => {
  const fixture = await relayFixture();
  const service = await startService({ env: fixture.env });
  const sql = databaseOf(service);
  try {
    const given = `whsec_${crypto.randomUUID()}${crypto.randomUUID()}`;
    const secretFile = join(fixture.dir, "webhook-secret.txt");
    await Deno.writeTextFile(secretFile, given);
    const tenant = await cliOk(
      service,
      "tenant",
      "create",
      "--name",
      "Sealed",
      "--callback-url",
      "http://127.0.0.1:9/hooks",
      "--webhook-secret-file",
      secretFile,
    );
    // The rotation keeps the given secret as the previous one: both are stored.
    const rotated = await cliOk(service, "tenant", "rotate-secret", tenant.id);
    await cliOk(service, ...storeaCredentialArgs(tenant.id, fixture.keyFile));
    const { path: accountFile, clientEmail } = await writeServiceAccountFile(fixture.dir);
    await cliOk(service, ...storebCredentialArgs(tenant.id, accountFile));

    const keyPem = await Deno.readTextFile(fixture.keyFile);
    const accountJson = await Deno.readTextFile(accountFile);
    const accountKey: string = JSON.parse(accountJson).private_key;
    const plaintexts = [
      given,
      rotated.webhookSecret,
      keyPem,
      JSON.stringify(keyPem),
      accountJson,
      JSON.stringify(accountJson),
      accountKey,
      JSON.stringify(accountKey),
      ...pemFragments(keyPem),
      ...pemFragments(accountKey),
    ];
    const stored = await everyStoredValue(sql);
    // The dump does see the tenant's rows: what is meant to be plain is there.
    for (const plain of [tenant.id, clientEmail, "com.example.app", TEST_ISSUER_ID]) {
      assert.ok(stored.includes(plain), `${plain} not found: the dump misses rows`);
    }
    for (const secret of plaintexts) {
      const hex = [...new TextEncoder().encode(secret)]
        .map((byte) => byte.toString(16).padStart(2, "0")).join("");
      assert.ok(!stored.includes(secret), `stored in clear: ${secret.slice(0, 24)}...`);
      assert.ok(!stored.includes(hex), `stored in clear as bytes: ${secret.slice(0, 24)}...`);
    }
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await fixture.cleanup();
  }
});

/** An outage of the database a running service uses, and its end. */
interface Outage {
  /** `failing`: the database answers with errors; `silent`: it does not answer at all. */
  kind: "failing" | "silent";
  begin(): Promise<void>;
  end(): Promise<void>;
}

/**
 * PostgreSQL goes away behind a TCP proxy: connections dropped and new ones closed (failing), or
 * the network partitioned (silent). The embedded engine lives inside the service and cannot go
 * away; through the socket the service shares, another client makes its one session refuse
 * writes (failing), or holds it in an open transaction (silent).
 */
function outagesOf(service: RunningService, proxy: TcpProxy | null): Outage[] {
  if (proxy !== null) {
    const now = (action: () => void) => () => Promise.resolve(action());
    return [
      { kind: "failing", begin: now(() => proxy.down()), end: now(() => proxy.restore()) },
      { kind: "silent", begin: now(() => proxy.partition()), end: now(() => proxy.restore()) },
    ];
  }
  let release = () => {};
  let held: Promise<unknown> = Promise.resolve();
  const sql = databaseOf(service);
  return [
    {
      kind: "failing",
      begin: () => refuseWrites(service, true),
      end: () => refuseWrites(service, false),
    },
    {
      kind: "silent",
      async begin() {
        const acquired = Promise.withResolvers<void>();
        const released = new Promise<void>((resolve) => release = resolve);
        held = sql.begin(async (tx) => {
          await tx`SELECT 1`;
          acquired.resolve();
          await released;
        });
        await acquired.promise;
      },
      async end() {
        release();
        await held;
        await sql.end();
      },
    },
  ];
}

Deno.test("both receivers answer 500, never 200, while the database is unreachable", async () => {
  const fixture = await relayFixture({ UPSTREAM_TIMEOUT: "1s" });
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  const db = await freshDatabase();
  let proxy: TcpProxy | null = null;
  const env: Record<string, string> = { ...fixture.env, ...issuer.serviceEnv };
  if (ENGINE === "postgresql") {
    const direct = new URL(db.env.DATABASE_URL);
    proxy = TcpProxy.start(Number(direct.port || 5432));
    const viaProxy = new URL(direct);
    viaProxy.port = String(proxy.port);
    env.DATABASE_URL = viaProxy.toString();
  }
  const service = await startService({ db, env });
  try {
    const created = await cliOk(
      service,
      "tenant",
      "create",
      "--name",
      "Outage",
      "--callback-url",
      receiver.url,
    );
    const tenantId: string = created.id;
    await cliOk(service, ...storeaCredentialArgs(tenantId, fixture.keyFile));
    const { path: accountFile } = await writeServiceAccountFile(fixture.dir);
    await cliOk(service, ...storebCredentialArgs(tenantId, accountFile, PUSH_ACCOUNT));
    const storeaNotification = async (signedPayload: string) =>
      await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, { signedPayload });
    const storebNotification = async (envelope: unknown) =>
      await postJson(`${service.url}/v1/webhooks/storeb/${tenantId}`, envelope, {
        authorization: `Bearer ${await issuer.mint({ audience: AUDIENCE, email: PUSH_ACCOUNT })}`,
      });
    const renewal = () =>
      pushEnvelope(subscriptionNotification(PACKAGE, {
        notificationType: 2,
        purchaseToken: `ptok-${crypto.randomUUID()}`,
        subscriptionId: "monthly",
      }));
    // Both receivers work before the outage.
    assert.equal((await storeaNotification(await signedRenewal(fixture.signer))).status, 200);
    assert.equal((await storebNotification(renewal())).status, 200);

    for (const outage of outagesOf(service, proxy)) {
      const storeaPayloads = [];
      for (let i = 0; i < 3; i++) storeaPayloads.push(await signedRenewal(fixture.signer));
      const storebEnvelopes = [renewal(), renewal(), renewal()];
      await outage.begin();
      let answers: JsonAnswer[];
      try {
        answers = await Promise.all([
          ...storeaPayloads.map(storeaNotification),
          ...storebEnvelopes.map(storebNotification),
        ]);
      } finally {
        await outage.end();
      }
      for (const answer of answers) {
        assert.equal(answer.status, 500, `${outage.kind}: ${JSON.stringify(answer.json)}`);
        assert.equal(answer.json.error, "INTERNAL_ERROR");
      }
      // The stores send them again, later: once the database is back, each is accepted.
      const resend = async (send: () => Promise<JsonAnswer>) => {
        const deadline = Date.now() + 30_000;
        let answer = await send();
        while (answer.status === 500 && Date.now() < deadline) {
          await sleep(500);
          answer = await send();
        }
        assert.equal(answer.status, 200, `${outage.kind}, resent: ${JSON.stringify(answer.json)}`);
      };
      for (const payload of storeaPayloads) await resend(() => storeaNotification(payload));
      for (const envelope of storebEnvelopes) await resend(() => storebNotification(envelope));
    }
  } finally {
    await service.stop();
    proxy?.close();
    await db.drop();
    await receiver.close();
    await issuer.close();
    await fixture.cleanup();
  }
});

/** Makes the database refuse every write of the service, or accept them again. */
async function refuseWrites(service: RunningService, refuse: boolean): Promise<void> {
  if (ENGINE === "embedded") {
    // One session for every connection: a SET reaches the service's connections too.
    const sql = databaseOf(service);
    await sql.unsafe(`SET default_transaction_read_only = ${refuse ? "on" : "off"}`);
    await sql.end();
    return;
  }
  const name = new URL(service.db.env.DATABASE_URL).pathname.slice(1);
  const admin = postgres(ADMIN_URL!, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(
      refuse
        ? `ALTER DATABASE ${name} SET default_transaction_read_only = on`
        : `ALTER DATABASE ${name} RESET default_transaction_read_only`,
    );
    // The setting applies to new sessions: end the service's, its pool opens new ones.
    await admin`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ${name}`;
  } finally {
    await admin.end();
  }
}

Deno.test("verify answers while the database refuses writes: it writes nothing synchronously", async () => {
  const fixture = await relayFixture();
  const storea = await startStoreaApiSimulator({ signer: fixture.signer });
  await storea.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: PACKAGE,
    privateKeyPem: await Deno.readTextFile(fixture.keyFile),
  });
  const transactionId = "2000000000000042";
  await storea.addTransaction("production", fixture.signer.sampleTransaction({ transactionId }));
  const play = await startStorebSimulator();
  const account = await createServiceAccount();
  await play.addServiceAccount(account);
  const purchaseToken = `ptok-${crypto.randomUUID()}`;
  play.addSubscription({
    packageName: PACKAGE,
    purchaseToken,
    purchase: sampleSubscriptionPurchase(),
  });
  const service = await startService({
    env: {
      ...fixture.env,
      ...storea.serviceEnv,
      ...play.serviceEnv,
      // The audit is written too, but later and in the background.
      VALIDATION_AUDIT_ENABLED: "true",
      VALIDATION_AUDIT_RETENTION_DAYS: "30",
    },
  });
  const sql = databaseOf(service);
  try {
    const { tenantId, key } = await createTenantWithKey(service);
    await cliOk(service, ...storeaCredentialArgs(tenantId, fixture.keyFile));
    const accountFile = join(fixture.dir, "play.json");
    await Deno.writeTextFile(accountFile, account.json);
    await cliOk(service, ...storebCredentialArgs(tenantId, accountFile));
    const auth = { authorization: `Bearer ${key}` };
    const verifyA = () => postJson(`${service.url}/v1/storea/verify`, { transactionId }, auth);
    const verifyB = () =>
      postJson(`${service.url}/v1/storeb/verify`, {
        packageName: PACKAGE,
        productId: "monthly",
        purchaseToken,
        type: "subscription",
      }, auth);
    /** A notification must be stored before it is answered: refused writes make it fail. */
    const writeIsRefused = async () => {
      const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
        signedPayload: await signedRenewal(fixture.signer),
      });
      assert.equal(answer.status, 500, JSON.stringify(answer.json));
      const reqId = answer.headers.get("x-request-id");
      const failed = await service.waitForLog((line) =>
        line.msg === "request_failed" && line.reqId === reqId
      );
      assert.match(failed.errorMessage, /read-only/, "it failed because writes are refused");
    };
    const auditRows = async () =>
      (await sql`SELECT count(*)::int AS n FROM validation_audit`)[0].n as number;

    assert.equal((await verifyA()).json.valid, true);
    assert.equal((await verifyB()).json.valid, true);

    await refuseWrites(service, true);
    try {
      // Past every cache (credentials 1 s, keys 0.75 s): the reads below go to the database.
      await sleep(1_500);
      await writeIsRefused();
      for (let round = 0; round < 2; round++) {
        const a = await verifyA();
        assert.equal(a.status, 200, JSON.stringify(a.json));
        assert.equal(a.json.valid, true);
        const b = await verifyB();
        assert.equal(b.status, 200, JSON.stringify(b.json));
        assert.equal(b.json.valid, true);
        await sleep(1_100); // the next round reads again
      }
      await writeIsRefused();
    } finally {
      await refuseWrites(service, false);
    }
    // What verify had to record was kept for later, not lost: all six audit rows arrive.
    const deadline = Date.now() + 20_000;
    while (await auditRows() < 6) {
      assert.ok(Date.now() < deadline, `audit rows: ${await auditRows()} of 6`);
      await sleep(250);
    }
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await storea.close();
    await play.close();
    await fixture.cleanup();
  }
});
