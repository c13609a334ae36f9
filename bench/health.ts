/**
 * `GET /health` of the real service against a bare `Deno.serve` answering the same body, and
 * against a floor: the bare server plus only the headers and log line every response must have
 * (`bench/floor_health_server.ts`), which tells how much of the gap any implementation would pay on
 * the machine.
 *
 * Each server runs as its own `deno` process pinned to one core (`taskset -c 0`); `wrk` runs pinned
 * to another (`taskset -c 1`), first for a warm-up, then for the measured run with `--latency`.
 * The bare server, the service on PostgreSQL and the floor run in `rounds` (3) interleaved rounds,
 * each a fresh process, so that a slow minute of a shared machine falls on all three; each figure
 * is the median of the rounds, each ratio the median of the rounds' ratios.
 * The service runs twice, as in production (`NODE_ENV=production`, `LOG_LEVEL=info`): first on a
 * temporary PostgreSQL database (`BENCH_DATABASE_URL`), the production setup, which the goals are
 * judged on; then on the embedded engine in a fresh temporary directory, whose peak RSS has a
 * goal of its own. Its stdout, one `http_request` JSON line per request, is
 * written to a real file, so the cost of logging is part of what is measured.
 * The peak RSS is read from `/proc/<pid>/status` of the deno process itself at the end of the run.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/health.ts
 *
 * Flags: `--json` also prints every figure as JSON, `--duration S` and `--warmup S` change the
 * length of the runs (10 s and 3 s), `--rounds N` the rounds (3), `--keep-temp` keeps the temporary directories (logs, service
 * data). It needs `wrk` (`apt-get install wrk`) and `taskset` (util-linux). Imported, it exports
 * {@linkcode runHealthBenchmark}, which returns the figures, and {@linkcode formatHealthTable}.
 * @module
 */
import {
  beginRun,
  createDatabase,
  formatTable,
  loadAverage,
  type LoadOptions,
  type LoadSettings,
  loadSettings,
  type Machine,
  median,
  parseWrk,
  pct,
  productionServiceEnv,
  type Progress,
  readMemory,
  runLoadBenchmarkCommand,
  runWrk,
  scanStdout,
  type Server,
  startBaseline,
  startService,
  stop,
  watchCpu,
  writeProgress,
  type WrkFigures,
} from "./support.ts";
import { HEALTH_BODY, JSON_TYPE } from "./baseline.ts";

/** Options of {@linkcode runHealthBenchmark}. */
export interface HealthBenchmarkOptions extends LoadOptions {
  /** Interleaved rounds of the bare server, the service and the floor; 3 by default. */
  rounds?: number;
}

/** The figures of one server. */
export interface TargetResult extends WrkFigures {
  name: string;
  /** Peak resident set (VmHWM) of the deno server process, in MiB. */
  rssMb: number;
  /** Resident set (VmRSS) at the end of the run, in MiB. */
  rssEndMb: number;
  /** CPU time the server used during the measured run, per second of it (1 = a whole core). */
  serverCpuCores: number;
  /**
   * How busy the server's core and wrk's core were during the measured run (0 to 1), whoever used
   * them: a server core much busier than `serverCpuCores` means other processes competed for it.
   */
  serverCoreBusy: number;
  loadCoreBusy: number;
  /** `http_request` lines found in the server's stdout file (the whole run, warm-up included). */
  httpRequestLogLines: number;
  /** Bytes the server wrote to its stdout file. */
  stdoutBytes: number;
}

/** What {@linkcode runHealthBenchmark} returns. */
export interface HealthBenchmarkResult {
  endpoint: "GET /health";
  startedAt: string;
  machine: Machine;
  settings: LoadSettings & { rounds: number };
  /** The medians of the rounds (each field the median of its own). */
  bare: TargetResult;
  /** The bare server plus the required per-request headers and log line, and nothing else. */
  floor: TargetResult;
  /** The service on PostgreSQL: the production setup, which the goals are judged on. */
  service: TargetResult;
  /** The service on the embedded engine, measured once after the rounds. */
  serviceEmbedded: TargetResult;
  /** Every round's runs of the three servers, in the order they ran. */
  rounds: { bare: TargetResult; service: TargetResult; floor: TargetResult }[];
  /** The 1-minute load average when each round began. */
  loadAverages: number[];
  /** service req/s divided by bare req/s: the median of the rounds'. */
  ratio: number;
  /** service req/s divided by the floor's in each round. */
  floorRatios: number[];
  /** Their median: what the goal is judged on. */
  serviceVsFloor: number;
  /** floor req/s divided by bare req/s: the most the required per-request work leaves. */
  floorRatio: number;
  /** serviceEmbedded req/s divided by bare req/s (the bare server's median). */
  ratioEmbedded: number;
  goal: {
    minFloorRatio: number;
    maxRssMb: number;
    ratioMet: boolean;
    rssMet: boolean;
    /** Both goals on PostgreSQL. */
    met: boolean;
    /** The embedded engine's own goal: its peak RSS. */
    maxRssEmbeddedMb: number;
    rssEmbeddedMet: boolean;
  };
}

/**
 * The goal: at least this share of the floor's req/s, with the log line written per request. The
 * floor does only the per-request work every response needs (bench/floor_health_server.ts).
 */
export const MIN_FLOOR_RATIO = 0.9;
/** The goal: the service's peak RSS stays under this many MiB. */
export const MAX_RSS_MB = 100;
/** The embedded engine's goal: the service's peak RSS, its first boot included, at most this. */
export const MAX_RSS_EMBEDDED_MB = 250;

/**
 * Runs the benchmark: `rounds` rounds of the bare server, the service on PostgreSQL and the floor,
 * each a fresh process; then the service on the embedded engine once.
 */
export async function runHealthBenchmark(
  options: HealthBenchmarkOptions = {},
): Promise<HealthBenchmarkResult> {
  const settings = { ...loadSettings(options), rounds: options.rounds ?? 3 };
  const progress = options.progress ?? writeProgress;
  const { startedAt, machine } = await beginRun(settings, progress);

  const run = (name: string, start: Starter) =>
    measure(name, settings, progress, options.keepTemp, start);
  const rounds: HealthBenchmarkResult["rounds"] = [];
  const loadAverages: number[] = [];
  const database = await createDatabase();
  try {
    const onPostgres = serviceTarget({ DATABASE_URL: database.url });
    for (let round = 1; round <= settings.rounds; round++) {
      loadAverages.push(loadAverage());
      progress(`round ${round} of ${settings.rounds}`);
      const bare = await run("bare Deno.serve", startBareTarget);
      const service = await run("purchase-relay /health, PostgreSQL", onPostgres);
      const floor = await run("floor: bare + required headers and log line", startFloorTarget);
      rounds.push({ bare, service, floor });
    }
  } finally {
    await database.drop();
  }
  const serviceEmbedded = await run("purchase-relay /health, embedded", serviceTarget({}));
  for (const target of [...rounds.flatMap((r) => [r.floor, r.service]), serviceEmbedded]) {
    if (target.httpRequestLogLines < target.requests) {
      throw new Error(
        `${target.name} wrote ${target.httpRequestLogLines} http_request lines for ` +
          `${target.requests} measured requests: its logging is not what is being measured`,
      );
    }
  }
  const bare = medianTarget(rounds.map((r) => r.bare));
  const floor = medianTarget(rounds.map((r) => r.floor));
  const service = medianTarget(rounds.map((r) => r.service));
  const rps = (target: TargetResult) => target.requestsPerSecond;
  const floorRatios = rounds.map((r) => rps(r.service) / rps(r.floor));
  const serviceVsFloor = median(floorRatios);
  const ratioMet = serviceVsFloor >= MIN_FLOOR_RATIO;
  const rssMet = service.rssMb < MAX_RSS_MB;
  return {
    endpoint: "GET /health",
    startedAt,
    machine,
    settings,
    bare,
    floor,
    service,
    serviceEmbedded,
    rounds,
    loadAverages,
    ratio: median(rounds.map((r) => rps(r.service) / rps(r.bare))),
    floorRatios,
    serviceVsFloor,
    floorRatio: median(rounds.map((r) => rps(r.floor) / rps(r.bare))),
    ratioEmbedded: rps(serviceEmbedded) / rps(bare),
    goal: {
      minFloorRatio: MIN_FLOOR_RATIO,
      maxRssMb: MAX_RSS_MB,
      ratioMet,
      rssMet,
      met: ratioMet && rssMet,
      maxRssEmbeddedMb: MAX_RSS_EMBEDDED_MB,
      rssEmbeddedMet: serviceEmbedded.rssMb <= MAX_RSS_EMBEDDED_MB,
    },
  };
}

/** One server's runs as one result: each numeric field the median of the runs'. */
function medianTarget(runs: TargetResult[]): TargetResult {
  const result: Record<string, unknown> = { ...runs[0] };
  for (const [field, value] of Object.entries(runs[0])) {
    if (typeof value === "number") {
      result[field] = median(runs.map((run) => run[field as keyof TargetResult] as number));
    }
  }
  return result as unknown as TargetResult;
}

/** The markdown table of a result. */
export function formatHealthTable(result: HealthBenchmarkResult): string {
  const row = (target: TargetResult, ratio: string) => [
    target.name,
    target.requestsPerSecond.toFixed(0),
    target.p50Ms.toFixed(2),
    target.p99Ms.toFixed(2),
    target.rssMb.toFixed(1),
    ratio,
  ];
  return formatTable([
    { header: "server" },
    { header: "req/s", numeric: true },
    { header: "p50 ms", numeric: true },
    { header: "p99 ms", numeric: true },
    { header: "RSS MB", numeric: true },
    { header: "req/s vs bare", numeric: true },
  ], [
    row(result.bare, "1.00"),
    row(result.floor, result.floorRatio.toFixed(2)),
    row(result.service, result.ratio.toFixed(2)),
    row(result.serviceEmbedded, result.ratioEmbedded.toFixed(2)),
  ]);
}

/** One line per goal, saying whether it is met, then the context of the run. */
export function formatHealthGoal(result: HealthBenchmarkResult): string {
  const { goal, ratio, service, serviceEmbedded, floorRatio } = result;
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  return [
    `- on PostgreSQL, req/s at least ${pct(goal.minFloorRatio)} of the floor's: ${
      pct(result.serviceVsFloor)
    } (rounds ${result.floorRatios.map(pct).join(", ")}), ${mark(goal.ratioMet)}`,
    `- on PostgreSQL, peak RSS under ${goal.maxRssMb} MB: ${service.rssMb.toFixed(1)} MB, ${
      mark(goal.rssMet)
    }`,
    `- against the bare server: the floor (the required per-request headers and log line) keeps ` +
    `${pct(floorRatio)} of its req/s, the service on PostgreSQL ${pct(ratio)}`,
    `- server CPU per request (CPU time over requests; steadier than req/s when other ` +
    `processes share the server's core): bare ${cpuMicros(result.bare)}, floor ${
      cpuMicros(result.floor)
    }, service ${cpuMicros(service)} µs: on a whole core the service would keep ${
      pct(
        (result.floor.serverCpuCores / result.floor.requestsPerSecond) /
          (service.serverCpuCores / service.requestsPerSecond),
      )
    } of the floor's req/s`,
    `- on the embedded engine, peak RSS (its first boot included) at most ${goal.maxRssEmbeddedMb} ` +
    `MB: ${serviceEmbedded.rssMb.toFixed(1)} MB, ${mark(goal.rssEmbeddedMet)} (PostgreSQL: ${
      service.rssMb.toFixed(1)
    } MB); req/s ${pct(result.ratioEmbedded)} of bare, not judged`,
    `- load average (1 min) when each round began: ${
      result.loadAverages.map((load) => load.toFixed(2)).join(", ")
    }`,
  ].join("\n");
}

/** The median run's server CPU time per request, µs, to one decimal. */
function cpuMicros(target: TargetResult): string {
  return ((target.serverCpuCores / target.requestsPerSecond) * 1e6).toFixed(1);
}

// --- servers -------------------------------------------------------------------------------------

type Starter = (tmp: string, settings: LoadSettings) => Promise<Server>;

async function measure(
  name: string,
  settings: LoadSettings,
  progress: Progress,
  keepTemp: boolean | undefined,
  start: Starter,
): Promise<TargetResult> {
  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-" });
  let server: Server | undefined;
  try {
    progress(`${name}: starting (temp dir ${tmp})`);
    server = await start(tmp, settings);
    await checkHealthResponse(server.url);
    progress(`${name}: pid ${server.pid} on ${server.url}, warming up ${settings.warmupSeconds} s`);
    await loadHealth(server.url, settings, settings.warmupSeconds, false);
    progress(`${name}: measuring ${settings.durationSeconds} s`);
    const cpu = await watchCpu([server.pid], settings);
    const wrk = await loadHealth(server.url, settings, settings.durationSeconds, true);
    const { seconds: [cpuUsed], busy } = await cpu.end();
    const memory = await readMemory(server.pid);
    const stdoutPath = server.stdoutPath;
    await stop(server);
    server = undefined;
    const stdout = await scanStdout(stdoutPath);
    const result: TargetResult = {
      name,
      ...wrk,
      rssMb: memory.hwmKb / 1024,
      rssEndMb: memory.rssKb / 1024,
      serverCpuCores: cpuUsed / settings.durationSeconds,
      serverCoreBusy: busy.serverCore,
      loadCoreBusy: busy.loadCore,
      httpRequestLogLines: stdout.httpRequestLines,
      stdoutBytes: stdout.bytes,
    };
    progress(
      `${name}: ${
        result.requestsPerSecond.toFixed(0)
      } req/s, p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms, peak RSS ${
        result.rssMb.toFixed(1)
      } MB, server CPU ${result.serverCpuCores.toFixed(2)} cores (core ${settings.serverCore} ${
        pct(result.serverCoreBusy)
      } busy, core ${settings.loadCore} ${
        pct(result.loadCoreBusy)
      } busy), ${result.httpRequestLogLines} http_request lines (${
        (result.stdoutBytes / 1e6).toFixed(1)
      } MB)`,
    );
    if (result.non2xx > 0 || result.socketErrors > 0) {
      progress(`${name}: WARNING ${result.non2xx} non-2xx, ${result.socketErrors} socket errors`);
    }
    return result;
  } finally {
    if (server) await stop(server);
    if (!keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

const startBareTarget: Starter = (tmp, settings) =>
  startBaseline("bench/bare_health_server.ts", `${tmp}/`, { core: settings.serverCore });

const startFloorTarget: Starter = (tmp, settings) =>
  startBaseline("bench/floor_health_server.ts", `${tmp}/`, { core: settings.serverCore });

/** The service with `extra` in its production environment (`DATABASE_URL`, or none). */
function serviceTarget(extra: Record<string, string>): Starter {
  return async (tmp, settings) =>
    await startService(`${tmp}/`, {
      core: settings.serverCore,
      env: await productionServiceEnv(tmp, extra),
    });
}

async function checkHealthResponse(url: string): Promise<void> {
  const response = await fetch(`${url}/health`);
  const body = await response.text();
  const type = response.headers.get("content-type");
  if (response.status !== 200 || body !== HEALTH_BODY || type !== JSON_TYPE) {
    throw new Error(`${url}/health answered ${response.status} ${type} ${body}`);
  }
}

/** One wrk run against `/health`, with the latency distribution if `latency`. */
async function loadHealth(
  url: string,
  settings: LoadSettings,
  seconds: number,
  latency: boolean,
): Promise<WrkFigures> {
  const report = await runWrk(`${url}/health`, settings, { seconds, latency });
  return parseWrk(report, latency);
}

// --- main ----------------------------------------------------------------------------------------

if (import.meta.main) {
  await runLoadBenchmarkCommand(runHealthBenchmark, (result) => [
    "## GET /health",
    formatHealthTable(result),
    formatHealthGoal(result),
  ]);
}
