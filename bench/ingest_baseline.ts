/**
 * The raw-database ingest baseline of `bench/relay.ts`: the service's own one-notification
 * statement (`ingestPrepared` in src/events/ingest.ts: the event and its delivery in one statement,
 * so one transaction each) with a payload of the size the service stores, from `clients`
 * connections, against the benchmark's database and tenant. What it measures is what the engine
 * can commit one notification per transaction, without receiving, verifying or answering anything:
 * the figure the service's ingest is compared with.
 *
 * - PostgreSQL: `pgbench`, pinned to the load core (the PostgreSQL client package and `taskset`).
 * - The embedded engine: this module run as a process of its own (`ingest_baseline.ts embedded
 *   OPTIONS`), pinned to the core the service ran on, with the service's V8 flags and malloc
 *   settings, which opens the data directory as the service does (PGlite in the process, reached through in-memory sockets by `npm:postgres`) and
 *   runs the statement from `clients` concurrent callers. PGlite has one session, which the
 *   service shares the same way: this is the engine's own one-transaction-per-row rate.
 *
 * The payload is one the service stored in the run, so that the engine compresses what it
 * compresses for the service; the ids and external ids are fresh UUIDs, so every transaction
 * inserts.
 * @module
 */
import { connectDatabase } from "../src/db/connect.ts";
import { EMBEDDED_V8_FLAGS, serviceEnvironment } from "../src/process/permissions.ts";
import { runPinnedForJson } from "./support.ts";

/** The statement the service runs for one notification, with pgbench's `:payload` variable. */
const STATEMENT = `
WITH event AS (
  INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                      received_at)
  VALUES ('evt_' || gen_random_uuid(), :tenant, 'storea', gen_random_uuid()::text,
          'subscription.renewed', 'storea.did_renew', :payload, now())
  ON CONFLICT (tenant_id, source, external_id) DO NOTHING
  RETURNING id, tenant_id
), delivery AS (
  INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at, last_error)
  SELECT 'dlv_' || gen_random_uuid(), event.id, event.tenant_id,
         CASE WHEN t.callback_url IS NULL THEN 'failed' ELSE 'pending' END,
         CASE WHEN t.callback_url IS NULL THEN NULL ELSE now() END,
         CASE WHEN t.callback_url IS NULL THEN 'none' END
  FROM event JOIN tenants t ON t.id = event.tenant_id
  RETURNING status
)
SELECT (SELECT status FROM delivery) AS status;
`;

/** What one run measured. */
export interface IngestBaseline {
  /** What ran the statement: `pgbench` or the embedded engine's own client. */
  tool: "pgbench" | "npm:postgres, in process";
  clients: number;
  payloadBytes: number;
  seconds: number;
  transactionsPerSecond: number;
  /** Rows the run added to `events`: checks that every transaction inserted. */
  eventsAdded: number;
  transactions: number;
}

/** Where pgbench is: on PATH, or in the PostgreSQL package's directory. */
export async function findPgbench(): Promise<string> {
  for (const candidate of ["pgbench"]) {
    try {
      const out = await new Deno.Command(candidate, {
        args: ["--version"],
        stdout: "null",
        stderr: "null",
      })
        .output();
      if (out.success) return candidate;
    } catch { /* not on PATH */ }
  }
  const versions: string[] = [];
  try {
    for await (const entry of Deno.readDir("/usr/lib/postgresql")) versions.push(entry.name);
  } catch { /* no PostgreSQL package */ }
  for (const version of versions.sort().reverse()) {
    const path = `/usr/lib/postgresql/${version}/bin/pgbench`;
    try {
      await Deno.stat(path);
      return path;
    } catch { /* next */ }
  }
  throw new Error("pgbench not found: install the PostgreSQL client package");
}

/** Runs the baseline for `seconds` on `databaseUrl`'s `tenantId`, from `core`. */
export async function runIngestBaseline(options: {
  databaseUrl: string;
  tenantId: string;
  countEvents: () => Promise<number>;
  tmp: string;
  core: number;
  clients: number;
  /** A payload the service stored. */
  payload: string;
  seconds: number;
}): Promise<IngestBaseline> {
  const pgbench = await findPgbench();
  const script = `${options.tmp}/ingest-baseline.sql`;
  await Deno.writeTextFile(script, STATEMENT);
  const before = await options.countEvents();
  const output = await new Deno.Command("taskset", {
    args: [
      "-c",
      String(options.core),
      pgbench,
      "-n",
      "-M",
      "prepared",
      "-c",
      String(options.clients),
      "-j",
      "1",
      "-T",
      String(options.seconds),
      "-D",
      `tenant=${options.tenantId}`,
      "-D",
      `payload=${options.payload}`,
      "-f",
      script,
      options.databaseUrl,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(output.stdout);
  if (!output.success) {
    throw new Error(`pgbench failed: ${text}${new TextDecoder().decode(output.stderr)}`);
  }
  const tps = text.match(/tps = ([\d.]+) \(without initial connection time\)/);
  const processed = text.match(/number of transactions actually processed: (\d+)/);
  if (!tps || !processed) throw new Error(`pgbench printed no tps: ${text}`);
  const eventsAdded = (await options.countEvents()) - before;
  return {
    tool: "pgbench",
    clients: options.clients,
    payloadBytes: options.payload.length,
    seconds: options.seconds,
    transactionsPerSecond: Number(tps[1]),
    transactions: Number(processed[1]),
    eventsAdded,
  };
}

/** What an embedded run takes; the service that used `dataDir` must have stopped. */
export interface EmbeddedIngestBaselineOptions {
  dataDir: string;
  tenantId: string;
  core: number;
  clients: number;
  /** A payload the service stored. */
  payload: string;
  seconds: number;
}

/** Runs the baseline on the embedded engine in `dataDir`, in a process pinned to `core`. */
export async function runEmbeddedIngestBaseline(
  options: EmbeddedIngestBaselineOptions,
): Promise<IngestBaseline> {
  return await runPinnedForJson("the embedded ingest baseline", options.core, [
    Deno.execPath(),
    "run",
    "--allow-read",
    "--allow-write",
    "--allow-env",
    "--allow-net",
    "--allow-sys",
    // The engine runs as in the service: the same V8 flags and malloc settings.
    `--v8-flags=${EMBEDDED_V8_FLAGS.join(",")}`,
    new URL(import.meta.url).pathname,
    "embedded",
    JSON.stringify(options),
  ], serviceEnvironment({})) as IngestBaseline;
}

/** The embedded run itself, in the process {@linkcode runEmbeddedIngestBaseline} starts. */
async function measureEmbedded(options: EmbeddedIngestBaselineOptions): Promise<IngestBaseline> {
  const db = await connectDatabase({
    databaseUrl: null,
    dataDir: options.dataDir,
    poolSize: options.clients,
    timeoutMs: 30_000,
    shareEmbedded: false,
  });
  try {
    const statement = STATEMENT.replace(":tenant", "$1").replace(":payload", "$2");
    const { payload } = options;
    const count = async () => (await db.sql`SELECT count(*)::int AS n FROM events`)[0].n;
    const before = await count();
    let transactions = 0;
    const started = performance.now();
    const until = started + options.seconds * 1000;
    await Promise.all(Array.from({ length: options.clients }, async () => {
      while (performance.now() < until) {
        await db.sql.unsafe(statement, [options.tenantId, payload]);
        transactions++;
      }
    }));
    const seconds = (performance.now() - started) / 1000;
    return {
      tool: "npm:postgres, in process",
      clients: options.clients,
      payloadBytes: payload.length,
      seconds: options.seconds,
      transactionsPerSecond: transactions / seconds,
      transactions,
      eventsAdded: (await count()) - before,
    };
  } finally {
    await db.close();
  }
}

if (import.meta.main && Deno.args[0] === "embedded") {
  console.log(JSON.stringify(await measureEmbedded(JSON.parse(Deno.args[1]))));
}
