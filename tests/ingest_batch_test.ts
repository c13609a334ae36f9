/**
 * Group-commit ingest (docs/architecture.md, "Group-commit ingest"): many notifications per
 * statement, each answered only after its row is committed, duplicates inside a batch and across
 * batches answered with the first event id, and one bad row failing only its own caller; new
 * deliveries handed to the dispatcher leased, only within the tenant's cap (docs/architecture.md,
 * "Handing over the first attempt"). Run on a real database of either engine.
 */
import assert from "node:assert/strict";
import type { Database } from "../src/db/connect.ts";
import type { DeliveryHandOver, HandedOverDelivery } from "../src/delivery/hand_over.ts";
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
    occurredAt: null,
    state: null,
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
        handedOver: false,
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

Deno.test("ingest batch: rows padded to a power of two, the blank ones skipped", async () => {
  const { db, test } = await openDatabase();
  try {
    await db.sql`INSERT INTO tenants (id, name, active, callback_url)
      VALUES ('tenant_a', 'a', true, 'https://example.com/hook')`;
    // The rows of each batch statement, as the VALUES list given to the client.
    const sizes: number[] = [];
    const sql = new Proxy(db.sql, {
      apply(target, self, args) {
        const [first] = args;
        if (Array.isArray(first) && !("raw" in first) && Array.isArray(first[0])) {
          sizes.push(first.length);
        }
        return Reflect.apply(target, self, args);
      },
    });
    // The client prepares its statements (both engines' test databases do), so rows are padded.
    assert.equal(db.sql.options.prepare, true);
    const batcher = new IngestBatcher(sql, { maxInFlight: 1 });
    // The first goes alone; the 37 queued behind it go together, as 64 rows.
    const sent = Array.from({ length: 38 }, (_, i) => notification("tenant_a", `p-${i}`));
    const receipts = await Promise.all(sent.map((n) => batcher.ingest(n)));
    assert.deepEqual(sizes, [1, 64]);
    assert.ok(receipts.every((receipt) => receipt.isNew && receipt.enqueuedDelivery));
    const [counts] = await db.sql`
      SELECT (SELECT count(*)::int FROM events) AS events,
             (SELECT count(*)::int FROM deliveries) AS deliveries`;
    assert.deepEqual({ ...counts }, { events: 38, deliveries: 38 });
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

/** A hand-over that reserves for the tenants it is told to, and records what it was given. */
class RecordingHandOver implements DeliveryHandOver {
  readonly owner = "dispatcher_test";
  readonly leaseMs = 60_000;
  readonly tenantCap = 3;
  reserved = 0;
  released: string[] = [];
  started: HandedOverDelivery[] = [];
  constructor(readonly reserveFor: Set<string>) {}
  reserve(tenantId: string): boolean {
    if (!this.reserveFor.has(tenantId)) return false;
    this.reserved++;
    return true;
  }
  release(tenantId: string): void {
    this.released.push(tenantId);
  }
  start(delivery: HandedOverDelivery): void {
    this.started.push(delivery);
  }
}

Deno.test("ingest batch: new deliveries are handed over leased, within the tenant's cap", async (t) => {
  const { db, test } = await openDatabase();
  const sql = db.sql;
  try {
    await sql`INSERT INTO tenants (id, name, active, callback_url, webhook_secret_sealed)
      VALUES ('healthy', 'h', true, 'https://example.com/h', 'sealed-h'),
             ('at_cap', 'c', true, 'https://example.com/c', 'sealed-c'),
             ('failing', 'f', true, 'https://example.com/f', 'sealed-f'),
             ('waiting', 'w', true, 'https://example.com/w', 'sealed-w'),
             ('asleep', 'a', false, 'https://example.com/a', 'sealed-a'),
             ('nowhere', 'n', true, NULL, NULL)`;
    await sql`UPDATE tenants SET delivery_failure_streak = 1 WHERE id = 'failing'`;
    // Two leases held elsewhere: one slot of three left.
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
      SELECT 'evt_' || k, t, 'storea', 'old-' || k, 'renewal', 'DID_RENEW', '{}'
      FROM (VALUES ('c1', 'at_cap'), ('c2', 'at_cap'), ('w1', 'waiting')) AS v(k, t)`;
    await sql`
      INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at, lease_owner,
                              lease_expires_at)
      VALUES ('dlv_c1', 'evt_c1', 'at_cap', 'pending', now(), 'other', now() + interval '1 minute'),
             ('dlv_c2', 'evt_c2', 'at_cap', 'pending', now(), 'other', now() + interval '1 minute'),
             ('dlv_w1', 'evt_w1', 'waiting', 'pending', now() - interval '1 second', NULL, NULL)`;
    const tenants = ["healthy", "at_cap", "failing", "waiting", "asleep", "nowhere"];
    const handOver = new RecordingHandOver(new Set(tenants));
    const batcher = new IngestBatcher(sql, { maxInFlight: 1, handOver });
    // Held back by an unfinished statement, so that all of them go in the next one together.
    const blocker = batcher.ingest(notification("healthy", "first"));
    const sent = tenants.flatMap((tenant) =>
      [1, 2].map((i) => notification(tenant, `${tenant}-${i}`))
    );
    sent.push(notification("healthy", "healthy-1"));
    const [firstReceipt, ...receipts] = await Promise.all([
      blocker,
      ...sent.map((n) => batcher.ingest(n)),
    ]);

    await t.step("each reservation is either started or released, once", () => {
      assert.equal(handOver.reserved, handOver.started.length + handOver.released.length);
      assert.equal(handOver.reserved, 1 + 2 * tenants.length);
    });

    await t.step("a healthy tenant's deliveries are committed leased and handed over", async () => {
      const handed = [firstReceipt, receipts[0], receipts[1]];
      for (const receipt of handed) assert.equal(receipt.handedOver, true);
      const started = handOver.started.filter((d) => d.tenantId === "healthy");
      assert.deepEqual(started.map((d) => d.id).sort(), handed.map((r) => r.deliveryId).sort());
      const delivery = started.find((d) => d.id === receipts[0].deliveryId)!;
      assert.equal(delivery.eventId, receipts[0].eventId);
      assert.equal(delivery.attempts, 0);
      assert.equal(JSON.parse(delivery.payload).eventId, receipts[0].eventId);
      assert.deepEqual(delivery.target, {
        active: true,
        callbackUrl: "https://example.com/h",
        sealedSecrets: ["sealed-h"],
      });
      const rows = await sql`
        SELECT lease_owner, lease_expires_at > now() + interval '50 seconds' AS leased
        FROM deliveries WHERE tenant_id = 'healthy'`;
      assert.deepEqual(rows.map((r) => ({ ...r })), [
        { lease_owner: "dispatcher_test", leased: true },
        { lease_owner: "dispatcher_test", leased: true },
        { lease_owner: "dispatcher_test", leased: true },
      ]);
    });

    await t.step("the duplicate in the batch is not handed over twice", () => {
      const duplicate = receipts.at(-1)!;
      assert.equal(duplicate.isNew, false);
      assert.equal(duplicate.handedOver, false);
    });

    await t.step(
      "at its cap, failing, with deliveries waiting, inactive or without a callback: claimed",
      async () => {
        const byTenant = (id: string) => handOver.started.filter((d) => d.tenantId === id).length;
        // One slot left of three: the first of the two is handed over, the second waits.
        assert.equal(byTenant("at_cap"), 1);
        for (const id of ["failing", "waiting", "asleep", "nowhere"]) {
          assert.equal(byTenant(id), 0, id);
        }
        const [{ unleased }] = await sql`
        SELECT count(*)::int AS unleased FROM deliveries
        WHERE lease_owner IS NULL AND id NOT IN ('dlv_w1')`;
        // at_cap 1, failing 2, waiting 2, asleep 2, nowhere 2 (stored failed).
        assert.equal(unleased, 9);
      },
    );
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("ingest batch: a row that failed on its connection is tried once more", async () => {
  const { db, test } = await openDatabase();
  const sql = db.sql;
  try {
    await sql`INSERT INTO tenants (id, name, active, callback_url)
      VALUES ('tenant_a', 'a', true, 'https://example.com/hook')`;
    // The first two statements run fail as on a connection whose socket the server closed during
    // an outage: the batch, then the row alone. The third, the row's second try, reaches the
    // database. A statement runs when awaited; fragments built into one are never awaited.
    let broken = 2;
    const afterOutage = new Proxy(sql, {
      apply(target, self, args) {
        const query = Reflect.apply(target, self, args);
        if (!(Array.isArray(args[0]) && "raw" in args[0])) return query;
        const run = query.then.bind(query);
        query.then = (ok: never, fail: never) => {
          if (broken-- <= 0) return run(ok, fail);
          const error = Object.assign(new Error("This socket has been ended by the other party"), {
            code: "EPIPE",
          });
          return Promise.reject(error).then(ok, fail);
        };
        return query;
      },
    });
    const batcher = new IngestBatcher(afterOutage, { maxInFlight: 1 });
    const receipt = await batcher.ingest(notification("tenant_a", "after-outage"));
    assert.equal(receipt.isNew, true);
    const [{ count }] = await sql`SELECT count(*)::int AS count FROM events`;
    assert.equal(count, 1);

    // An error the database answered is final: no second try.
    broken = 0;
    await assert.rejects(batcher.ingest(notification("tenant_gone", "refused")), /foreign key/);
  } finally {
    await db.close();
    await test.drop();
  }
});
