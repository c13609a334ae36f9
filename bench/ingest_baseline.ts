/**
 * The raw-PostgreSQL ingest baseline of `bench/relay.ts`: `pgbench` runs the service's own
 * one-notification statement (`ingestPrepared` in src/events/ingest.ts: the event and its delivery
 * in one statement, so one transaction each) with a payload of the size the service stores, from
 * `clients` connections, pinned to the load core, against the benchmark's database and tenant.
 * What it measures is what PostgreSQL can commit one notification per transaction, without
 * receiving, verifying or answering anything: the figure the service's ingest is compared with.
 *
 * The payload is random base64 (as incompressible as the signed notifications the service stores,
 * so TOAST compression does not make the baseline cheaper); the ids and external ids are fresh
 * UUIDs, so every transaction inserts. It needs `pgbench` (the PostgreSQL client package) and
 * `taskset`.
 * @module
 */

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

/** What one pgbench run measured. */
export interface IngestBaseline {
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
  payloadBytes: number;
  seconds: number;
}): Promise<IngestBaseline> {
  const pgbench = await findPgbench();
  const script = `${options.tmp}/ingest-baseline.sql`;
  await Deno.writeTextFile(script, STATEMENT);
  const raw = crypto.getRandomValues(new Uint8Array(Math.ceil(options.payloadBytes * 3 / 4)));
  const payload = btoa(String.fromCharCode(...raw)).slice(0, options.payloadBytes);
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
      `payload=${payload}`,
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
    clients: options.clients,
    payloadBytes: options.payloadBytes,
    seconds: options.seconds,
    transactionsPerSecond: Number(tps[1]),
    transactions: Number(processed[1]),
    eventsAdded,
  };
}
