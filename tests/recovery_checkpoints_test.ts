/**
 * The recovery's parts in one process, on a real database of either engine: the checkpoints'
 * leases (one process at a time per tenant and environment, a lost lease writes nothing, an
 * expired one is taken over) and the readers of the stores' records against the simulators
 * (pages, the cap on pages per run and the page token to go on from, known and invalid records).
 * Two service processes sharing one PostgreSQL database: tests/recovery_replicas_test.ts.
 */
import assert from "node:assert/strict";
import type { Database, Sql } from "../src/db/connect.ts";
import {
  claimCheckpoint,
  ensureCheckpoints,
  failRun,
  finishRun,
  saveProgress,
} from "../src/recovery/checkpoints.ts";
import { readStoreaHistory } from "../src/recovery/storea.ts";
import { readVoidedPurchases } from "../src/recovery/storeb.ts";
import { emptyTally, PageTokenRefused } from "../src/recovery/window.ts";
import { ingestNotification } from "../src/events/ingest.ts";
import { storebEvent } from "../src/events/store_events.ts";
import { StoreaApiClient } from "../src/storea/api_client.ts";
import { StoreaTokenSigner } from "../src/storea/api_token.ts";
import { StoreaJwsVerifier } from "../src/storea/jws.ts";
import { StorebVerifier } from "../src/storeb/verify.ts";
import { Logger } from "../src/observability/log.ts";
import type { StoreaCredentials } from "../src/storea/credentials.ts";
import type { StorebCredentials } from "../src/storeb/credentials.ts";
import { connectTestDatabase, freshDatabase, type TestDatabase } from "./helpers/service.ts";
import { TEST_ISSUER_ID, writeServiceAccountFile, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { createStoreaTestPki } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startStoreaApiSimulator } from "../simulators/storea_api.ts";
import { storeaNotification } from "../simulators/store_notifications.ts";
import { sampleVoidedPurchase, startStorebSimulator } from "../simulators/storeb_play.ts";
import { subscriptionNotification } from "../simulators/storeb_push.ts";

const BUNDLE_ID = "com.example.app";
const LEASE_MS = 60_000;

async function open(): Promise<{ db: Database; test: TestDatabase }> {
  const test = await freshDatabase();
  return { db: await connectTestDatabase(test), test };
}

/** A tenant with store A credentials in `environment` (the key is not opened here). */
async function tenantWithStorea(
  sql: Sql,
  id: string,
  environment: "auto" | "production" | "sandbox",
  active = true,
): Promise<void> {
  await sql`INSERT INTO tenants (id, name, active) VALUES (${id}, ${id}, ${active})`;
  await sql`
    INSERT INTO storea_credentials
      (tenant_id, bundle_id, key_id, issuer_id, private_key_sealed, environment)
    VALUES (${id}, ${BUNDLE_ID}, 'ABC123DEFG', ${TEST_ISSUER_ID}, 'sealed', ${environment})`;
}

/** A logger that keeps its lines. */
function memoryLog(): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const decoder = new TextDecoder();
  const log = new Logger({
    write: (bytes) => {
      for (const line of decoder.decode(bytes).split("\n")) {
        if (line.trim() !== "") lines.push(JSON.parse(line));
      }
    },
  });
  log.configure({ level: "debug", production: false });
  return { log, lines };
}

Deno.test("recovery checkpoints: one process at a time, and a lost lease writes nothing", async () => {
  const { db, test } = await open();
  const sql = db.sql;
  try {
    await tenantWithStorea(sql, "tenant_auto", "auto");
    await tenantWithStorea(sql, "tenant_sandbox", "sandbox");
    await tenantWithStorea(sql, "tenant_inactive", "auto", false);
    await ensureCheckpoints(sql, 3_600_000);
    // Due an interval after the credentials were set.
    assert.equal(await claimCheckpoint(sql, "a", LEASE_MS), null);
    await sql`UPDATE recovery_checkpoints SET next_run_at = now() - interval '1 second'`;
    await ensureCheckpoints(sql, 0); // a second replica's: nothing twice, nothing changed
    const rows = await sql`
      SELECT tenant_id, store, environment FROM recovery_checkpoints
      ORDER BY tenant_id, environment`;
    assert.deepEqual(rows.map((r) => `${r.tenant_id} ${r.store} ${r.environment}`), [
      "tenant_auto storea production",
      "tenant_auto storea sandbox",
      "tenant_sandbox storea sandbox",
    ]);

    // Three due checkpoints, three owners: each gets one, and a fourth gets none.
    const claimed = [];
    for (const owner of ["a", "b", "c"]) {
      const checkpoint = await claimCheckpoint(sql, owner, LEASE_MS);
      assert.ok(checkpoint, owner);
      assert.equal(checkpoint.checkedUntil, null, "never read");
      claimed.push({ owner, checkpoint });
    }
    assert.equal(
      new Set(claimed.map((c) => `${c.checkpoint.tenantId} ${c.checkpoint.environment}`)).size,
      3,
    );
    assert.equal(await claimCheckpoint(sql, "d", LEASE_MS), null, "all leased");

    const [a, b] = claimed;
    // Only the holder writes.
    assert.equal(
      await saveProgress(
        sql,
        a.checkpoint,
        "b",
        { startMs: 1, endMs: 2, pageToken: "x" },
        LEASE_MS,
      ),
      false,
    );
    const end = { nextRunInMs: 0, sendFailuresUntil: null, warnedOrders: [] };
    assert.equal(await finishRun(sql, a.checkpoint, "b", { ...end, checkedUntil: 5 }), false);
    const window = { startMs: Date.now() - 60_000, endMs: Date.now(), pageToken: "page-2" };
    assert.equal(await saveProgress(sql, a.checkpoint, "a", window, LEASE_MS), true);

    // A's lease runs out (its process died): another owner takes the checkpoint over, with the
    // window A left unfinished, and A can no longer write.
    await sql`
      UPDATE recovery_checkpoints SET lease_until = now() - interval '1 second'
      WHERE tenant_id = ${a.checkpoint.tenantId} AND environment = ${a.checkpoint.environment}`;
    const taken = await claimCheckpoint(sql, "e", LEASE_MS);
    assert.ok(taken);
    assert.deepEqual([taken.tenantId, taken.environment], [
      a.checkpoint.tenantId,
      a.checkpoint.environment,
    ]);
    assert.deepEqual(taken.unfinished, window);
    assert.equal(await finishRun(sql, a.checkpoint, "a", { ...end, checkedUntil: 5 }), false);
    assert.equal(await finishRun(sql, taken, "e", { ...end, checkedUntil: window.endMs }), true);

    // Finished and due again at once (nextRunInMs 0): claimable, with its checkpoint.
    const again = await claimCheckpoint(sql, "f", LEASE_MS);
    assert.ok(again);
    assert.equal(again.checkedUntil, window.endMs);
    assert.equal(again.unfinished, null);

    // A failure counts, keeps the checkpoint, and postpones the next run.
    assert.equal(
      await failRun(sql, b.checkpoint, "b", {
        error: "RATE_LIMITED: later",
        nextRunInMs: 3_600_000,
        sendFailuresUntil: 42,
        warnedOrders: ["GPA.1"],
      }),
      true,
    );
    const [failed] = await sql`
      SELECT failures, last_error, next_run_at > now() + interval '59 minutes' AS later,
             lease_owner, send_failures_until, warned_orders
      FROM recovery_checkpoints
      WHERE tenant_id = ${b.checkpoint.tenantId} AND environment = ${b.checkpoint.environment}`;
    assert.equal(failed.failures, 1);
    assert.equal(failed.last_error, "RATE_LIMITED: later");
    assert.equal(failed.later, true);
    assert.equal(failed.lease_owner, null);
    assert.equal(new Date(failed.send_failures_until).getTime(), 42);
    assert.deepEqual(failed.warned_orders, ["GPA.1"]);

    // The tenant's setting no longer covers sandbox: its sandbox checkpoint is left alone.
    await sql`UPDATE recovery_checkpoints SET lease_owner = NULL, lease_until = NULL,
      next_run_at = now() - interval '1 second'`;
    await sql`UPDATE storea_credentials SET environment = 'production'
      WHERE tenant_id = 'tenant_auto'`;
    await sql`UPDATE storea_credentials SET environment = 'production'
      WHERE tenant_id = 'tenant_sandbox'`;
    const left = [];
    for (let checkpoint; (checkpoint = await claimCheckpoint(sql, "g", LEASE_MS));) {
      left.push(`${checkpoint.tenantId} ${checkpoint.environment}`);
    }
    assert.deepEqual(left, ["tenant_auto production"]);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("recovery of store A: pages, a cap per run, known and invalid records", async () => {
  const { db, test } = await open();
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
  const api = await startStoreaApiSimulator({ signer, notificationHistoryPageSize: 2 });
  try {
    const keyFile = await writeStoreaKeyFile(dir);
    const privateKeyPem = await Deno.readTextFile(keyFile);
    await api.addKey({
      issuerId: TEST_ISSUER_ID,
      keyId: "ABC123DEFG",
      bundleId: BUNDLE_ID,
      privateKeyPem,
    });
    const credentials: StoreaCredentials = {
      bundleId: BUNDLE_ID,
      keyId: "ABC123DEFG",
      issuerId: TEST_ISSUER_ID,
      privateKeyPem,
      environment: "production",
      appId: null,
    };
    await db.sql`INSERT INTO tenants (id, name, callback_url)
      VALUES ('tenant_a', 'a', 'https://tenant.example/hooks')`;
    const lost = [];
    for (let i = 0; i < 4; i++) {
      const { body } = await storeaNotification(signer, {
        notificationType: "DID_RENEW",
        originalTransactionId: `200000000000000${i}`,
        productId: "pro.monthly",
      });
      api.recordNotification(body.signedPayload, {
        sendAttempts: [{ attemptDate: Date.now(), sendAttemptResult: "TIMED_OUT" }],
      });
      lost.push(body.signedPayload);
    }
    // Signed under a root the service does not trust: listed, never relayed.
    const forged = await storeaNotification(stranger, {
      notificationType: "DID_RENEW",
      originalTransactionId: "2000000000000009",
      productId: "pro.monthly",
    });
    api.recordNotification(forged.body.signedPayload, {
      sendAttempts: [{ attemptDate: Date.now(), sendAttemptResult: "TLS_ISSUE" }],
    });
    // Delivered: not a failure, so not listed with onlyFailures.
    const delivered = await storeaNotification(signer, {
      notificationType: "SUBSCRIBED",
      originalTransactionId: "2000000000000010",
      productId: "pro.monthly",
    });
    api.recordNotification(delivered.body.signedPayload, {
      sendAttempts: [
        { attemptDate: Date.now(), sendAttemptResult: "TIMED_OUT" },
        { attemptDate: Date.now(), sendAttemptResult: "SUCCESS" },
      ],
    });

    const { log, lines } = memoryLog();
    const stored: string[] = [];
    let kicks = 0;
    const context = {
      client: new StoreaApiClient({
        productionUrl: api.productionUrl,
        sandboxUrl: api.sandboxUrl,
        tokens: new StoreaTokenSigner(),
      }),
      jws: new StoreaJwsVerifier({ rootCertificates: [pki.rootDer] }),
      timeoutMs: 5_000,
      log,
      via: "schedule" as const,
      ingest: async (notification: Parameters<typeof ingestNotification>[1]) => {
        const receipt = await ingestNotification(db.sql, notification);
        if (receipt.isNew) stored.push(notification.externalId);
        return receipt;
      },
      onEnqueued: () => kicks++,
    };
    const saved: (string | null)[] = [];
    const window = {
      tenantId: "tenant_a",
      credentials,
      environment: "production" as const,
      onlyFailures: true,
      startMs: Date.now() - 3_600_000,
      endMs: Date.now() + 1,
      pageToken: null,
      maxPages: 2,
      signal: new AbortController().signal,
      afterPage: (token: string | null) => {
        saved.push(token);
        return Promise.resolve();
      },
    };
    const tally = emptyTally();
    const failed: { attemptDate: number; sendAttemptResult: string }[] = [];
    const first = await readStoreaHistory(context, window, tally, failed);
    // Five failed notifications, two a page, two pages a run: one page is left.
    assert.equal(tally.pages, 2);
    assert.equal(tally.storeCalls, 2);
    assert.equal(tally.checked, 4);
    assert.ok(first.nextPageToken !== null);
    assert.deepEqual(saved.at(-1), first.nextPageToken);
    const second = await readStoreaHistory(
      context,
      { ...window, pageToken: first.nextPageToken },
      tally,
      failed,
    );
    assert.equal(second.nextPageToken, null);
    assert.equal(tally.checked, 5);
    assert.equal(tally.recovered, 4);
    assert.equal(tally.invalid, 1);
    assert.equal(tally.known, 0);
    assert.deepEqual(tally.failedSendAttempts, { TIMED_OUT: 4, TLS_ISSUE: 1 });
    assert.equal(failed.length, 5);
    assert.equal(stored.length, 4);
    assert.equal(kicks, 4, "each new delivery kicks the dispatcher");
    log.flush();
    const invalid = lines.filter((line) => line.msg === "recovery_notification_invalid");
    assert.equal(invalid.length, 1);
    assert.equal(invalid[0].error, "SIGNATURE_INVALID");
    const history = api.requests.filter((r) => r.operation === "notification_history");
    assert.deepEqual(history[0].body, {
      startDate: window.startMs,
      endDate: window.endMs,
      onlyFailures: true,
    });
    assert.deepEqual(history[0].query, []);
    assert.equal(history[2].query[0][0], "paginationToken");

    // Read again: every one is known, nothing is stored twice.
    const again = emptyTally();
    await readStoreaHistory(context, { ...window, maxPages: 10 }, again, []);
    assert.deepEqual([again.checked, again.recovered, again.known, again.invalid], [5, 0, 4, 1]);
    assert.equal(stored.length, 4);
    const [{ count }] = await db.sql`SELECT count(*)::int AS count FROM events`;
    assert.equal(count, 4);

    // A page token Apple no longer takes: the caller reads the window from its start.
    await assert.rejects(
      readStoreaHistory(context, { ...window, pageToken: "bm90IGEgdG9rZW4" }, emptyTally(), []),
      PageTokenRefused,
    );
  } finally {
    await api.close();
    await db.close();
    await test.drop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("recovery of store B: pages, a cap per run, productType from earlier events", async () => {
  const { db, test } = await open();
  const dir = await Deno.makeTempDir();
  const play = await startStorebSimulator();
  try {
    const account = await writeServiceAccountFile(dir);
    const serviceAccountJson = await Deno.readTextFile(account.path);
    await play.addServiceAccount({
      clientEmail: account.clientEmail,
      privateKeyPem: JSON.parse(serviceAccountJson).private_key,
    });
    const credentials: StorebCredentials = {
      packageName: "com.example.app",
      clientEmail: account.clientEmail,
      serviceAccountJson,
      pushAudience: "https://relay.example.com/push",
      pushServiceAccount: "push@example-project.iam.gserviceaccount.com",
    };
    await db.sql`INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`;
    // Earlier events say one token was a subscription's, another a one-time product's.
    const subscriptionToken = `sub-${crypto.randomUUID()}`;
    const productToken = `prod-${crypto.randomUUID()}`;
    for (
      const [kind, token] of [["subscriptionNotification", subscriptionToken], [
        "oneTimeProductNotification",
        productToken,
      ]]
    ) {
      const notification = kind === "subscriptionNotification"
        ? subscriptionNotification("com.example.app", { notificationType: 4, purchaseToken: token })
        : {
          version: "1.0",
          packageName: "com.example.app",
          eventTimeMillis: String(Date.now()),
          oneTimeProductNotification: {
            version: "1.0",
            notificationType: 1,
            purchaseToken: token,
            sku: "coins",
          },
        };
      await ingestNotification(
        db.sql,
        storebEvent("tenant_b", notification, { messageId: crypto.randomUUID(), envelope: {} }),
      );
    }
    const now = Date.now();
    const voided = [
      sampleVoidedPurchase({
        purchaseToken: subscriptionToken,
        voidedTimeMillis: String(now - 5_000),
      }),
      sampleVoidedPurchase({
        purchaseToken: productToken,
        voidedTimeMillis: String(now - 4_000),
        voidedQuantity: 1,
      }),
      sampleVoidedPurchase({ voidedTimeMillis: String(now - 3_000), voidedReason: 8 }),
    ];
    for (const [i, voidedPurchase] of voided.entries()) {
      play.addVoidedPurchase({
        packageName: "com.example.app",
        voidedPurchase,
        type: i === 0 ? "subscription" : "product",
      });
    }
    const { log } = memoryLog();
    const context = {
      storeb: new StorebVerifier({
        apiUrl: play.apiUrl,
        tokenUrl: play.tokenUrl,
        timeoutMs: 5_000,
      }),
      sql: db.sql,
      timeoutMs: 5_000,
      log,
      via: "schedule" as const,
      pageSize: 1,
      ingest: (notification: Parameters<typeof ingestNotification>[1]) =>
        ingestNotification(db.sql, notification),
      onEnqueued: () => {},
    };
    const window = {
      tenantId: "tenant_b",
      credentials,
      startMs: now - 60_000,
      endMs: now - 1_000,
      pageToken: null,
      maxPages: 2,
      signal: new AbortController().signal,
    };
    const tally = emptyTally();
    const unacknowledged: { orderId: string }[] = [];
    const first = await readVoidedPurchases(context, window, tally, unacknowledged as never);
    assert.equal(tally.pages, 2);
    assert.ok(first.nextPageToken !== null);
    const second = await readVoidedPurchases(
      context,
      { ...window, pageToken: first.nextPageToken },
      tally,
      unacknowledged as never,
    );
    assert.equal(second.nextPageToken, null);
    assert.deepEqual([tally.checked, tally.recovered, tally.known, tally.invalid], [3, 3, 0, 0]);
    assert.deepEqual(unacknowledged.map((u) => u.orderId), [voided[2].orderId]);

    const listed = play.calls({ operation: "voided_purchases" });
    const params = new URLSearchParams(listed[0].search);
    assert.deepEqual(Object.fromEntries(params), {
      startTime: String(window.startMs),
      endTime: String(window.endMs),
      type: "1",
      includeQuantityBasedPartialRefund: "true",
      maxResults: "1",
    });
    assert.ok(new URLSearchParams(listed[1].search).has("token"));

    const events = await db.sql`
      SELECT external_id, event, platform_event, payload FROM events
      WHERE platform_event = 'storeb.voided_purchase' ORDER BY received_at`;
    const byOrder = new Map(
      events.map((row) => [row.external_id, JSON.parse(row.payload)]),
    );
    const [sub, prod, unknown] = voided.map((v) => byOrder.get(`voided:${v.orderId}`));
    assert.deepEqual(
      [
        sub.data.voidedPurchaseNotification.productType,
        sub.data.voidedPurchaseNotification.refundType,
        sub.reason,
      ],
      [1, 1, "full_refund"],
    );
    assert.deepEqual(
      [
        prod.data.voidedPurchaseNotification.productType,
        prod.data.voidedPurchaseNotification.refundType,
        prod.reason,
      ],
      [2, 2, "partial_refund"],
    );
    assert.equal(unknown.data.voidedPurchaseNotification.productType, null);
    assert.deepEqual(sub.raw, voided[0]);
  } finally {
    await play.close();
    await db.close();
    await test.drop();
    await Deno.remove(dir, { recursive: true });
  }
});
