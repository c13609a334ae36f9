/**
 * `POST /v1/storea/verify` and `POST /v1/storeb/verify` end to end on loopback with no added
 * upstream latency, each measured in the same run as its floor: the cheapest server we know that
 * does the work a verification cannot do without.
 *
 * - Store B's floor is the bare proxy (`bench/bare_verify_proxy.ts`): the same upstream call and
 *   nothing else (a Google Play answer carries no signature to check).
 * - Store A's floor is `bench/floor_verify_proxy.ts`: the bare proxy plus one ES256 check of the
 *   returned `signedTransactionInfo` with the service's own OpenSSL binding
 *   (`src/crypto/es256.ts`), which every store A verification must make. The bare proxy is
 *   measured too, for context.
 *
 * Processes and cores (the machine has 2):
 * - core 0: the server under test alone;
 * - core 1: the load generator and the upstream (`bench/verify_upstream.ts`), each its own
 *   process.
 *
 * Two phases, each in `rounds` (3) interleaved rounds, so that a slow minute of a shared machine
 * falls on every server rather than on one:
 * - closed loop, `wrk` with 100 connections: in each round the bare proxy, the service, then
 *   store A's floor, each a fresh process, warmed up, then measured (throughput, latency, peak
 *   RSS, CPU);
 * - open loop (`bench/open_loop.mjs` under Node, requests sent at scheduled times and latency
 *   measured from them, as wrk2 does) at half the floor's median closed-loop capacity: in each
 *   round the floor, then the service, each a fresh process.
 * Every figure is the median of the rounds; every ratio the median of the rounds' ratios, each
 * taken between servers of the same round.
 *
 * The service runs as `deno task start` would run it (same permissions, `main.ts serve`) on a
 * temporary PostgreSQL database that is dropped afterwards, with `NODE_ENV=production`,
 * `LOG_LEVEL=info` (one `http_request` line per request, written to a file in the temporary
 * directory, so the logging is part of what is measured) and a rate limit raised out of the way.
 * The upstream answers `transactions` distinct ids (store A: each with its own JWS, signed once
 * before timing; store B: subscription purchase tokens); the load cycles through the ids (the wrk
 * script: each thread through its own residue class), so no two requests in flight ask for the
 * same id and the service's coalescing of identical requests never helps it. Every answer is
 * checked: status 200 and `"valid":true` (the proxies: the upstream's own body); any other answer,
 * non-2xx status or socket error fails the run.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/verify.ts
 *
 * Flags: `--json` also prints every figure as JSON, `--duration S` and `--warmup S` change the
 * length of the runs, `--rounds N` the rounds of each phase, `--keep-temp` keeps the temporary
 * directory (logs, keys, wrk script). `BENCH_DATABASE_URL` names the PostgreSQL server to create
 * the database on (default `postgres://postgres@127.0.0.1:5432/postgres`). It needs `wrk`,
 * `taskset` and `node`.
 * @module
 */
import { importPKCS8, SignJWT } from "jose";
import {
  beginRun,
  checkAnswer,
  createDatabase,
  formatTable,
  loadAverage,
  type LoadOptions,
  type LoadSettings,
  loadSettings,
  type Machine,
  measureLoad,
  median,
  MissingToolError,
  parseCheckedAnswers,
  parseWrk,
  pct,
  productionServiceEnv,
  type Progress,
  ROOT,
  runCli,
  runLoadBenchmarkCommand,
  runOpenLoopGenerator,
  runWrk,
  scanStdout,
  type Server,
  setStoreaCredentials,
  spawnPinned,
  startBaseline,
  startService,
  stop,
  STOREA_BUNDLE_ID,
  STOREA_ISSUER_ID,
  STOREA_KEY_ID,
  waitForLine,
  writeProgress,
  writeStoreaKey,
  WRK_CHECKED_ANSWERS_LUA,
  type WrkFigures,
} from "./support.ts";
import {
  type IdPattern,
  STOREA_IDS,
  type StoreaUpstreamReady,
  STOREB_IDS,
  type StorebUpstreamReady,
  upstreamId,
  type UpstreamReady,
} from "./verify_upstream.ts";
import { createServiceAccount } from "../simulators/service_account.ts";

/** Options of {@linkcode runVerifyBenchmark}. */
export interface VerifyBenchmarkOptions extends LoadOptions {
  /** Distinct transactions the upstream answers; 20,000 by default. */
  transactions?: number;
  /** PostgreSQL to create the temporary database on; `BENCH_DATABASE_URL` or local by default. */
  databaseUrl?: string;
  /** The stores to measure, in this order; both by default. */
  stores?: StoreName[];
  /** Interleaved rounds of each phase (closed loop, open loop); 3 by default. */
  rounds?: number;
}

/** The figures of one server in one closed-loop (wrk) run. */
export interface VerifyTargetResult extends WrkFigures {
  name: string;
  /** The largest VmRSS of the server's deno process sampled every 250 ms during the measured run. */
  peakRssMb: number;
  /** VmHWM (peak since the process started, boot included) at the end of the run. */
  hwmMb: number;
  /** The VmRSS samples of the measured run, in MiB, every 250 ms: growth or a plateau. */
  rssSamplesMb: number[];
  /** Answers the wrk script found right (200 and the expected body) in the measured run. */
  checkedGood: number;
  /** Answers it found wrong. */
  checkedBad: number;
  /** CPU time of the server per second of the run (1 = a whole core). */
  serverCpuCores: number;
  /** CPU time of the upstream per second of the run. */
  upstreamCpuCores: number;
  /** How busy the server's core and the load core were (0 to 1), whoever used them. */
  serverCoreBusy: number;
  loadCoreBusy: number;
  /** `http_request` lines in the service's stdout file (the whole run); null for the proxies. */
  httpRequestLogLines: number | null;
}

/** What `bench/open_loop.mjs` measured in one open-loop run. */
export interface OpenLoopFigures {
  name: string;
  /** Requests per second sent, at scheduled times. */
  rate: number;
  /** Requests due in the measured window, and the right and wrong answers among them. */
  requests: number;
  good: number;
  bad: number;
  firstWrong: string | null;
  /** Latency from each request's scheduled time to its whole answer, ms. */
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  maxMs: number;
  /** How late the generator sent requests after their scheduled time, ms. */
  sendLagP99Ms: number;
  sendLagMaxMs: number;
  maxInFlight: number;
  /** The generator's own CPU time in the run, seconds. */
  cpuSeconds: number;
}

/** One server over every round: its runs and their medians. */
export interface VerifyServer {
  name: string;
  /** Its closed-loop runs, one per round. */
  closed: VerifyTargetResult[];
  /** Its open-loop runs, one per round; empty for a server that is not compared open loop. */
  open: OpenLoopFigures[];
  /** The medians over the rounds. */
  median: {
    requestsPerSecond: number;
    p50Ms: number;
    p99Ms: number;
    peakRssMb: number;
    serverCpuCores: number;
    /** Open loop, NaN without open-loop runs. */
    openP50Ms: number;
    openP99Ms: number;
  };
}

/** The two stores: App Store (A) and Google Play (B). */
export type StoreName = "storea" | "storeb";

/** A ratio of the service to its floor: its value in each round and their median. */
export interface RoundRatio {
  rounds: number[];
  median: number;
}

/** The outcome for one store. */
export interface StoreVerifyResult {
  store: StoreName;
  endpoint: string;
  /** How long the upstream took to get ready (store A: make its PKI and sign every transaction). */
  upstreamSetupMs: number;
  /** The 1-minute load average when each round began (closed loop, then open loop). */
  loadAverages: { closed: number[]; open: number[] };
  bare: VerifyServer;
  /** Store A: the floor proxy; store B: the bare proxy itself (the same object as `bare`). */
  floor: VerifyServer;
  service: VerifyServer;
  /** The open-loop rate: half the floor's median closed-loop req/s. */
  openLoopRate: number;
  /** Service req/s over the floor's, closed loop. */
  rpsRatio: RoundRatio;
  /** Service req/s over the bare proxy's, closed loop (context for store A). */
  rpsVsBare: RoundRatio;
  /** Service p99 over the floor's, open loop. */
  p99Ratio: RoundRatio;
  /** Service peak RSS over the floor's, closed loop. */
  rssRatio: RoundRatio;
  goal: {
    minRpsRatio: number;
    maxP99Ratio: number;
    maxRssRatio: number;
    rpsMet: boolean;
    p99Met: boolean;
    rssMet: boolean;
  };
}

/** What {@linkcode runVerifyBenchmark} returns. */
export interface VerifyBenchmarkResult {
  startedAt: string;
  machine: Machine;
  settings: Required<
    Omit<VerifyBenchmarkOptions, "keepTemp" | "progress" | "databaseUrl" | "stores">
  >;
  stores: StoreVerifyResult[];
}

/**
 * The goals, against each store's floor: the service keeps at least this share of the floor's
 * req/s (store A's floor makes the ES256 check the service must make; store B's is the bare
 * proxy).
 */
export const MIN_RPS_RATIO: Record<StoreName, number> = { storea: 0.7, storeb: 0.8 };
/** The goal: open loop at half the floor's capacity, the service's p99 at most this many times the floor's. */
export const MAX_P99_RATIO = 1.5;
/** The goal: the service's peak RSS under load at most this many times the floor's. */
export const MAX_RSS_RATIO = 1.5;

/** Thrown when the run saw a wrong answer: the figures would not be of a verification. */
export class WrongAnswersError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WrongAnswersError";
  }
}

/** The bench tenant's store B app. */
export const PACKAGE_NAME = "com.example.app";
/** Far above what one tenant can send here: the rate limiter must not be what is measured. */
export const RATE_LIMIT = "1000000";
/** The requests the open-loop generator sends are cut into this many connections, as wrk's. */
export const OPEN_LOOP_CONNECTIONS = 100;

type Settings = VerifyBenchmarkResult["settings"];

/** Runs the benchmark for each store: the two phases of interleaved rounds. */
export async function runVerifyBenchmark(
  options: VerifyBenchmarkOptions = {},
): Promise<VerifyBenchmarkResult> {
  const settings: Settings = {
    ...loadSettings(options),
    transactions: options.transactions ?? 20_000,
    rounds: options.rounds ?? 3,
  };
  const progress = options.progress ?? writeProgress;
  await checkNode();
  const { startedAt, machine } = await beginRun(settings, progress);

  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-verify-" });
  const database = await createDatabase(options.databaseUrl);
  try {
    progress(`temporary database ${database.name}, temp dir ${tmp}`);
    const { storeaKeyFile, storebAccountFile, serviceEnv, tenant } = await createTenant(
      tmp,
      database.url,
    );
    progress(`tenant ${tenant.tenantId} with store A and store B credentials`);

    const context = { settings, progress, tmp, serviceEnv, apiKey: tenant.apiKey };
    const stores: StoreVerifyResult[] = [];
    for (const store of options.stores ?? ["storea", "storeb"]) {
      const spec = store === "storea"
        ? storeaSpec(tmp, storeaKeyFile)
        : storebSpec(storebAccountFile);
      stores.push(await benchStore(context, spec));
    }
    const failures = stores.flatMap((store) => wrongAnswers(store));
    if (failures.length > 0) {
      throw new WrongAnswersError(`wrong answers under load:\n${failures.join("\n")}`);
    }
    return { startedAt, machine, settings, stores };
  } finally {
    await database.drop();
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

/** One line per run of the store that got a wrong answer, or none. */
function wrongAnswers(store: StoreVerifyResult): string[] {
  const servers = new Set([store.bare, store.floor, store.service]);
  return [...servers].flatMap((server) => [
    ...server.closed.filter((run) =>
      run.non2xx > 0 || run.checkedBad > 0 || run.socketErrors > 0 ||
      run.checkedGood < run.requests
    ).map((run) =>
      `${store.store} ${run.name}, closed loop: ${run.non2xx} non-2xx, ${run.checkedBad} wrong ` +
      `bodies, ${run.socketErrors} socket errors, ${run.checkedGood} of ${run.requests} ` +
      `answers checked right`
    ),
    ...server.open.filter((run) => run.bad > 0 || run.good < run.requests).map((run) =>
      `${store.store} ${run.name}, open loop: ${run.good} of ${run.requests} right, ` +
      `${run.bad} wrong; first: ${run.firstWrong}`
    ),
  ]);
}

/** The markdown table of one store's result: the medians of the rounds. */
export function formatVerifyTable(result: StoreVerifyResult): string {
  const servers = result.floor === result.bare
    ? [result.bare, result.service]
    : [result.bare, result.floor, result.service];
  const ms = (value: number) => (Number.isNaN(value) ? "-" : value.toFixed(2));
  const vsFloor = (server: VerifyServer, ratio: RoundRatio, own: number, floor: number) =>
    server === result.service
      ? ratio.median.toFixed(2)
      : server === result.floor
      ? "1.00"
      : (own / floor).toFixed(2);
  return formatTable(
    [
      { header: "server" },
      { header: "req/s", numeric: true },
      { header: "p50 ms", numeric: true },
      { header: "p99 ms", numeric: true },
      { header: "peak RSS MB", numeric: true },
      { header: `open loop p50 ms`, numeric: true },
      { header: `open loop p99 ms`, numeric: true },
      { header: "req/s vs floor", numeric: true },
      { header: "open p99 vs floor", numeric: true },
      { header: "RSS vs floor", numeric: true },
    ],
    servers.map((server) => [
      serverLabel(result, server),
      server.median.requestsPerSecond.toFixed(0),
      server.median.p50Ms.toFixed(2),
      server.median.p99Ms.toFixed(2),
      server.median.peakRssMb.toFixed(1),
      ms(server.median.openP50Ms),
      ms(server.median.openP99Ms),
      vsFloor(
        server,
        result.rpsRatio,
        server.median.requestsPerSecond,
        result.floor.median.requestsPerSecond,
      ),
      server === result.bare && server !== result.floor
        ? "-"
        : vsFloor(server, result.p99Ratio, server.median.openP99Ms, result.floor.median.openP99Ms),
      vsFloor(server, result.rssRatio, server.median.peakRssMb, result.floor.median.peakRssMb),
    ]),
  );
}

/** The server's median CPU time per request in the closed loop, µs. */
function cpuMicros(server: VerifyServer): number {
  return median(
    server.closed.map((run) => (run.serverCpuCores / run.requestsPerSecond) * 1e6),
  );
}

/** The name of a server in the table: the floor says it is one. */
function serverLabel(result: StoreVerifyResult, server: VerifyServer): string {
  if (server === result.floor) {
    return server === result.bare ? "bare proxy (the floor)" : "floor: bare proxy + ES256 check";
  }
  return server.name;
}

/** One line per goal, saying whether it is met, then the context of the run. */
export function formatVerifyGoal(result: StoreVerifyResult): string {
  const { goal, service, floor, bare } = result;
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  const rounds = (ratio: RoundRatio, format: (value: number) => string) =>
    `rounds ${ratio.rounds.map(format).join(", ")}`;
  const times = (value: number) => `${value.toFixed(2)}x`;
  const floorName = floor === bare ? "the bare proxy" : "the floor";
  const lag = (server: VerifyServer) =>
    `${server.name} ${median(server.open.map((run) => run.sendLagP99Ms)).toFixed(1)} ms`;
  const cpu = (server: VerifyServer) =>
    `${server.name} ${median(server.closed.map((run) => run.serverCpuCores)).toFixed(2)} cores ` +
    `(server core ${pct(median(server.closed.map((run) => run.serverCoreBusy)))} busy, load ` +
    `core ${pct(median(server.closed.map((run) => run.loadCoreBusy)))}; upstream ${
      median(server.closed.map((run) => run.upstreamCpuCores)).toFixed(2)
    } cores)`;
  const servers = floor === bare ? [bare, service] : [bare, floor, service];
  return [
    `- req/s at least ${pct(goal.minRpsRatio)} of ${floorName}: ${pct(result.rpsRatio.median)} ` +
    `(${rounds(result.rpsRatio, pct)}), ${mark(goal.rpsMet)}`,
    `- open loop at ${result.openLoopRate} req/s (half ${floorName}'s capacity), p99 at most ` +
    `${goal.maxP99Ratio}x ${floorName}'s: ${service.median.openP99Ms.toFixed(2)} against ` +
    `${floor.median.openP99Ms.toFixed(2)} ms, ${times(result.p99Ratio.median)} (${
      rounds(result.p99Ratio, times)
    }), ${mark(goal.p99Met)}`,
    `- peak RSS at most ${goal.maxRssRatio}x ${floorName}'s: ${
      service.median.peakRssMb.toFixed(1)
    } against ${floor.median.peakRssMb.toFixed(1)} MB, ${times(result.rssRatio.median)} (${
      rounds(result.rssRatio, times)
    }), ${mark(goal.rssMet)}`,
    ...(floor === bare ? [] : [
      `- against the bare proxy, which checks nothing: the floor ${
        pct(floor.median.requestsPerSecond / bare.median.requestsPerSecond)
      }, the service ${pct(result.rpsVsBare.median)} of its req/s`,
    ]),
    `- server CPU per request, closed loop (CPU time over requests; steadier than req/s when ` +
    `other processes share the server's core): ${
      servers.map((server) => `${server.name} ${cpuMicros(server).toFixed(0)} µs`).join(", ")
    }: on a whole core the service would keep ${
      pct(cpuMicros(floor) / cpuMicros(service))
    } of ${floorName}'s req/s`,
    `- server CPU, closed loop: ${servers.map(cpu).join("; ")}`,
    `- open loop: the generator sent requests late by ${
      [floor, service].map(lag).join(", ")
    } at p99 (counted in the latencies)`,
    `- load average (1 min) when each round began: closed loop ${
      result.loadAverages.closed.map((load) => load.toFixed(2)).join(", ")
    }; open loop ${result.loadAverages.open.map((load) => load.toFixed(2)).join(", ")}`,
  ].join("\n");
}

// --- stores --------------------------------------------------------------------------------------

interface StoreContext {
  settings: Settings;
  progress: Progress;
  tmp: string;
  serviceEnv: Record<string, string>;
  apiKey: string;
}

/** What the wrk script of {@linkcode writeWrkScript} sends: `bodyPrefix + id + bodySuffix`. */
export type WrkRequests = Pick<StoreSpec, "path" | "ids" | "bodyPrefix" | "bodySuffix">;

/** What differs between the stores' runs. */
interface StoreSpec {
  store: StoreName;
  label: string;
  /** The verify route, e.g. `/v1/storea/verify`. */
  path: string;
  ids: IdPattern;
  /** The request body is `bodyPrefix + id + bodySuffix`. */
  bodyPrefix: string;
  bodySuffix: string;
  /** Arguments of `bench/verify_upstream.ts`, the count excepted. */
  upstreamArgs: string[];
  /** What the bare proxy needs: upstream URL and token. */
  bareEnv(ready: UpstreamReady): Promise<Record<string, string>>;
  /** What the service needs to reach the upstream. */
  serviceEnv(ready: UpstreamReady): Record<string, string>;
  /** What every right answer of the proxies (the upstream's own body) holds. */
  bareMarker: string;
}

function storeaSpec(tmp: string, keyFile: string): StoreSpec {
  return {
    store: "storea",
    label: "store A",
    path: "/v1/storea/verify",
    ids: STOREA_IDS,
    bodyPrefix: '{"transactionId":"',
    bodySuffix: '"}',
    upstreamArgs: [
      `--allow-write=${tmp}`,
      `${ROOT}/bench/verify_upstream.ts`,
      "storea",
      "--dir",
      tmp,
      "--key-file",
      keyFile,
      "--issuer-id",
      STOREA_ISSUER_ID,
      "--key-id",
      STOREA_KEY_ID,
      "--bundle-id",
      STOREA_BUNDLE_ID,
    ],
    bareEnv: async (ready) => ({
      STOREA_URL: (ready as StoreaUpstreamReady).productionUrl,
      STOREA_TOKEN: await signStoreaToken(keyFile),
    }),
    serviceEnv: (ready) => {
      const storea = ready as StoreaUpstreamReady;
      return {
        STOREA_API_URL_PRODUCTION: storea.productionUrl,
        STOREA_API_URL_SANDBOX: storea.sandboxUrl,
        STOREA_ROOT_CERTS: storea.rootPemPath,
      };
    },
    bareMarker: '"signedTransactionInfo":"',
  };
}

function storebSpec(accountFile: string): StoreSpec {
  return {
    store: "storeb",
    label: "store B",
    path: "/v1/storeb/verify",
    ids: STOREB_IDS,
    bodyPrefix: `{"packageName":"${PACKAGE_NAME}","productId":"premium_monthly",` +
      `"type":"subscription","purchaseToken":"`,
    bodySuffix: '"}',
    upstreamArgs: [
      `${ROOT}/bench/verify_upstream.ts`,
      "storeb",
      "--account-file",
      accountFile,
      "--package-name",
      PACKAGE_NAME,
    ],
    bareEnv: async (ready) => ({
      STOREB_URL: (ready as StorebUpstreamReady).apiUrl,
      STOREB_TOKEN: await fetchStorebAccessToken(
        accountFile,
        (ready as StorebUpstreamReady).tokenUrl,
      ),
    }),
    serviceEnv: (ready) => ({
      STOREB_API_URL: (ready as StorebUpstreamReady).apiUrl,
      STOREB_TOKEN_URL: (ready as StorebUpstreamReady).tokenUrl,
    }),
    bareMarker: '"kind":"androidpublisher#subscriptionPurchaseV2"',
  };
}

/** A server of a round: how to start it and what its right answers hold. */
interface Target {
  name: string;
  start: () => Promise<Server>;
  /** What every right answer body holds. */
  marker: string;
  script: string;
  upstreamPid: number;
  /** One request through the server, before any timing. */
  check: (url: string) => Promise<void>;
}

/** Starts the store's upstream, then runs both phases against it. */
async function benchStore(context: StoreContext, spec: StoreSpec): Promise<StoreVerifyResult> {
  const { settings, progress, tmp } = context;
  progress(`${spec.label}: starting the upstream with ${settings.transactions} purchases`);
  const upstream = spawnPinned({
    core: settings.loadCore,
    args: [
      "run",
      "--allow-net=127.0.0.1",
      "--allow-read",
      ...spec.upstreamArgs,
      "--count",
      String(settings.transactions),
    ],
    env: {},
    stdoutPath: `${tmp}/${spec.store}-upstream.out`,
    stderrPath: `${tmp}/${spec.store}-upstream.err`,
  });
  try {
    const ready: UpstreamReady = JSON.parse(
      await waitForLine(upstream, (line) => line.startsWith("{")),
    );
    progress(
      `${spec.label}: upstream pid ${upstream.pid}, ${ready.count} purchases ready in ${
        (ready.setupMs / 1000).toFixed(1)
      } s`,
    );
    const script = await writeWrkScript(`${tmp}/${spec.store}.lua`, spec, context.apiKey);
    const target = (name: string, start: () => Promise<Server>, marker: string): Target => ({
      name,
      start,
      marker,
      script,
      upstreamPid: upstream.pid,
      check: (url) =>
        checkAnswer(`${url}${spec.path}`, {
          headers: { authorization: `Bearer ${context.apiKey}` },
          body: `${spec.bodyPrefix}${upstreamId(spec.ids, 0)}${spec.bodySuffix}`,
          marker,
        }),
    });
    const bareEnv = await spec.bareEnv(ready);
    // Each process writes its own files: a later run must not find an earlier "listening" line.
    let started = 0;
    const prefix = () => `${tmp}/${spec.store}-${started++}-`;
    const bare = target(
      "bare proxy",
      () =>
        startBaseline("bench/bare_verify_proxy.ts", prefix(), {
          core: settings.serverCore,
          env: bareEnv,
        }),
      spec.bareMarker,
    );
    const floor = spec.store === "storea"
      ? target(
        "floor proxy",
        () =>
          startBaseline("bench/floor_verify_proxy.ts", prefix(), {
            core: settings.serverCore,
            env: bareEnv,
            permissions: ["--allow-ffi"],
          }),
        spec.bareMarker,
      )
      : bare;
    const service = target(
      "purchase-relay",
      () =>
        startService(prefix(), {
          core: settings.serverCore,
          env: { ...context.serviceEnv, ...spec.serviceEnv(ready) },
        }),
      '"valid":true',
    );

    // Closed loop: the bare proxy, the service, then store A's floor, in each round.
    const closedOrder = floor === bare ? [bare, service] : [bare, service, floor];
    const closed = new Map<Target, VerifyTargetResult[]>(closedOrder.map((t) => [t, []]));
    const loadAverages = { closed: [] as number[], open: [] as number[] };
    for (let round = 1; round <= settings.rounds; round++) {
      loadAverages.closed.push(loadAverage());
      progress(`${spec.label}: closed loop, round ${round} of ${settings.rounds}`);
      for (const t of closedOrder) closed.get(t)!.push(await measureClosedLoop(context, t));
    }

    // Open loop at half the floor's capacity: the floor, then the service, in each round.
    const floorCapacity = median(closed.get(floor)!.map((run) => run.requestsPerSecond));
    const rate = Math.max(10, Math.round(floorCapacity / 2 / 10) * 10);
    const open = new Map<Target, OpenLoopFigures[]>([[floor, []], [service, []]]);
    for (let round = 1; round <= settings.rounds; round++) {
      loadAverages.open.push(loadAverage());
      progress(`${spec.label}: open loop at ${rate} req/s, round ${round} of ${settings.rounds}`);
      for (const t of [floor, service]) {
        open.get(t)!.push(await measureOpenLoop(context, spec, t, rate, round));
      }
    }

    const server = (t: Target) => summarizeServer(t.name, closed.get(t)!, open.get(t) ?? []);
    const bareServer = server(bare);
    const floorServer = floor === bare ? bareServer : server(floor);
    return summarize({
      store: spec.store,
      endpoint: `POST ${spec.path}`,
      upstreamSetupMs: ready.setupMs,
      loadAverages,
      bare: bareServer,
      floor: floorServer,
      service: server(service),
      openLoopRate: rate,
    });
  } finally {
    await stop(upstream);
  }
}

/** An App Store Server API token as the service signs it, for the proxies to send. */
export async function signStoreaToken(keyFile: string): Promise<string> {
  const key = await importPKCS8(await Deno.readTextFile(keyFile), "ES256");
  const issuedAt = Math.floor(Date.now() / 1000) - 5;
  return await new SignJWT({ bid: STOREA_BUNDLE_ID })
    .setProtectedHeader({ alg: "ES256", kid: STOREA_KEY_ID, typ: "JWT" })
    .setIssuer(STOREA_ISSUER_ID)
    .setIssuedAt(issuedAt)
    .setExpirationTime(issuedAt + 3600)
    .setAudience("appstoreconnect-v1")
    .sign(key);
}

/** An access token for the bare proxy, from the simulator's token endpoint (JWT-bearer grant). */
export async function fetchStorebAccessToken(
  accountFile: string,
  tokenUrl: string,
): Promise<string> {
  const account = JSON.parse(await Deno.readTextFile(accountFile));
  const key = await importPKCS8(account.private_key, "RS256");
  const issuedAt = Math.floor(Date.now() / 1000);
  const assertion = await new SignJWT({ scope: "https://www.googleapis.com/auth/androidpublisher" })
    .setProtectedHeader({ alg: "RS256", kid: account.private_key_id, typ: "JWT" })
    .setIssuer(account.client_email)
    .setAudience(tokenUrl)
    .setIssuedAt(issuedAt)
    .setExpirationTime(issuedAt + 3600)
    .sign(key);
  const response = await fetch(tokenUrl, {
    method: "POST",
    body: new URLSearchParams({
      grant_type: "urn:ietf:params:oauth:grant-type:jwt-bearer",
      assertion,
    }),
  });
  const body = await response.json();
  if (!response.ok || typeof body.access_token !== "string") {
    throw new Error(`the token endpoint answered ${response.status}: ${JSON.stringify(body)}`);
  }
  return body.access_token;
}

/** One server's runs with their medians. */
function summarizeServer(
  name: string,
  closed: VerifyTargetResult[],
  open: OpenLoopFigures[],
): VerifyServer {
  const of = <T>(runs: T[], field: (run: T) => number) => median(runs.map(field));
  return {
    name,
    closed,
    open,
    median: {
      requestsPerSecond: of(closed, (run) => run.requestsPerSecond),
      p50Ms: of(closed, (run) => run.p50Ms),
      p99Ms: of(closed, (run) => run.p99Ms),
      peakRssMb: of(closed, (run) => run.peakRssMb),
      serverCpuCores: of(closed, (run) => run.serverCpuCores),
      openP50Ms: of(open, (run) => run.p50Ms),
      openP99Ms: of(open, (run) => run.p99Ms),
    },
  };
}

/** The ratio of `ours` to `theirs` in each round, and the median of those. */
export function roundRatio<T>(ours: T[], theirs: T[], field: (run: T) => number): RoundRatio {
  const rounds = ours.map((run, i) => field(run) / field(theirs[i]));
  return { rounds, median: median(rounds) };
}

function summarize(
  result: Omit<StoreVerifyResult, "rpsRatio" | "rpsVsBare" | "p99Ratio" | "rssRatio" | "goal">,
): StoreVerifyResult {
  const { service, floor, bare } = result;
  const rpsRatio = roundRatio(service.closed, floor.closed, (run) => run.requestsPerSecond);
  const p99Ratio = roundRatio(service.open, floor.open, (run) => run.p99Ms);
  const rssRatio = roundRatio(service.closed, floor.closed, (run) => run.peakRssMb);
  const minRpsRatio = MIN_RPS_RATIO[result.store];
  return {
    ...result,
    rpsRatio,
    rpsVsBare: roundRatio(service.closed, bare.closed, (run) => run.requestsPerSecond),
    p99Ratio,
    rssRatio,
    goal: {
      minRpsRatio,
      maxP99Ratio: MAX_P99_RATIO,
      maxRssRatio: MAX_RSS_RATIO,
      rpsMet: rpsRatio.median >= minRpsRatio,
      p99Met: p99Ratio.median <= MAX_P99_RATIO,
      rssMet: rssRatio.median <= MAX_RSS_RATIO,
    },
  };
}

// --- tenant -------------------------------------------------------------------------------------

/** A tenant of {@linkcode createTenant}, with the files and environment it was made with. */
export interface BenchTenant {
  /** The App Store Connect key and the Google service account, written in `tmp`. */
  storeaKeyFile: string;
  storebAccountFile: string;
  /** The service's production environment on the database, rate limits out of the way. */
  serviceEnv: Record<string, string>;
  tenant: { tenantId: string; apiKey: string };
}

/**
 * Writes both stores' credentials in `tmp`, migrates the database at `databaseUrl`, then makes a
 * tenant, a live API key and both stores' credentials through the CLI.
 */
export async function createTenant(tmp: string, databaseUrl: string): Promise<BenchTenant> {
  const storeaKeyFile = await writeStoreaKey(`${tmp}/AuthKey_${STOREA_KEY_ID}.p8`);
  const storebAccountFile = `${tmp}/service-account.json`;
  await Deno.writeTextFile(storebAccountFile, (await createServiceAccount()).json);
  const env = await productionServiceEnv(tmp, {
    DATABASE_URL: databaseUrl,
    RATE_LIMIT_PER_SECOND: RATE_LIMIT,
    RATE_LIMIT_BURST: RATE_LIMIT,
  });
  await runCli(["migrate"], env);
  const tenant = await runCli(["tenant", "create", "--name", "Bench tenant"], env);
  const tenantId = String(tenant.id);
  const key = await runCli(["key", "create", tenantId, "--env", "live"], env);
  await setStoreaCredentials(env, { tenantId, keyFile: storeaKeyFile });
  await runCli([
    "storeb",
    "set-credentials",
    tenantId,
    "--package-name",
    PACKAGE_NAME,
    "--service-account-file",
    storebAccountFile,
    "--push-audience",
    "https://relay.example.com/push",
    "--push-service-account",
    "push@bench-project.iam.gserviceaccount.com",
  ], env);
  return {
    storeaKeyFile,
    storebAccountFile,
    serviceEnv: env,
    tenant: { tenantId, apiKey: String(key.key) },
  };
}

// --- servers -------------------------------------------------------------------------------------

/** Starts the target, warms it up with wrk, then measures it under wrk's closed loop. */
async function measureClosedLoop(
  context: StoreContext,
  target: Target,
): Promise<VerifyTargetResult> {
  const { settings, progress } = context;
  const { name } = target;
  progress(`${name}: starting`);
  let server: Server | undefined = await target.start();
  try {
    await target.check(server.url);
    progress(`${name}: pid ${server.pid} on ${server.url}, warming up ${settings.warmupSeconds} s`);
    await loadStore(server.url, target, settings, settings.warmupSeconds);
    progress(`${name}: measuring ${settings.durationSeconds} s`);
    const url = server.url;
    const measured = await measureLoad(
      () => loadStore(url, target, settings, settings.durationSeconds),
      { pids: [server.pid, target.upstreamPid], cores: settings },
    );
    const [serverCpu, upstreamCpu] = measured.cpuSeconds;
    const stdoutPath = server.stdoutPath;
    const isService = name === "purchase-relay";
    await stop(server);
    server = undefined;
    const result: VerifyTargetResult = {
      name,
      ...measured.load,
      peakRssMb: measured.peakRssMb,
      rssSamplesMb: measured.rssSamplesMb,
      hwmMb: measured.hwmMb,
      serverCpuCores: serverCpu / settings.durationSeconds,
      upstreamCpuCores: upstreamCpu / settings.durationSeconds,
      serverCoreBusy: measured.busy.serverCore,
      loadCoreBusy: measured.busy.loadCore,
      httpRequestLogLines: isService ? (await scanStdout(stdoutPath)).httpRequestLines : null,
    };
    progress(
      `${name}: ${
        result.requestsPerSecond.toFixed(0)
      } req/s, p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms, peak RSS ${
        result.peakRssMb.toFixed(1)
      } MB (VmHWM ${result.hwmMb.toFixed(1)}), ` +
        `server CPU ${result.serverCpuCores.toFixed(2)} cores, upstream CPU ${
          result.upstreamCpuCores.toFixed(2)
        } cores, core ${settings.serverCore} ${
          pct(result.serverCoreBusy)
        } busy, core ${settings.loadCore} ${
          pct(result.loadCoreBusy)
        } busy; ${result.checkedGood} right, ${result.checkedBad} ` +
        `wrong, ${result.non2xx} non-2xx, ${result.socketErrors} socket errors` +
        (isService ? `; ${result.httpRequestLogLines} http_request lines` : ""),
    );
    if (isService && result.httpRequestLogLines! < result.requests) {
      throw new Error(
        `the service wrote ${result.httpRequestLogLines} http_request lines for ` +
          `${result.requests} measured requests: its logging is not what is being measured`,
      );
    }
    return result;
  } finally {
    if (server) await stop(server);
  }
}

/**
 * Starts the target and measures it open loop: `bench/open_loop.mjs` under Node, pinned to the
 * load core, sends `rate` requests per second for the warm-up, then for the measured run.
 */
async function measureOpenLoop(
  context: StoreContext,
  spec: StoreSpec,
  target: Target,
  rate: number,
  round: number,
): Promise<OpenLoopFigures> {
  const { settings, progress } = context;
  const { name } = target;
  progress(`${name}: starting (open loop)`);
  const server = await target.start();
  try {
    await target.check(server.url);
    // Warm as for the closed loop: a cold server below the rate would build a queue that never
    // drains, and the open loop would measure the warm-up.
    progress(`${name}: pid ${server.pid} on ${server.url}, warming up ${settings.warmupSeconds} s`);
    await loadStore(server.url, target, settings, settings.warmupSeconds);
    const config = {
      url: `${server.url}${spec.path}`,
      headers: { authorization: `Bearer ${context.apiKey}` },
      bodyPrefix: spec.bodyPrefix,
      bodySuffix: spec.bodySuffix,
      idPrefix: spec.ids.prefix,
      idSuffix: spec.ids.suffix,
      // Each round starts elsewhere in the ids, as the wrk runs do not repeat one either.
      idStart: (round * 7_919) % settings.transactions,
      idCount: settings.transactions,
      marker: target.marker,
      rate,
      warmupSeconds: settings.warmupSeconds,
      seconds: settings.durationSeconds,
      connections: OPEN_LOOP_CONNECTIONS,
    };
    progress(
      `${name}: ${rate} req/s for ${settings.warmupSeconds} s, then ` +
        `${settings.durationSeconds} s measured`,
    );
    const result = {
      name,
      ...await runOpenLoopGenerator(settings.loadCore, config),
    } as OpenLoopFigures;
    progress(
      `${name}: open loop p50 ${result.p50Ms.toFixed(2)} ms, p99 ${result.p99Ms.toFixed(2)} ms, ` +
        `max ${result.maxMs.toFixed(1)} ms, send lag p99 ${result.sendLagP99Ms.toFixed(2)} ms, ` +
        `${result.maxInFlight} in flight at most, generator CPU ${
          result.cpuSeconds.toFixed(1)
        } s; ${result.good} right, ${result.bad} wrong`,
    );
    return result;
  } finally {
    await stop(server);
  }
}

/** Checks that Node.js, which runs the open-loop generator, is installed. */
export async function checkNode(): Promise<void> {
  try {
    await new Deno.Command("node", { args: ["--version"], stdout: "null", stderr: "null" })
      .output();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new MissingToolError(
        "node is not installed; the open-loop load generator (bench/open_loop.mjs) runs on it. " +
          "Install Node.js 20 or later (Debian: apt-get install -y nodejs), then run the " +
          "benchmark again.",
      );
    }
    throw error;
  }
}

/**
 * The wrk script: POSTs the store's request body with the API key, thread `t` of `T` taking ids
 * t, t+T, t+2T, ... (modulo the count), so two requests in flight never share an id; and checks
 * every answer (status 200 and `marker` in the body), reporting the counts from `done`.
 * Arguments after `--`: thread count, id count, marker.
 */
export async function writeWrkScript(
  path: string,
  spec: WrkRequests,
  apiKey: string,
): Promise<string> {
  // Lua long strings take the JSON fragments as they are, quotes included.
  const literal = (text: string) => `[==[${text}]==]`;
  const script = `-- Written by bench/verify.ts for ${spec.path}.
${WRK_CHECKED_ANSWERS_LUA}
function init(args)
  step = tonumber(args[1])
  count = tonumber(args[2])
  marker = args[3]
  index = first
  headers = {
    ["content-type"] = "application/json",
    ["authorization"] = ${literal(`Bearer ${apiKey}`)},
  }
  reset_checks()
end

function request()
  local id = ${literal(spec.ids.prefix)} .. string.format("%09d", index % count) .. ${
    literal(spec.ids.suffix)
  }
  index = index + step
  return wrk.format("POST", ${literal(spec.path)}, headers, ${literal(spec.bodyPrefix)} .. id .. ${
    literal(spec.bodySuffix)
  })
end

`;
  await Deno.writeTextFile(path, script);
  return path;
}

/** One wrk run of the target's script, with the counts of right and wrong answers it checked. */
export async function loadStore(
  url: string,
  target: { script: string; marker: string },
  settings: LoadSettings & { transactions: number },
  seconds: number,
): Promise<WrkFigures & { checkedGood: number; checkedBad: number }> {
  if (settings.transactions % settings.threads !== 0) {
    // Otherwise the threads' residue classes overlap after a wrap and two could share an id.
    throw new Error("transactions must be a multiple of threads");
  }
  const text = await runWrk(url, settings, {
    seconds,
    latency: true,
    script: target.script,
    scriptArgs: [String(settings.threads), String(settings.transactions), target.marker],
  });
  const { checkedGood, checkedBad } = parseCheckedAnswers(text);
  return { ...parseWrk(text), checkedGood, checkedBad };
}

// --- main ----------------------------------------------------------------------------------------

if (import.meta.main) {
  await runLoadBenchmarkCommand(runVerifyBenchmark, (result) =>
    result.stores.flatMap((store) => [
      `## ${store.endpoint}`,
      formatVerifyTable(store),
      formatVerifyGoal(store),
    ]));
}
