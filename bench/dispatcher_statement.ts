/**
 * The database side of draining on both engines: the dispatcher's one statement per cycle
 * (`recordAndClaim`, src/delivery/queue.ts), which records a batch of delivered attempts and claims
 * as many due deliveries, timed on a backlog of deliveries with 16.6 KB payloads, as the dispatcher
 * sends it (unprepared, so planned at every run: docs/architecture.md, "Queue statements and stale
 * statistics"). No HTTP, no callback: this isolates what one statement costs, how that grows with
 * its rows, and how much of it is planning: after each timed statement the same text and parameters
 * are sent again under `EXPLAIN (SUMMARY)`, which plans without running, for the planning time.
 *
 *     deno run --allow-all bench/dispatcher_statement.ts [--statements N]
 *
 * Each of 3 runs sends `--statements` statements (60 on PostgreSQL, 20 on the embedded engine) per
 * batch size of 8, 16 and 32, each recording the deliveries the one before claimed; every
 * statement must record and claim its full batch; the medians are reported. PostgreSQL: a
 * temporary database on `BENCH_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`);
 * embedded: a temporary data directory.
 * @module
 */
import { parseArgs } from "node:util";
import postgres from "postgres";
import {
  connectDatabase,
  type Database,
  sharedEmbeddedClient,
  type Sql,
} from "../src/db/connect.ts";
import { migrate } from "../src/db/migrate.ts";
import {
  type AttemptToRecord,
  type ClaimedDelivery,
  recordAndClaim,
} from "../src/delivery/queue.ts";
import { createDatabase, writeProgress } from "./support.ts";

const BATCHES = [8, 16, 32];
const RUNS = 3;
const PAYLOAD_CHARS = 16_600;
const OWNER = "bench_dispatcher";

/** A payload that compresses about as a store A notification's does: structure, some entropy. */
function payload(): string {
  const items = Array.from({ length: 400 }, (_, i) => ({ id: crypto.randomUUID(), i }));
  return JSON.stringify({ items }).slice(0, PAYLOAD_CHARS - 2) + '"}';
}

async function seed(sql: Sql, deliveries: number): Promise<void> {
  await sql`INSERT INTO tenants (id, name, active, callback_url)
    VALUES ('tenant_bench', 'bench', true, 'https://example.com/hook')`;
  for (let from = 1; from <= deliveries; from += 1_000) {
    const to = Math.min(deliveries, from + 999);
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
      SELECT 'evt_' || g, 'tenant_bench', 'storea', 'ext_' || g, 'subscription.renewed',
             'storea.did_renew', ${payload()}
      FROM generate_series(${from}::int, ${to}::int) g`;
    await sql`
      INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at)
      SELECT 'dlv_' || g, 'evt_' || g, 'tenant_bench', 'pending',
             now() - interval '1 hour' + g * interval '1 millisecond'
      FROM generate_series(${from}::int, ${to}::int) g`;
  }
  await sql`ANALYZE`;
}

function delivered(delivery: ClaimedDelivery): AttemptToRecord {
  return {
    deliveryId: delivery.id,
    tenantId: delivery.tenantId,
    result: {
      attemptedAt: new Date(),
      durationMs: 2,
      responseCode: 200,
      responseBody: "",
      error: null,
      retryAfterMs: null,
    },
    verdict: { status: "delivered" },
  };
}

/** A client that keeps the text and parameters of the last statement it sent. */
function capturingClient(make: (options: postgres.Options<never>) => Sql) {
  const last = { query: "", parameters: [] as unknown[] };
  const sql = make({
    debug: (_connection: number, query: string, parameters: unknown[]) => {
      Object.assign(last, { query, parameters });
    },
  } as postgres.Options<never>);
  return { sql, last };
}

/**
 * The medians, over `statements` runs of `batch` records and claims, of the milliseconds per
 * statement and of the milliseconds the same statement takes to plan.
 */
async function measure(
  client: ReturnType<typeof capturingClient>,
  batch: number,
  statements: number,
): Promise<{ total: number; planning: number }> {
  const { sql, last } = client;
  const claim = { owner: OWNER, limit: batch, leaseMs: 60_000, tenantCap: batch };
  let held = (await recordAndClaim(sql, OWNER, [], claim)).claimed;
  const totals: number[] = [];
  const plannings: number[] = [];
  for (let i = 0; i < statements; i++) {
    const started = performance.now();
    const { recorded, claimed } = await recordAndClaim(sql, OWNER, held.map(delivered), claim);
    totals.push(performance.now() - started);
    if (recorded.some((r) => !r.kept) || claimed.length !== batch) {
      throw new Error(
        "a statement recorded or claimed short: the backlog ran out or a lease was lost",
      );
    }
    held = claimed;
    const plan = await sql.unsafe(
      `EXPLAIN (SUMMARY) ${last.query}`,
      last.parameters as postgres.ParameterOrJSON<never>[],
    );
    const summary = plan.map((row) => String(Object.values(row)[0]))
      .find((line) => line.startsWith("Planning Time:"));
    plannings.push(Number(summary?.match(/([\d.]+) ms/)?.[1] ?? NaN));
  }
  // Leaves nothing leased behind for the next run.
  await recordAndClaim(sql, OWNER, held.map(delivered), null);
  return { total: median(totals), planning: median(plannings) };
}

function median(values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
}

async function benchEngine(
  db: Database,
  client: ReturnType<typeof capturingClient>,
  statements: number,
): Promise<string[]> {
  const perRun = BATCHES.reduce((sum, batch) => sum + (statements + 2) * batch, 0);
  writeProgress(`${db.engine}: seeding ${RUNS * perRun} deliveries`);
  await seed(db.sql, RUNS * perRun);
  const results = new Map(
    BATCHES.map((batch) => [batch, [] as { total: number; planning: number }[]]),
  );
  for (let run = 0; run < RUNS; run++) {
    for (const batch of BATCHES) {
      writeProgress(
        `${db.engine}: run ${run + 1} of ${RUNS}, ${statements} statements of ${batch}`,
      );
      results.get(batch)!.push(await measure(client, batch, statements));
    }
  }
  return BATCHES.map((batch) => {
    const total = median(results.get(batch)!.map((r) => r.total));
    const planning = median(results.get(batch)!.map((r) => r.planning));
    return `| ${db.engine} | ${batch} | ${total.toFixed(2)} | ${planning.toFixed(2)} | ` +
      `${(100 * planning / total).toFixed(0)}% | ${(1000 * total / batch).toFixed(0)} |`;
  });
}

/** Connects to one engine, migrates it, and runs {@linkcode benchEngine} with `client`'s client. */
async function benchOn(
  where: { databaseUrl: string | null; dataDir: string; shareEmbedded: boolean },
  client: (options: postgres.Options<never>) => Sql,
  statements: number,
): Promise<string[]> {
  const db = await connectDatabase({ ...where, poolSize: 2, timeoutMs: 30_000 });
  const capturing = capturingClient(client);
  try {
    await migrate(db.sql);
    return await benchEngine(db, capturing, statements);
  } finally {
    await capturing.sql.end();
    await db.close();
  }
}

async function benchPostgres(statements: number): Promise<string[]> {
  const pg = await createDatabase();
  try {
    // As the dispatcher's own pool sends its statements (src/db/connect.ts): unprepared.
    return await benchOn(
      { databaseUrl: pg.url, dataDir: "", shareEmbedded: false },
      (options) => postgres(pg.url, { ...options, max: 1, prepare: false, onnotice: () => {} }),
      statements,
    );
  } finally {
    await pg.drop();
  }
}

async function benchEmbedded(statements: number): Promise<string[]> {
  const dataDir = await Deno.makeTempDir({ prefix: "purchase-relay-bench-dispatcher-" });
  try {
    // Served on the data directory's socket, as a service serves it, for a client of our own
    // that, like the dispatcher's, sends unprepared statements (over the socket, not in memory).
    return await benchOn(
      { databaseUrl: null, dataDir, shareEmbedded: true },
      (options) => sharedEmbeddedClient(dataDir, options),
      statements,
    );
  } finally {
    await Deno.remove(dataDir, { recursive: true }).catch(() => {});
  }
}

if (import.meta.main) {
  const { values } = parseArgs({ args: Deno.args, options: { statements: { type: "string" } } });
  const rows = [
    ...await benchPostgres(Number(values.statements ?? 60)),
    ...await benchEmbedded(Number(values.statements ?? 20)),
  ];
  console.log(
    "| engine | rows | ms per statement | of it planning, ms | planning share | µs per delivery |\n" +
      `| --- | ---: | ---: | ---: | ---: | ---: |\n${rows.join("\n")}`,
  );
}
