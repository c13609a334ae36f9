/**
 * The database side of ingest on both engines: 32 concurrent callers store distinct notifications
 * (a 16.6 KB random base64 payload each), one statement per notification (`ingestNotification`,
 * src/events/ingest.ts, what the receivers did before group commit) against group commit
 * (`IngestBatcher`, src/events/ingest_batch.ts, what they do now). No HTTP, no JWS: this isolates
 * what batching changes. The two are interleaved, 3 runs each, and the median reported; every run
 * checks that each caller got a new event and that the table holds exactly the events stored.
 *
 *     deno run --allow-all bench/ingest_batch.ts [--seconds 3]
 *
 * PostgreSQL: a temporary database on `BENCH_DATABASE_URL` (default
 * `postgres://postgres@127.0.0.1:5432/postgres`); embedded: a temporary data directory.
 * @module
 */
import { parseArgs } from "node:util";
import { connectDatabase, type Database } from "../src/db/connect.ts";
import { migrate } from "../src/db/migrate.ts";
import { ingestNotification, type VerifiedNotification } from "../src/events/ingest.ts";
import { IngestBatcher } from "../src/events/ingest_batch.ts";
import { createDatabase } from "./support.ts";

const CALLERS = 32;
const PAYLOAD_CHARS = 16_600;
const RUNS = 3;

function randomText(chars: number): string {
  const raw = crypto.getRandomValues(new Uint8Array(Math.ceil(chars * 3 / 4)));
  let binary = "";
  for (const byte of raw) binary += String.fromCharCode(byte);
  return btoa(binary).slice(0, chars);
}

async function measure(
  db: Database,
  ingest: (n: VerifiedNotification) => Promise<{ isNew: boolean }>,
  seconds: number,
  run: string,
): Promise<number> {
  const padding = randomText(PAYLOAD_CHARS);
  const [{ before }] = await db.sql`SELECT count(*)::int AS before FROM events`;
  let stored = 0;
  let next = 0;
  const until = performance.now() + seconds * 1000;
  const started = performance.now();
  await Promise.all(Array.from({ length: CALLERS }, async () => {
    while (performance.now() < until) {
      const externalId = `${run}-${next++}`;
      const receipt = await ingest({
        tenantId: "tenant_bench",
        source: "storea",
        externalId,
        entry: {
          event: "subscription.renewed",
          reason: null,
          platformEvent: "storea.did_renew",
          subject: null,
        } as unknown as VerifiedNotification["entry"],
        data: { notificationUUID: externalId, padding },
        raw: null,
        occurredAt: null,
        state: null,
      });
      if (!receipt.isNew) throw new Error(`${externalId} was not stored as new`);
      stored++;
    }
  }));
  const elapsed = (performance.now() - started) / 1000;
  const [{ after }] = await db.sql`SELECT count(*)::int AS after FROM events`;
  if (after - before !== stored) throw new Error(`${stored} stored, ${after - before} rows added`);
  return stored / elapsed;
}

function median(values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
}

async function benchEngine(db: Database, seconds: number, maxInFlight?: number) {
  await migrate(db.sql);
  await db.sql`INSERT INTO tenants (id, name, active, callback_url)
    VALUES ('tenant_bench', 'bench', true, 'https://example.com/hook')`;
  const batcher = new IngestBatcher(db.sql, maxInFlight ? { maxInFlight } : {});
  const single: number[] = [];
  const grouped: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    single.push(await measure(db, (n) => ingestNotification(db.sql, n), seconds, `s${i}`));
    grouped.push(await measure(db, (n) => batcher.ingest(n), seconds, `g${i}`));
  }
  return {
    single: median(single),
    grouped: median(grouped),
    rowsPerStatement: batcher.rows / batcher.batches,
  };
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { seconds: { type: "string" }, "in-flight": { type: "string" } },
  });
  const seconds = Number(values.seconds ?? 3);
  const inFlight = values["in-flight"] ? Number(values["in-flight"]) : undefined;
  const rows: string[] = [];
  const measure = async (label: string, databaseUrl: string | null, dataDir: string) => {
    const db = await connectDatabase({
      databaseUrl,
      dataDir,
      poolSize: 10,
      timeoutMs: 30_000,
      shareEmbedded: false,
    });
    try {
      const r = await benchEngine(db, seconds, inFlight);
      rows.push(
        `| ${label} | ${r.single.toFixed(0)} | ${r.grouped.toFixed(0)} | ` +
          `${(r.grouped / r.single).toFixed(2)}x | ${r.rowsPerStatement.toFixed(1)} |`,
      );
    } finally {
      await db.close();
    }
  };
  const pg = await createDatabase();
  try {
    await measure("PostgreSQL", pg.url, "");
  } finally {
    await pg.drop();
  }
  const dataDir = await Deno.makeTempDir({ prefix: "purchase-relay-bench-ingest-" });
  try {
    await measure("embedded  ", null, dataDir);
  } finally {
    await Deno.remove(dataDir, { recursive: true }).catch(() => {});
  }
  console.log(
    `| engine | one per statement/s | group commit/s | ratio | rows per statement |\n` +
      `| --- | ---: | ---: | ---: | ---: |\n${rows.join("\n")}`,
  );
}
