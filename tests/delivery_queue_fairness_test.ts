/**
 * The delivery claim shares slots fairly among tenants, in SQL (docs/relay.md, "Delivery
 * scheduling across tenants"): tenants take turns, a tenant never holds more leases than its cap
 * whichever owner holds them, a tenant whose callback keeps failing gets one slot, and the
 * dispatcher's wake-up time ignores a tenant at its cap. Run against the queue on a real database
 * of either engine.
 */
import assert from "node:assert/strict";
import postgres from "postgres";
import type { Database, Sql } from "../src/db/connect.ts";
import {
  type AttemptResult,
  claimDueDeliveries,
  type ClaimedDelivery,
  countBacklog,
  FAILING_CALLBACK_STREAK,
  nextDueAt,
  recordAndClaim,
  recordAttempt,
  recordAttempts,
} from "../src/delivery/queue.ts";
import {
  connectTestDatabase,
  ENGINE,
  freshDatabase,
  type TestDatabase,
} from "./helpers/service.ts";

const LEASE_MS = 60_000;

async function openQueue(): Promise<{ db: Database; test: TestDatabase }> {
  const test = await freshDatabase();
  return { db: await connectTestDatabase(test), test };
}

let sequence = 0;

/** A tenant with `due` deliveries due now, the oldest first; returns the tenant id. */
async function tenantWithBacklog(
  sql: Sql,
  name: string,
  due: number,
  options: { active?: boolean } = {},
): Promise<string> {
  const tenantId = `tenant_${name}`;
  await sql`INSERT INTO tenants (id, name, active) VALUES (${tenantId}, ${name},
    ${options.active ?? true})`;
  for (let i = 0; i < due; i++) {
    const n = ++sequence;
    const eventId = `evt_${name}_${i}`;
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
      VALUES (${eventId}, ${tenantId}, 'storea', ${`ext-${n}`}, 'renewal', 'DID_RENEW', '{}')`;
    // Due in the past, in order of creation: older backlog first.
    await sql`
      INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at)
      VALUES (${`dlv_${name}_${i}`}, ${eventId}, ${tenantId}, 'pending',
              now() - interval '1 hour' + ${n} * interval '1 millisecond')`;
  }
  return tenantId;
}

function claim(sql: Sql, owner: string, limit: number, tenantCap: number) {
  return claimDueDeliveries(sql, { owner, limit, leaseMs: LEASE_MS, tenantCap });
}

function failure(): AttemptResult {
  return {
    attemptedAt: new Date(),
    durationMs: 5,
    responseCode: 500,
    responseBody: "{}",
    error: null,
    retryAfterMs: null,
  };
}

Deno.test("delivery queue: tenants take turns, and no tenant exceeds its cap", async (t) => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const flood = await tenantWithBacklog(sql, "flood", 50);
    const quiet = await tenantWithBacklog(sql, "quiet", 1);
    const pair = await tenantWithBacklog(sql, "pair", 2);
    const asleep = await tenantWithBacklog(sql, "asleep", 3, { active: false });

    await t.step("every tenant's oldest comes before any tenant's second", async () => {
      const claimed = await claim(sql, "owner-a", 4, 8);
      const byTenant = (id: string) => claimed.filter((d) => d.tenantId === id).length;
      assert.equal(claimed.length, 4);
      assert.equal(byTenant(quiet), 1, "the quiet tenant's only delivery");
      assert.equal(byTenant(pair), 1, "one of the pair's two");
      assert.equal(byTenant(flood), 2, "the flood's two oldest: it is the oldest backlog");
      assert.deepEqual(
        claimed.filter((d) => d.tenantId === flood).map((d) => d.id).sort(),
        ["dlv_flood_0", "dlv_flood_1"],
      );
      assert.equal(byTenant(asleep), 0, "an inactive tenant's deliveries wait");
    });

    await t.step("the cap counts leases held by any owner", async () => {
      // The flood holds 2 (owner-a); a cap of 5 leaves it 3, whoever claims.
      const claimed = await claim(sql, "owner-b", 100, 5);
      assert.equal(claimed.filter((d) => d.tenantId === flood).length, 3);
      assert.equal(claimed.filter((d) => d.tenantId === pair).length, 1, "the pair's second");
      const again = await claim(sql, "owner-c", 100, 5);
      assert.equal(again.length, 0, "every tenant is at its cap or has nothing due");
    });

    await t.step(
      "a tenant at its cap does not wake the dispatcher before a lease ends",
      async () => {
        const due = await nextDueAt(sql, 10 * LEASE_MS, { tenantCap: 5 });
        assert.ok(due !== null && due.getTime() > Date.now() + LEASE_MS / 2, `due ${due}`);
        const nothing = await nextDueAt(sql, 1_000, { tenantCap: 5 });
        assert.equal(nothing, null, "nothing within the horizon");
        // With room under a higher cap, the flood's backlog is due now.
        const now = await nextDueAt(sql, 1_000, { tenantCap: 6 });
        assert.ok(now !== null && now.getTime() <= Date.now(), `due ${now}`);
      },
    );

    await t.step("an expired lease no longer counts against the cap", async () => {
      await sql`UPDATE deliveries SET lease_expires_at = now() - interval '1 second'
                WHERE tenant_id = ${flood} AND lease_owner = 'owner-a'`;
      const claimed = await claim(sql, "owner-d", 100, 5);
      // Two leases freed: the two deliveries whose lease ended, the oldest, are taken over.
      assert.deepEqual(claimed.map((d) => d.id).sort(), ["dlv_flood_0", "dlv_flood_1"]);
    });
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("delivery queue: the backlog's due count leaves out inactive tenants", async () => {
  const { db, test } = await openQueue();
  try {
    await tenantWithBacklog(db.sql, "on", 3);
    await tenantWithBacklog(db.sql, "off", 4, { active: false });
    // An inactive tenant's deliveries wait, unclaimed, until it is activated: counted as due, they
    // kept the due gauge up for good, an alert that never clears.
    assert.deepEqual(await countBacklog(db.sql), { pending: 7, due: 3 });
    await claim(db.sql, "o", 10, 10);
    assert.deepEqual(await countBacklog(db.sql), { pending: 7, due: 3 });
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("delivery queue: a tenant whose callback keeps failing gets one slot", async () => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const failing = await tenantWithBacklog(sql, "failing", 20);
    const streaks: number[] = [];
    for (let i = 0; i < FAILING_CALLBACK_STREAK; i++) {
      const [delivery] = await claim(sql, "owner", 1, 8);
      const recorded = await recordAttempt(sql, "owner", {
        deliveryId: delivery.id,
        tenantId: failing,
        result: failure(),
        verdict: { status: "pending", nextAttemptAt: new Date(Date.now() + 3_600_000) },
      });
      assert.equal(recorded.kept, true);
      streaks.push(recorded.failureStreak);
    }
    assert.deepEqual(streaks, [1, 2, 3, 4, 5]);

    const claimed = await claim(sql, "owner", 100, 8);
    assert.equal(claimed.length, 1, "one delivery at a time while the callback fails");
    assert.equal(claimed[0].tenantId, failing);
    assert.equal((await claim(sql, "owner", 100, 8)).length, 0);

    // The first success restores the full share.
    const success = await recordAttempt(sql, "owner", {
      deliveryId: claimed[0].id,
      tenantId: failing,
      result: { ...failure(), responseCode: 200 },
      verdict: { status: "delivered" },
    });
    assert.deepEqual(success, {
      kept: true,
      failureStreak: 0,
      previousStreak: FAILING_CALLBACK_STREAK,
    });
    assert.equal((await claim(sql, "owner", 100, 8)).length, 8);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("delivery queue: a record and a claim in one statement share the slots", async (t) => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const busy = await tenantWithBacklog(sql, "busy", 12);
    const held = await claim(sql, "owner-a", 4, 4);
    assert.equal(held.length, 4);
    const other = await tenantWithBacklog(sql, "other", 1);
    const delivered = (d: ClaimedDelivery) => ({
      deliveryId: d.id,
      tenantId: d.tenantId,
      result: { ...failure(), responseCode: 200 },
      verdict: { status: "delivered" as const },
    });

    await t.step("the leases the records give back are free for the claim", async () => {
      // The snapshot still shows the four leases: counted as held, the busy tenant (cap 4) would
      // get nothing, and only the other tenant's delivery would be claimed.
      const { recorded, claimed } = await recordAndClaim(sql, "owner-a", held.map(delivered), {
        owner: "owner-a",
        limit: 10,
        leaseMs: LEASE_MS,
        tenantCap: 4,
      });
      assert.deepEqual(recorded.map((r) => r.kept), [true, true, true, true]);
      assert.equal(claimed.filter((d) => d.tenantId === busy).length, 4);
      assert.equal(claimed.filter((d) => d.tenantId === other).length, 1);
      const [row] = await sql`
        SELECT count(*) FILTER (WHERE status = 'delivered')::int AS delivered,
               count(*) FILTER (WHERE lease_owner = 'owner-a')::int AS leased
        FROM deliveries WHERE tenant_id = ${busy}`;
      assert.deepEqual({ ...row }, { delivered: 4, leased: 4 });
      held.splice(0, 4, ...claimed.filter((d) => d.tenantId === busy));
    });

    await t.step(
      "a callback the records find failing gets one slot in the same claim",
      async () => {
        await sql`UPDATE tenants SET delivery_failure_streak = ${FAILING_CALLBACK_STREAK - 1}
                WHERE id = ${busy}`;
        // One failure makes the streak; the other three leases stay held, above the one slot.
        const { recorded, claimed } = await recordAndClaim(sql, "owner-a", [{
          deliveryId: held[0].id,
          tenantId: busy,
          result: failure(),
          verdict: { status: "pending", nextAttemptAt: new Date(Date.now() + 3_600_000) },
        }], { owner: "owner-a", limit: 10, leaseMs: LEASE_MS, tenantCap: 4 });
        assert.equal(recorded[0].failureStreak, FAILING_CALLBACK_STREAK);
        assert.equal(claimed.length, 0, "three leases held: nothing more while the callback fails");
        // Once they are recorded as successes, the callback recovers and the full share returns.
        const after = await recordAndClaim(sql, "owner-a", held.slice(1).map(delivered), {
          owner: "owner-a",
          limit: 10,
          leaseMs: LEASE_MS,
          tenantCap: 4,
        });
        assert.equal(after.claimed.length, 4);
      },
    );
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("delivery queue: a batch of attempts records each as one by one would", async () => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const broken = await tenantWithBacklog(sql, "broken", 8);
    const healthy = await tenantWithBacklog(sql, "healthy", 2);
    const claimed = await claim(sql, "owner-a", 100, 100);
    assert.equal(claimed.length, 10);
    const ofBroken = claimed.filter((d) => d.tenantId === broken).map((d) => d.id).sort();
    const ofHealthy = claimed.filter((d) => d.tenantId === healthy).map((d) => d.id).sort();
    const success = { ...failure(), responseCode: 200 };
    const retry = { status: "pending" as const, nextAttemptAt: new Date(Date.now() + 60_000) };
    // Another owner took one delivery over: its attempt is recorded, its state left alone.
    await sql`UPDATE deliveries SET lease_owner = 'owner-b' WHERE id = ${ofBroken[0]}`;
    const first = await recordAttempts(sql, "owner-a", [
      ...ofBroken.slice(0, 6).map((deliveryId) => ({
        deliveryId,
        tenantId: broken,
        result: failure(),
        verdict: retry,
      })),
      {
        deliveryId: ofHealthy[0],
        tenantId: healthy,
        result: success,
        verdict: { status: "delivered" },
      },
    ]);
    assert.deepEqual(first.map((r) => r.kept), [false, true, true, true, true, true, true]);
    assert.deepEqual(first.map((r) => r.failureStreak), [1, 2, 3, 4, 5, 6, 0]);
    assert.equal(first[6].previousStreak, null, "a healthy tenant's streak is left alone");
    const second = await recordAttempts(sql, "owner-a", [
      {
        deliveryId: ofBroken[6],
        tenantId: broken,
        result: success,
        verdict: { status: "delivered" },
      },
      {
        deliveryId: ofBroken[7],
        tenantId: broken,
        result: failure(),
        verdict: { status: "failed" },
      },
    ]);
    assert.deepEqual(second.map((r) => [r.failureStreak, r.previousStreak]), [[0, 6], [1, 0]]);
    const [tenant] = await sql`SELECT delivery_failure_streak FROM tenants WHERE id = ${broken}`;
    assert.equal(tenant.delivery_failure_streak, 1);
    const states = await sql`
      SELECT id, status, attempts, lease_owner,
             (SELECT count(*)::int FROM delivery_attempts a WHERE a.delivery_id = d.id) AS logged
      FROM deliveries d WHERE tenant_id = ${broken} ORDER BY id`;
    assert.deepEqual(states.map((r) => [r.id, r.status, r.attempts, r.lease_owner, r.logged]), [
      [ofBroken[0], "pending", 0, "owner-b", 1],
      ...ofBroken.slice(1, 6).map((id) => [id, "pending", 1, null, 1]),
      [ofBroken[6], "delivered", 1, null, 1],
      [ofBroken[7], "failed", 1, null, 1],
    ]);
  } finally {
    await db.close();
    await test.drop();
  }
});

/**
 * Runs `hold` in a transaction on a connection of its own (another process, say), which keeps
 * the rows it locked while `run` runs; commits once `run` is done, and returns what it returned.
 * `run` gets a second connection of that other process, outside its transaction.
 */
async function whileHeldElsewhere<T>(
  test: TestDatabase,
  hold: (tx: postgres.TransactionSql) => Promise<unknown>,
  run: (other: postgres.Sql) => Promise<T>,
): Promise<T> {
  const other = postgres(test.env.DATABASE_URL, { max: 2, onnotice: () => {} });
  try {
    let commit!: () => void;
    let held!: () => void;
    const holding = new Promise<void>((resolve) => held = resolve);
    const transaction = other.begin(async (tx) => {
      await hold(tx);
      held();
      await new Promise<void>((resolve) => commit = resolve);
    });
    await holding;
    try {
      return await run(other);
    } finally {
      commit();
      await transaction;
    }
  } finally {
    await other.end();
  }
}

Deno.test({
  name: "delivery queue: a record counts from the streak another process just committed",
  // Two connections at once: the embedded engine serves one.
  ignore: ENGINE === "embedded",
}, async () => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const broken = await tenantWithBacklog(sql, "broken", 5);
    const claimed = (await claim(sql, "owner-a", 100, 100)).map((d) => d.id).sort();
    const retry = { status: "pending" as const, nextAttemptAt: new Date(Date.now() + 60_000) };
    const attempt = (deliveryId: string) => ({
      deliveryId,
      tenantId: broken,
      result: failure(),
      verdict: retry,
    });
    // Another process's batch of 3 failures for the same tenant, holding the tenant's row.
    const [batch, one] = await whileHeldElsewhere(
      test,
      (tx) =>
        tx`UPDATE tenants SET delivery_failure_streak = delivery_failure_streak + 3
           WHERE id = ${broken}`,
      async (other) => {
        // These take their snapshots before the other commits, then wait for the row.
        const recording = [
          recordAttempts(sql, "owner-a", claimed.slice(0, 4).map(attempt)),
          recordAttempt(sql, "owner-a", attempt(claimed[4])),
        ] as const;
        const deadline = Date.now() + 10_000;
        while (Date.now() < deadline) {
          const [{ waiting }] = await other`
            SELECT count(*)::int AS waiting FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`;
          if (waiting === 2) break;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        return recording;
      },
    );
    const streaks = [...(await batch).map((r) => r.failureStreak), (await one).failureStreak]
      .sort((a, b) => a - b);
    // Each failure after the other batch's 3 is counted once, so the 5th in a row is seen (and
    // logged as the callback failing) exactly once, whichever statement records it.
    assert.deepEqual(streaks, [4, 5, 6, 7, 8]);
    const [tenant] = await sql`SELECT delivery_failure_streak FROM tenants WHERE id = ${broken}`;
    assert.equal(tenant.delivery_failure_streak, 8);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test({
  name: "delivery queue: a success that changes no streak does not wait for the tenant's row",
  // Two connections at once: the embedded engine serves one.
  ignore: ENGINE === "embedded",
}, async () => {
  const { db, test } = await openQueue();
  const sql = db.sql;
  try {
    const healthy = await tenantWithBacklog(sql, "healthy", 2);
    const [first, second] = (await claim(sql, "owner-a", 100, 100)).map((d) => d.id).sort();
    const success = (deliveryId: string) => ({
      deliveryId,
      tenantId: healthy,
      result: { ...failure(), responseCode: 200 },
      verdict: { status: "delivered" as const },
    });
    const timedOut = Symbol("timed out");
    const within = <T>(work: Promise<T>) =>
      Promise.race([
        work,
        new Promise<typeof timedOut>((r) => setTimeout(() => r(timedOut), 2_000)),
      ]);
    // Someone holds the healthy tenant's row (an operator's update, say) for a while.
    const [batch, one] = await whileHeldElsewhere(
      test,
      (tx) => tx`SELECT 1 FROM tenants WHERE id = ${healthy} FOR UPDATE`,
      async () => [
        await within(recordAttempts(sql, "owner-a", [success(first)])),
        await within(recordAttempt(sql, "owner-a", success(second))),
      ],
    );
    assert.notEqual(batch, timedOut, "a batch of successes waited for the tenant's row");
    assert.notEqual(one, timedOut, "a success waited for the tenant's row");
  } finally {
    await db.close();
    await test.drop();
  }
});
