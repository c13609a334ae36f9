/**
 * Retention (docs/relay.md, "Retention"): finished deliveries untouched for
 * `EVENT_RETENTION_DAYS` go with their attempts and events; pending ones, their events and recent
 * or recently retried ones stay. Against a real database of either engine, in process, through
 * the CLI and in a running service, which keeps answering notifications while it prunes.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { Sql } from "../src/db/connect.ts";
import { pruneRelayHistory, STORE_REDELIVERY_DAYS } from "../src/retention/relay_history.ts";
import { pruneValidationAudit } from "../src/audit/validation_audit.ts";
import {
  connectTestDatabase,
  databaseOf,
  freshDatabase,
  runCli,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";

/** A delivery of `tenantId` with its event and `attempts` attempts, aged as told (in days). */
async function delivery(
  sql: Sql,
  id: string,
  row: {
    tenantId: string;
    status: "pending" | "delivered" | "failed";
    createdDaysAgo: number;
    updatedDaysAgo?: number;
    attempts: number;
  },
): Promise<void> {
  const created = sql`now() - make_interval(days => ${row.createdDaysAgo})`;
  const updated = sql`now() - make_interval(days => ${row.updatedDaysAgo ?? row.createdDaysAgo})`;
  await sql`
    INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                        received_at)
    VALUES (${`evt_${id}`}, ${row.tenantId}, 'storea', ${`ext_${id}`}, 'renewal', 'DID_RENEW',
            '{}', ${created})`;
  await sql`
    INSERT INTO deliveries (id, event_id, tenant_id, status, attempts, next_attempt_at,
                            delivered_at, created_at, updated_at)
    VALUES (${`dlv_${id}`}, ${`evt_${id}`}, ${row.tenantId}, ${row.status}, ${row.attempts},
            ${row.status === "pending" ? sql`now()` : null},
            ${row.status === "delivered" ? updated : null}, ${created}, ${updated})`;
  for (let i = 0; i < row.attempts; i++) {
    await sql`
      INSERT INTO delivery_attempts (delivery_id, attempted_at, duration_ms, response_code)
      VALUES (${`dlv_${id}`}, ${updated}, 12, ${row.status === "delivered" ? 200 : 500})`;
  }
}

async function tenant(sql: Sql, id: string): Promise<string> {
  await sql`INSERT INTO tenants (id, name) VALUES (${id}, ${id})`;
  return id;
}

/** The rows every test below starts from: what must go and what must stay. */
async function seedMixedHistory(sql: Sql): Promise<void> {
  const a = await tenant(sql, "tenant_a");
  const b = await tenant(sql, "tenant_b");
  await delivery(sql, "old_delivered", {
    tenantId: a,
    status: "delivered",
    createdDaysAgo: 100,
    attempts: 2,
  });
  await delivery(sql, "old_failed", {
    tenantId: a,
    status: "failed",
    createdDaysAgo: 45,
    attempts: 3,
  });
  await delivery(sql, "old_failed_unattempted", {
    tenantId: a,
    status: "failed",
    createdDaysAgo: 40,
    attempts: 0,
  });
  await delivery(sql, "old_pending", {
    tenantId: a,
    status: "pending",
    createdDaysAgo: 100,
    attempts: 4,
  });
  await delivery(sql, "recent_delivered", {
    tenantId: a,
    status: "delivered",
    createdDaysAgo: 5,
    attempts: 1,
  });
  await delivery(sql, "recent_failed", {
    tenantId: a,
    status: "failed",
    createdDaysAgo: 29,
    attempts: 6,
  });
  // Created long ago, retried by hand and delivered yesterday: still in use.
  await delivery(sql, "old_retried", {
    tenantId: a,
    status: "delivered",
    createdDaysAgo: 100,
    updatedDaysAgo: 1,
    attempts: 7,
  });
  await delivery(sql, "old_delivered_b", {
    tenantId: b,
    status: "delivered",
    createdDaysAgo: 31,
    attempts: 1,
  });
}

const KEPT = ["old_pending", "old_retried", "recent_delivered", "recent_failed"];

/** Days event keys are kept by default: the stores' redeliveries. */
const keyDays = STORE_REDELIVERY_DAYS;

async function remaining(sql: Sql) {
  const deliveries = await sql`SELECT id FROM deliveries ORDER BY id`;
  const events = await sql`SELECT id FROM events WHERE payload <> '' ORDER BY id`;
  const attempts = await sql`
    SELECT delivery_id, count(*)::int AS n FROM delivery_attempts
    GROUP BY delivery_id ORDER BY delivery_id`;
  return {
    deliveries: deliveries.map((row) => row.id.slice("dlv_".length)),
    events: events.map((row) => row.id.slice("evt_".length)),
    attempts: Object.fromEntries(attempts.map((row) => [row.delivery_id.slice(4), row.n])),
  };
}

Deno.test("retention: old finished deliveries go with their attempts and events, nothing else", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    await seedMixedHistory(db.sql);
    // Batches of 2: the prune takes several, across both tenants.
    const pruned = await pruneRelayHistory(db.sql, 30, { batchSize: 2, keyDays });
    assert.deepEqual(pruned, {
      deliveries: 4,
      attempts: 6,
      events: 4,
      eventKeysKept: 0,
      complete: true,
    });
    assert.deepEqual(await remaining(db.sql), {
      deliveries: [...KEPT].sort(),
      events: [...KEPT].sort(),
      attempts: { old_pending: 4, old_retried: 7, recent_delivered: 1, recent_failed: 6 },
    });
    // Idempotent: a second run finds nothing.
    assert.deepEqual(await pruneRelayHistory(db.sql, 30, { keyDays }), {
      deliveries: 0,
      attempts: 0,
      events: 0,
      eventKeysKept: 0,
      complete: true,
    });
    // A shorter period takes what the longer one kept, still never the pending delivery; events
    // younger than the stores' redeliveries lose their payloads, not their keys.
    const shorter = await pruneRelayHistory(db.sql, 2, { keyDays });
    assert.deepEqual(shorter, {
      deliveries: 2,
      attempts: 7,
      events: 0,
      eventKeysKept: 2,
      complete: true,
    });
    assert.deepEqual(await remaining(db.sql), {
      deliveries: ["old_pending", "old_retried"],
      events: ["old_pending", "old_retried"],
      attempts: { old_pending: 4, old_retried: 7 },
    });
    const keys = await db.sql`
      SELECT id, external_id, payload FROM events WHERE payload = '' ORDER BY id`;
    assert.deepEqual(keys.map((row) => [row.id, row.external_id]), [
      ["evt_recent_delivered", "ext_recent_delivered"],
      ["evt_recent_failed", "ext_recent_failed"],
    ]);
    // Kept keys go once they are older than the key period, whatever the retention.
    const later = await pruneRelayHistory(db.sql, 2, { keyDays: 10 });
    assert.deepEqual(later, {
      deliveries: 0,
      attempts: 0,
      events: 1,
      eventKeysKept: 0,
      complete: true,
    });
    const [{ count }] = await db.sql`SELECT count(*)::int AS count FROM events WHERE payload = ''`;
    assert.equal(count, 1, "the key of the 5-day-old event stays; the 29-day-old one went");
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("retention: 0 keeps everything, and a stopped prune says so", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    await seedMixedHistory(db.sql);
    const before = await remaining(db.sql);
    assert.deepEqual(await pruneRelayHistory(db.sql, 0, { keyDays }), {
      deliveries: 0,
      attempts: 0,
      events: 0,
      eventKeysKept: 0,
      complete: true,
    });
    const stop = new AbortController();
    stop.abort();
    const stopped = await pruneRelayHistory(db.sql, 30, { signal: stop.signal, keyDays });
    assert.equal(stopped.complete, false);
    assert.equal(stopped.deliveries, 0);
    assert.deepEqual(await remaining(db.sql), before);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("retention: prunes running at once share the rows and delete each once", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  // On PostgreSQL a second client, as another replica has; the embedded engine has one client.
  const other = test.env.DATABASE_URL ? await connectTestDatabase(test, { migrated: false }) : null;
  try {
    const sql = db.sql;
    const tenantId = await tenant(sql, "tenant_a");
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                          received_at)
      SELECT 'evt_' || i, ${tenantId}, 'storea', 'ext_' || i, 'renewal', 'DID_RENEW', '{}',
             now() - interval '60 days'
      FROM generate_series(1, 1200) AS i`;
    await sql`
      INSERT INTO deliveries (id, event_id, tenant_id, status, created_at, updated_at)
      SELECT 'dlv_' || i, 'evt_' || i, ${tenantId},
             CASE WHEN i % 3 = 0 THEN 'pending' ELSE 'delivered' END,
             now() - interval '60 days', now() - interval '60 days'
      FROM generate_series(1, 1200) AS i`;
    await sql`
      INSERT INTO delivery_attempts (delivery_id, attempted_at, duration_ms, response_code)
      SELECT 'dlv_' || i, now() - interval '60 days', 10, 200 FROM generate_series(1, 1200) AS i`;
    const runs = await Promise.all(
      [db.sql, other?.sql ?? db.sql, db.sql].map((client) =>
        pruneRelayHistory(client, 30, { batchSize: 100, keyDays })
      ),
    );
    const total = (key: "deliveries" | "attempts" | "events") =>
      runs.reduce((sum, run) => sum + run[key], 0);
    assert.equal(total("deliveries"), 800);
    assert.equal(total("attempts"), 800);
    assert.equal(total("events"), 800);
    const [left] = await sql`
      SELECT (SELECT count(*)::int FROM deliveries WHERE status = 'pending') AS pending,
             (SELECT count(*)::int FROM deliveries) AS deliveries,
             (SELECT count(*)::int FROM events) AS events,
             (SELECT count(*)::int FROM delivery_attempts) AS attempts`;
    assert.deepEqual({ ...left }, { pending: 400, deliveries: 400, events: 400, attempts: 400 });
  } finally {
    await other?.close();
    await db.close();
    await test.drop();
  }
});

Deno.test("retention: the audit prune deletes old rows in batches", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    const tenantId = await tenant(db.sql, "tenant_a");
    await db.sql`
      INSERT INTO validation_audit (tenant_id, store, subject_hash, outcome, latency_ms, created_at)
      SELECT ${tenantId}, 'storea', md5(i::text), 'valid', 5,
             now() - CASE WHEN i <= 250 THEN interval '40 days' ELSE interval '10 days' END
      FROM generate_series(1, 300) AS i`;
    assert.deepEqual(await pruneValidationAudit(db.sql, 30, { batchSize: 100 }), {
      deleted: 250,
      complete: true,
    });
    const [{ count }] = await db.sql`SELECT count(*)::int AS count FROM validation_audit`;
    assert.equal(count, 50);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("retention run: the CLI prunes with its configuration and prints what went", async () => {
  const test = await freshDatabase({ migrated: true });
  try {
    const db = await connectTestDatabase(test);
    try {
      await seedMixedHistory(db.sql);
      await db.sql`
        INSERT INTO validation_audit (tenant_id, store, subject_hash, outcome, latency_ms,
                                      created_at)
        VALUES ('tenant_a', 'storea', 'h1', 'valid', 5, now() - interval '8 days'),
               ('tenant_a', 'storea', 'h2', 'valid', 5, now() - interval '6 days')`;
    } finally {
      await db.close();
    }

    const kept = await runCli(["retention", "run"], { ...test.env, EVENT_RETENTION_DAYS: "0" });
    assert.equal(kept.code, 0, kept.stderr);
    assert.deepEqual(kept.json, {
      eventRetentionDays: 0,
      deliveries: 0,
      attempts: 0,
      events: 0,
      eventKeysKept: 0,
      auditRetentionDays: null,
      auditRows: 0,
    });

    const run = await runCli(["retention", "run"], {
      ...test.env,
      VALIDATION_AUDIT_RETENTION_DAYS: "7",
    });
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(run.json, {
      eventRetentionDays: 90,
      deliveries: 1,
      attempts: 2,
      events: 1,
      eventKeysKept: 0,
      auditRetentionDays: 7,
      auditRows: 1,
    });

    const again = await runCli(["retention", "run"], { ...test.env, EVENT_RETENTION_DAYS: "30" });
    assert.equal(again.code, 0, again.stderr);
    assert.equal(again.json.deliveries, 3);
    assert.equal(again.json.events, 3);

    const bad = await runCli(["retention", "run"], { ...test.env, EVENT_RETENTION_DAYS: "-1" });
    assert.equal(bad.code, 1);
    assert.equal(bad.json.error, "CONFIG_INVALID");
    assert.match(bad.json.message, /EVENT_RETENTION_DAYS/);
  } finally {
    await test.drop();
  }
});

// ---------------------------------------------------------------------------------------------
// In a running service

Deno.test("retention: the service prunes at boot and says what went", async () => {
  const test = await freshDatabase({ migrated: true });
  let service: Awaited<ReturnType<typeof startService>> | undefined;
  try {
    const db = await connectTestDatabase(test);
    try {
      await seedMixedHistory(db.sql);
    } finally {
      await db.close();
    }
    service = await startService({ db: test, env: { EVENT_RETENTION_DAYS: "30" } });
    const line = await service.waitForLog((l) => l.msg === "event_retention_pruned");
    assert.equal(line.level, "info");
    assert.deepEqual(
      [line.deliveries, line.attempts, line.events, line.complete, line.retentionDays],
      [4, 6, 4, true, 30],
    );
    const sql = databaseOf(service);
    try {
      assert.deepEqual((await remaining(sql)).deliveries, [...KEPT].sort());
    } finally {
      await sql.end();
    }
  } finally {
    await service?.stop();
    await test.drop();
  }
});

const BIG_PRUNE_ROWS = 20_000;
/**
 * The most a notification may take while the prune runs. Each batch is one short statement, so
 * a notification waits for one batch at most; the same prune in one statement made them wait
 * seconds on the embedded engine.
 */
const RECEIVER_BOUND_MS = 1_000;

Deno.test("retention: notifications keep being answered while 20k deliveries are pruned", async () => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      EVENT_RETENTION_DAYS: "30",
    },
  });
  try {
    const created = await service.cli("tenant", "create", "--name", "T");
    assert.equal(created.code, 0, created.stderr);
    const tenantId = created.json.id;
    const creds = await service.cli(
      ...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)),
    );
    assert.equal(creds.code, 0, creds.stderr);
    const sql = databaseOf(service);
    try {
      // Payloads of a realistic size (a stored store A notification is about 17 KB).
      await sql`
        INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                            received_at)
        SELECT 'evt_old_' || i, ${tenantId}, 'storea', 'old_' || i, 'renewal', 'DID_RENEW',
               repeat(md5(i::text), 500), now() - interval '90 days'
        FROM generate_series(1, ${BIG_PRUNE_ROWS}) AS i`;
      await sql`
        INSERT INTO deliveries (id, event_id, tenant_id, status, attempts, delivered_at,
                                created_at, updated_at)
        SELECT 'dlv_old_' || i, 'evt_old_' || i, ${tenantId}, 'delivered', 1,
               now() - interval '90 days', now() - interval '90 days', now() - interval '90 days'
        FROM generate_series(1, ${BIG_PRUNE_ROWS}) AS i`;
      await sql`
        INSERT INTO delivery_attempts (delivery_id, attempted_at, duration_ms, response_code)
        SELECT 'dlv_old_' || i, now() - interval '90 days', 10, 200
        FROM generate_series(1, ${BIG_PRUNE_ROWS}) AS i`;
    } finally {
      await sql.end();
    }

    const notify = async () => {
      const signedPayload = await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      );
      const started = performance.now();
      const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
        signedPayload,
      });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      return performance.now() - started;
    };
    /** Two senders, one notification after another each, until `until` settles. */
    const stream = async (until: Promise<unknown>) => {
      let done = false;
      until.finally(() => done = true).catch(() => {});
      const latencies: number[] = [];
      const sender = async () => {
        while (!done) latencies.push(await notify());
      };
      await Promise.all([sender(), sender()]);
      return latencies;
    };
    // A warm service first (the first verifications compile and load what they need), and the
    // same stream without a prune, for comparison.
    const baseline = await stream(new Promise((resolve) => setTimeout(resolve, 2_000)));

    const pruneStarted = performance.now();
    const prune = runCli(["retention", "run"], service.env);
    const during = await stream(prune);
    const run = await prune;
    const pruneMs = Math.round(performance.now() - pruneStarted);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(
      [run.json.deliveries, run.json.attempts, run.json.events],
      [BIG_PRUNE_ROWS, BIG_PRUNE_ROWS, BIG_PRUNE_ROWS],
    );
    assert.ok(during.length >= 10, `only ${during.length} notifications answered during the prune`);
    const slowest = (latencies: number[]) => Math.round(Math.max(...latencies));
    console.log(
      `slowest notification: ${slowest(baseline)} ms of ${baseline.length} without ` +
        `a prune, ${slowest(during)} ms of ${during.length} during it (${pruneMs} ms with the CLI)`,
    );
    assert.ok(
      slowest(during) < RECEIVER_BOUND_MS,
      `a notification took ${slowest(during)} ms during the prune`,
    );

    // Every notification answered is stored, with its delivery; the old ones are gone.
    const check = databaseOf(service);
    try {
      const answered = baseline.length + during.length;
      const [row] = await check`
        SELECT (SELECT count(*)::int FROM events) AS events,
               (SELECT count(*)::int FROM deliveries) AS deliveries`;
      assert.deepEqual({ ...row }, { events: answered, deliveries: answered });
    } finally {
      await check.end();
    }
  } finally {
    await stopAndDrop(service);
    await Deno.remove(dir, { recursive: true });
  }
});
