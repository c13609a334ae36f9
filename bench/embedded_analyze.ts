/**
 * How long the embedded engine's maintenance statements hold PGlite's one session, by the size of
 * a queue table: `VACUUM` after a round of churn, and `ANALYZE` at PostgreSQL's statistics target
 * (100) and at the engine's (10, `ENGINE_SETTINGS` in src/db/embedded/server.ts). Every request waits for
 * such a statement (docs/architecture.md, "Vacuuming the embedded engine").
 *
 * The table is `deliveries`, in a fresh PGlite with the engine's settings and the service's
 * migrations. It is filled with `rows` delivered deliveries (each with its event, of one tenant),
 * frozen and analyzed; then each of three rounds inserts 2,700 deliveries (about 10 s of the relay
 * benchmark's open loop), marks them delivered as the dispatcher's record does, and times a
 * `VACUUM (PROCESS_TOAST FALSE)` as the maintenance runs it, then an `ANALYZE` at each target.
 *
 *     deno run --allow-read --allow-write --allow-env bench/embedded_analyze.ts [--rows 20000,100000,300000]
 * @module
 */
import { parseArgs } from "node:util";
import { PGlite } from "@electric-sql/pglite";
import { ENGINE_SETTINGS } from "../src/db/embedded/server.ts";
import { readMigrations } from "../src/db/migrate.ts";

const CHURN = 2_700;
const ROUNDS = 3;

/** Milliseconds of each statement in each round, by table size. */
interface SizeResult {
  rows: number;
  pages: number;
  vacuumMs: number[];
  analyze100Ms: number[];
  analyze10Ms: number[];
}

async function measure(rows: number): Promise<SizeResult> {
  const dir = await Deno.makeTempDir({ prefix: "purchase-relay-bench-analyze-" });
  const db = await PGlite.create(dir, {
    startParams: [
      ...PGlite.defaultStartParams,
      ...Object.entries(ENGINE_SETTINGS).flatMap(([name, value]) => ["-c", `${name}=${value}`]),
    ],
  });
  try {
    for (const migration of await readMigrations()) await db.exec(migration.sql);
    await db.exec("INSERT INTO tenants (id, name) VALUES ('ten_bench', 'Bench')");
    let next = 0;
    // Inserted pending and leased, as a receiver hands them over, then recorded delivered.
    const deliver = async (count: number) => {
      const from = next;
      next += count;
      await db.query(
        `INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
         SELECT 'evt_' || lpad(g::text, 12, '0'), 'ten_bench', 'storea', 'ext_' || g,
                'subscription.renewed', 'DID_RENEW', '{}'
         FROM generate_series($1::int, $2::int) g`,
        [from, next - 1],
      );
      await db.query(
        `INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at, lease_owner,
                                 lease_expires_at)
         SELECT 'dlv_' || lpad(g::text, 12, '0'), 'evt_' || lpad(g::text, 12, '0'), 'ten_bench', 'pending',
                now(), 'bench', now() + interval '25 s'
         FROM generate_series($1::int, $2::int) g`,
        [from, next - 1],
      );
      await db.query(
        `UPDATE deliveries SET status = 'delivered', attempts = 1, lease_owner = NULL,
                lease_expires_at = NULL, last_attempt_at = now(), last_response_code = 200,
                delivered_at = now(), updated_at = now()
         WHERE id >= 'dlv_' || lpad($1::text, 12, '0') AND status = 'pending'`,
        [from],
      );
    };
    for (let done = 0; done < rows; done += 10_000) await deliver(Math.min(10_000, rows - done));
    await db.exec("VACUUM (FREEZE) deliveries");
    await db.exec("ANALYZE deliveries");
    await db.exec("CHECKPOINT");
    const result: SizeResult = { rows, pages: 0, vacuumMs: [], analyze100Ms: [], analyze10Ms: [] };
    const timed = async (statements: string[]) => {
      const started = performance.now();
      for (const statement of statements) await db.exec(statement);
      return performance.now() - started;
    };
    const analyzeAt = (target: number) => [
      `SET default_statistics_target = ${target}`,
      "ANALYZE deliveries",
    ];
    for (let round = 0; round < ROUNDS; round++) {
      await deliver(CHURN);
      result.vacuumMs.push(await timed(["VACUUM (PROCESS_TOAST FALSE) deliveries"]));
      result.analyze100Ms.push(await timed(analyzeAt(100)));
      result.analyze10Ms.push(await timed(analyzeAt(10)));
    }
    const pages = await db.query<{ pages: number }>(
      "SELECT relpages AS pages FROM pg_class WHERE relname = 'deliveries'",
    );
    result.pages = pages.rows[0].pages;
    return result;
  } finally {
    await db.close();
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { rows: { type: "string", default: "20000,100000,300000" } },
  });
  const ms = (values: number[]) => values.map((value) => value.toFixed(0)).join(", ");
  console.log(
    `| rows before the churn | pages | VACUUM ms | ANALYZE at 100 ms | ANALYZE at 10 ms |\n` +
      `| ---: | ---: | --- | --- | --- |`,
  );
  for (const rows of values.rows.split(",").map(Number)) {
    const result = await measure(rows);
    console.log(
      `| ${rows} | ${result.pages} | ${ms(result.vacuumMs)} | ${ms(result.analyze100Ms)} | ` +
        `${ms(result.analyze10Ms)} |`,
    );
  }
}
