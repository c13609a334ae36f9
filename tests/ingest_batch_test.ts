/**
 * Group-commit ingest (docs/architecture.md, "Group-commit ingest"): many notifications per
 * statement, each answered only after its row is committed, duplicates inside a batch and across
 * batches answered with the first event id, and one bad row failing only its own caller. Run on a
 * real database of either engine.
 */
import assert from "node:assert/strict";
import type { Database } from "../src/db/connect.ts";
import { IngestBatcher } from "../src/events/ingest_batch.ts";
import type { VerifiedNotification } from "../src/events/ingest.ts";
import { connectTestDatabase, freshDatabase, type TestDatabase } from "./helpers/service.ts";

async function openDatabase(): Promise<{ db: Database; test: TestDatabase }> {
  const test = await freshDatabase();
  return { db: await connectTestDatabase(test, { poolSize: 4 }), test };
}

function notification(tenantId: string, externalId: string): VerifiedNotification {
  return {
    tenantId,
    source: "storea",
    externalId,
    entry: {
      event: "subscription.renewed",
      reason: null,
      platformEvent: "storea.did_renew",
      subject: null,
    } as unknown as VerifiedNotification["entry"],
    data: { notificationUUID: externalId, padding: "x".repeat(2_000) },
    raw: { notificationUUID: externalId },
  };
}

Deno.test("ingest batch: one statement stores many; duplicates answer with the first id", async () => {
  const { db, test } = await openDatabase();
  const sql = db.sql;
  try {
    await sql`INSERT INTO tenants (id, name, active, callback_url)
      VALUES ('tenant_a', 'a', true, 'https://example.com/hook'), ('tenant_b', 'b', true, NULL)`;
    // One statement in flight at a time: the first call goes alone, the rest wait for it.
    const batcher = new IngestBatcher(sql, { maxInFlight: 1 });
    const sent: VerifiedNotification[] = [];
    for (let i = 0; i < 40; i++) sent.push(notification("tenant_a", `n-${i}`));
    // Duplicates inside the batch, and the same external id for another tenant (not a duplicate).
    sent.push(notification("tenant_a", "n-5"), notification("tenant_a", "n-5"));
    sent.push(notification("tenant_b", "n-5"));
    const receipts = await Promise.all(sent.map((n) => batcher.ingest(n)));
    assert.ok(batcher.batches <= 3, `40 notifications took ${batcher.batches} statements`);

    const first = receipts[5];
    assert.equal(first.isNew, true);
    assert.equal(first.enqueuedDelivery, true);
    for (const duplicate of [receipts[40], receipts[41]]) {
      assert.deepEqual(duplicate, {
        eventId: first.eventId,
        externalId: "n-5",
        isNew: false,
        enqueuedDelivery: false,
        deliveryId: null,
      });
    }
    const other = receipts[42];
    assert.equal(other.isNew, true);
    assert.notEqual(other.eventId, first.eventId);
    // No callback URL: stored failed, waiting for `deliveries retry`.
    assert.equal(other.enqueuedDelivery, false);

    const [counts] = await sql`
      SELECT (SELECT count(*)::int FROM events) AS events,
             (SELECT count(*)::int FROM deliveries) AS deliveries,
             (SELECT count(*)::int FROM deliveries WHERE status = 'pending') AS pending`;
    assert.deepEqual({ ...counts }, { events: 41, deliveries: 41, pending: 40 });
    for (const receipt of receipts.slice(0, 40)) {
      const [row] = await sql`
        SELECT d.id, d.status, d.next_attempt_at FROM deliveries d
        WHERE d.event_id = ${receipt.eventId}`;
      assert.equal(row.id, receipt.deliveryId);
      assert.equal(row.status, "pending");
    }

    // Across batches: already stored, and a duplicate stored by another process meanwhile.
    const again = await Promise.all([
      batcher.ingest(notification("tenant_a", "n-7")),
      batcher.ingest(notification("tenant_a", "n-100")),
    ]);
    assert.equal(again[0].isNew, false);
    assert.equal(again[0].eventId, receipts[7].eventId);
    assert.equal(again[1].isNew, true);
    const other_process = new IngestBatcher(sql);
    const elsewhere = await other_process.ingest(notification("tenant_a", "n-100"));
    assert.equal(elsewhere.isNew, false);
    assert.equal(elsewhere.eventId, again[1].eventId);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("ingest batch: one bad row fails only its caller", async () => {
  const { db, test } = await openDatabase();
  const sql = db.sql;
  try {
    await sql`INSERT INTO tenants (id, name, active, callback_url)
      VALUES ('tenant_a', 'a', true, 'https://example.com/hook')`;
    const batcher = new IngestBatcher(sql, { maxInFlight: 1 });
    const sent = [];
    for (let i = 0; i < 10; i++) sent.push(notification("tenant_a", `good-${i}`));
    // A tenant deleted since the receiver looked it up: the foreign key refuses its row.
    sent.splice(5, 0, notification("tenant_gone", "bad"));
    sent.push(notification("tenant_gone", "bad"));
    const outcomes = await Promise.allSettled(sent.map((n) => batcher.ingest(n)));
    const rejected = outcomes.flatMap((o, i) => o.status === "rejected" ? [i] : []);
    assert.deepEqual(rejected, [5, 11]);
    const [{ count }] = await sql`SELECT count(*)::int AS count FROM events`;
    assert.equal(count, 10);
    for (const outcome of outcomes) {
      if (outcome.status !== "fulfilled") continue;
      assert.equal(outcome.value.isNew, true);
      // The caller hears back only once its row is stored.
      const [row] = await sql`SELECT id FROM events WHERE id = ${outcome.value.eventId}`;
      assert.ok(row);
    }
  } finally {
    await db.close();
    await test.drop();
  }
});
