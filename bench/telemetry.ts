/**
 * The cost of telemetry on `GET /health`: the service as in production (embedded engine,
 * `NODE_ENV=production`, `LOG_LEVEL=info`) with OpenTelemetry off, and with `OTEL_DENO=true`
 * exporting (the default `http/protobuf`) to an OTLP sink on loopback that this process runs and
 * that answers every export at once (docs/observability.md, "Telemetry").
 *
 * Also with 1% of traces sampled, and the bare `Deno.serve` of bench/bare_health_server.ts off and
 * on, which tells how much of the cost is the runtime's own instrumentation of every request.
 *
 * As bench/health.ts: the server is pinned to one core, `wrk` to the other; the variants run in
 * `rounds` (3) interleaved rounds, each a fresh process, and each figure is the median of the
 * rounds, each ratio (against the same server with telemetry off) the median of the rounds'.
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/telemetry.ts
 *
 * Flags: `--duration S`, `--warmup S` (10 s and 3 s), `--rounds N` (3), `--json`.
 * @module
 */
import { parseArgs } from "node:util";
import {
  beginRun,
  formatTable,
  LOAD_FLAGS,
  loadOptionsFromFlags,
  loadSettings,
  median,
  numberFlag,
  parseWrk,
  productionServiceEnv,
  runWrk,
  startBaseline,
  startService,
  stop,
  writeProgress,
  type WrkFigures,
} from "./support.ts";

interface Run extends WrkFigures {
  name: string;
}

/** A variant: its name, its extra environment, and whether it is the bare `Deno.serve`. */
type Variant = [name: string, env: Record<string, string>, bare: boolean];

async function measure(
  [name, extraEnv, bare]: Variant,
  settings: ReturnType<typeof loadSettings>,
): Promise<Run> {
  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-otel-" });
  const server = bare
    ? await startBaseline("bench/bare_health_server.ts", `${tmp}/`, {
      core: settings.serverCore,
      env: extraEnv,
    })
    : await startService(`${tmp}/`, {
      core: settings.serverCore,
      env: await productionServiceEnv(tmp, extraEnv),
    });
  try {
    const url = `${server.url}/health`;
    writeProgress(`${name}: warming up ${settings.warmupSeconds} s`);
    await runWrk(url, settings, { seconds: settings.warmupSeconds, latency: false });
    writeProgress(`${name}: measuring ${settings.durationSeconds} s`);
    const report = await runWrk(url, settings, {
      seconds: settings.durationSeconds,
      latency: true,
    });
    const figures = parseWrk(report, true);
    writeProgress(
      `${name}: ${figures.requestsPerSecond.toFixed(0)} req/s, p99 ${figures.p99Ms} ms`,
    );
    return { name, ...figures };
  } finally {
    await stop(server);
    await Deno.remove(tmp, { recursive: true });
  }
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { ...LOAD_FLAGS, rounds: { type: "string" } },
  });
  const settings = loadSettings(loadOptionsFromFlags(values));
  const rounds = numberFlag(values.rounds) ?? 3;
  const { startedAt } = await beginRun(settings, writeProgress);
  let exports = 0;
  const sink = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    await request.arrayBuffer();
    exports++;
    return new Response(null, { status: 200 });
  });
  const on = {
    OTEL_DENO: "true",
    OTEL_SERVICE_NAME: "purchase-relay-bench",
    OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${sink.addr.port}`,
  };
  const variants: Variant[] = [
    ["telemetry off", {}, false],
    ["telemetry on (OTLP to loopback)", on, false],
    ["telemetry on, 1% of traces sampled", {
      ...on,
      OTEL_TRACES_SAMPLER: "parentbased_traceidratio",
      OTEL_TRACES_SAMPLER_ARG: "0.01",
    }, false],
    ["bare Deno.serve, telemetry off", {}, true],
    ["bare Deno.serve, telemetry on", on, true],
  ];
  const runs: Run[][] = [];
  try {
    for (let round = 1; round <= rounds; round++) {
      writeProgress(`round ${round} of ${rounds}`);
      const row: Run[] = [];
      for (const variant of variants) row.push(await measure(variant, settings));
      runs.push(row);
    }
  } finally {
    await sink.shutdown();
  }
  const rows = variants.map(([name], i) => {
    const of = (pick: (run: Run) => number) => median(runs.map((row) => pick(row[i])));
    // Each against its own "off": the service's first variant, the bare server's fourth.
    const base = variants[i][2] ? 3 : 0;
    const ratio = median(runs.map((row) => row[i].requestsPerSecond / row[base].requestsPerSecond));
    return {
      name,
      requestsPerSecond: of((r) => r.requestsPerSecond),
      p50Ms: of((r) => r.p50Ms),
      p99Ms: of((r) => r.p99Ms),
      ratio,
    };
  });
  console.log(`## GET /health, telemetry off and on (${startedAt})\n`);
  console.log(formatTable(
    [
      { header: "Service" },
      { header: "req/s", numeric: true },
      { header: "vs off", numeric: true },
      { header: "p50 ms", numeric: true },
      { header: "p99 ms", numeric: true },
    ],
    rows.map((r) => [
      r.name,
      r.requestsPerSecond.toFixed(0),
      r.ratio.toFixed(2),
      r.p50Ms.toFixed(2),
      r.p99Ms.toFixed(2),
    ]),
  ));
  console.log(`\nmedians of ${rounds} interleaved rounds; OTLP exports received: ${exports}`);
  if (values.json) {
    console.log(JSON.stringify({ startedAt, settings, runs, rows }));
  }
}
