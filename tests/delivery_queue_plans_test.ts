/**
 * The queue's statements stay index-driven however wrong the planner's statistics are. A queue
 * table's shape changes faster than statistics follow: a new database is analyzed while its queue
 * is empty, and a prepared statement's generic plan is made on whatever the table was at its
 * sixth run. With the plans such statistics gave, a claim scanned every pending delivery and every
 * lease left by recorded attempts, and the drain slowed as the backlog grew (docs/architecture.md,
 * "Queue statements and stale statistics").
 *
 * The claim's plans are read from `auto_explain`, which reports each statement's plan with the rows
 * every node produced: PostgreSQL only, since the embedded engine does not ship `auto_explain` and
 * its statements are never prepared. The batch statement's plan is explained again from what the
 * client sent, on both engines.
 */
import assert from "node:assert/strict";
import postgres from "postgres";
import { type AttemptResult, claimDueDeliveries, recordAttempts } from "../src/delivery/queue.ts";
import { connectTestDatabase, ENGINE, freshDatabase } from "./helpers/service.ts";
import type { DeliveryHandOver, HandedOverDelivery } from "../src/delivery/hand_over.ts";
import { IngestBatcher } from "../src/events/ingest_batch.ts";
import type { VerifiedNotification } from "../src/events/ingest.ts";
import { connectDatabase, sharedEmbeddedClient } from "../src/db/connect.ts";
import { migrate } from "../src/db/migrate.ts";

const BACKLOG = 3_000;
const RECORDED = 300;
const TENANT_CAP = 8;
/** A backlog delivered since the statistics were taken. */
const DRAINED = 10_000;

function delivered(): AttemptResult {
  return {
    attemptedAt: new Date(),
    durationMs: 1,
    responseCode: 200,
    responseBody: "",
    error: null,
    retryAfterMs: null,
  };
}

/** `count` events of tenant `t`, each with a delivery pending and due, oldest first. */
async function seedBacklog(sql: postgres.Sql, count: number): Promise<void> {
  await sql`
    INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
    SELECT 'evt_' || g, 't', 'storea', 'ext-' || g, 'renewal', 'DID_RENEW', '{}'
    FROM generate_series(1, ${count}) g`;
  await sql`
    INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at)
    SELECT 'dlv_' || g, 'evt_' || g, 't', 'pending',
           now() - interval '1 hour' + g * interval '1 millisecond'
    FROM generate_series(1, ${count}) g`;
}

/**
 * The most rows any scan of `deliveries` read in a plan, over all its loops: those it produced and
 * those its filter removed.
 */
function widestDeliveriesScan(plan: PlanNode): number {
  const read = (plan["Actual Rows"] ?? 0) + (plan["Rows Removed by Filter"] ?? 0);
  const own = plan["Relation Name"] === "deliveries" || /deliveries_/.test(plan["Index Name"] ?? "")
    ? read * (plan["Actual Loops"] ?? 1)
    : 0;
  return Math.max(own, ...(plan.Plans ?? []).map(widestDeliveriesScan));
}

interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  "Actual Rows"?: number;
  "Actual Loops"?: number;
  "Rows Removed by Filter"?: number;
  Plans?: PlanNode[];
}

for (const mode of ["custom", "generic"] as const) {
  Deno.test({
    name: `delivery queue: a claim reads a few rows of a large backlog (${mode} plan)`,
    ignore: ENGINE !== "postgresql",
    async fn() {
      const test = await freshDatabase();
      const db = await connectTestDatabase(test);
      const plans: PlanNode[] = [];
      const sql = postgres(test.env.DATABASE_URL, {
        max: 1,
        prepare: mode === "generic",
        onnotice(notice) {
          const text = String(notice.message);
          const at = text.indexOf("{");
          if (text.startsWith("duration") && at >= 0) plans.push(JSON.parse(text.slice(at)).Plan);
        },
      });
      try {
        // Statistics taken while the queue is empty, as on a new database.
        await db
          .sql`INSERT INTO tenants (id, name, callback_url) VALUES ('t', 't', 'https://x.test')`;
        await db.sql`ANALYZE`;
        await seedBacklog(db.sql, BACKLOG);
        if (mode === "generic") await sql`SET plan_cache_mode = force_generic_plan`;
        // Attempts recorded leave index entries behind them until the table is vacuumed.
        for (let done = 0; done < RECORDED; done += TENANT_CAP) {
          const claimed = await claimDueDeliveries(sql, {
            owner: "o",
            limit: TENANT_CAP,
            leaseMs: 60_000,
            tenantCap: TENANT_CAP,
          });
          await recordAttempts(
            sql,
            "o",
            claimed.map((d) => ({
              deliveryId: d.id,
              tenantId: d.tenantId,
              result: delivered(),
              verdict: { status: "delivered" as const },
            })),
          );
        }
        await sql`LOAD 'auto_explain'`;
        await sql`SET auto_explain.log_min_duration = 0`;
        await sql`SET auto_explain.log_analyze = on`;
        await sql`SET auto_explain.log_format = json`;
        await sql`SET auto_explain.log_level = notice`;
        const claimed = await claimDueDeliveries(sql, {
          owner: "o",
          limit: TENANT_CAP,
          leaseMs: 60_000,
          tenantCap: TENANT_CAP,
        });
        assert.equal(claimed.length, TENANT_CAP);
        const claimPlan = plans.at(-1)!;
        assert.ok(claimPlan, "auto_explain reported no plan");
        const widest = widestDeliveriesScan(claimPlan);
        assert.ok(
          widest <= 4 * TENANT_CAP,
          `a claim of ${TENANT_CAP} read ${widest} rows of deliveries at one node`,
        );
      } finally {
        await sql.end();
        await db.close();
        await test.drop();
      }
    },
  });
}

/** A dispatcher that takes every delivery handed over to it. */
class TakingHandOver implements DeliveryHandOver {
  readonly owner = "o";
  readonly leaseMs = 60_000;
  readonly tenantCap = TENANT_CAP;
  readonly started: HandedOverDelivery[] = [];
  reserve(): boolean {
    return true;
  }
  release(): void {}
  start(delivery: HandedOverDelivery): void {
    this.started.push(delivery);
  }
}

class Rollback extends Error {}

// Both engines: the embedded engine has no auto_explain, so the batch statement the service sent
// is read back from the client and explained again, with fresh ids, in a transaction rolled back.
Deno.test("delivery queue: the hand-over check reads a few rows once a large backlog has drained", async () => {
  const test = await freshDatabase();
  const url = test.env.DATABASE_URL ?? null;
  // The embedded engine served on DATA_DIR's socket, so that a second client can reach it.
  const db = await connectDatabase({
    databaseUrl: url,
    dataDir: test.dataDir,
    poolSize: 2,
    timeoutMs: 30_000,
    shareEmbedded: true,
  });
  let sent: { query: string; parameters: unknown[] } | null = null;
  const options = {
    max: 1,
    prepare: false,
    onnotice: () => {},
    debug: (_connection: number, query: string, parameters: unknown[]) => {
      if (query.includes("WITH input AS")) sent = { query, parameters: [...parameters] };
    },
  };
  const sql = url ? postgres(url, options) : sharedEmbeddedClient(test.dataDir, options);
  try {
    await migrate(db.sql);
    // Statistics taken while a backlog was pending, then the backlog delivered: the queue is
    // empty, the statistics say it is full until the next analyze.
    await db.sql`INSERT INTO tenants (id, name, callback_url) VALUES ('t', 't', 'https://x.test')`;
    await seedBacklog(db.sql, DRAINED);
    await db.sql`ANALYZE`;
    await db.sql`UPDATE deliveries SET status = 'delivered', next_attempt_at = NULL`;
    await db.sql`VACUUM deliveries`;

    const handOver = new TakingHandOver();
    const receipt = await new IngestBatcher(sql, { handOver }).ingest({
      tenantId: "t",
      source: "storea",
      externalId: "ext-new",
      entry: {
        event: "subscription.renewed",
        reason: null,
        platformEvent: "storea.did_renew",
        subject: null,
      },
      data: { notificationUUID: "ext-new" },
      raw: null,
    } as unknown as VerifiedNotification);
    assert.equal(receipt.isNew, true);
    assert.equal(handOver.started.length, 1, "the new delivery is handed over");
    assert.ok(sent, "the batch statement was not seen");
    const { query, parameters } = sent as { query: string; parameters: unknown[] };
    const fresh = new Map<unknown, string>([
      ["ext-new", "ext-again"],
      [receipt.eventId, "evt_again"],
      [handOver.started[0].id, "dlv_again"],
    ]);
    let plan: PlanNode | null = null;
    await sql.begin(async (tx) => {
      const [row] = await tx.unsafe(
        `EXPLAIN (ANALYZE, FORMAT JSON) ${query}`,
        parameters.map((p) => fresh.get(p) ?? p) as postgres.ParameterOrJSON<never>[],
      );
      plan = (Object.values(row)[0] as { Plan: PlanNode }[])[0].Plan;
      throw new Rollback();
    }).catch((error) => {
      if (!(error instanceof Rollback)) throw error;
    });
    assert.ok(plan, "no plan");
    const widest = widestDeliveriesScan(plan);
    assert.ok(widest <= 4 * TENANT_CAP, `one new notification read ${widest} rows of deliveries`);
  } finally {
    await sql.end();
    await db.close();
    await test.drop();
  }
});
