/**
 * The queue's statements stay index-driven however wrong the planner's statistics are. A queue
 * table's shape changes faster than statistics follow: a new database is analyzed while its queue
 * is empty, and a prepared statement's generic plan is made on whatever the table was at its
 * sixth run. With the plans such statistics gave, a claim scanned every pending delivery and every
 * lease left by recorded attempts, and the drain slowed as the backlog grew (docs/architecture.md,
 * "Queue statements and stale statistics").
 *
 * The plans are read from `auto_explain`, which reports each statement's plan with the rows every
 * node produced. PostgreSQL only: the embedded engine does not ship `auto_explain`, and its
 * statements are never prepared.
 */
import assert from "node:assert/strict";
import postgres from "postgres";
import { type AttemptResult, claimDueDeliveries, recordAttempts } from "../src/delivery/queue.ts";
import { connectTestDatabase, ENGINE, freshDatabase } from "./helpers/service.ts";

const BACKLOG = 3_000;
const RECORDED = 300;
const TENANT_CAP = 8;

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

/** The most rows any scan of `deliveries` produced in a plan, over all its loops. */
function widestDeliveriesScan(plan: PlanNode): number {
  const own = plan["Relation Name"] === "deliveries" || /deliveries_/.test(plan["Index Name"] ?? "")
    ? (plan["Actual Rows"] ?? 0) * (plan["Actual Loops"] ?? 1)
    : 0;
  return Math.max(own, ...(plan.Plans ?? []).map(widestDeliveriesScan));
}

interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  "Actual Rows"?: number;
  "Actual Loops"?: number;
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
        await db.sql`
          INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
          SELECT 'evt_' || g, 't', 'storea', 'ext-' || g, 'renewal', 'DID_RENEW', '{}'
          FROM generate_series(1, ${BACKLOG}) g`;
        await db.sql`
          INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at)
          SELECT 'dlv_' || g, 'evt_' || g, 't', 'pending',
                 now() - interval '1 hour' + g * interval '1 millisecond'
          FROM generate_series(1, ${BACKLOG}) g`;
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
