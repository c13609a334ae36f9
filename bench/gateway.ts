/**
 * The store gateway's endpoints beside verify: each endpoint of the service that calls a store
 * for an API key holder, measured against the bare proxy (`bench/bare_verify_proxy.ts`) making
 * the same upstream call(s) and nothing else, in the same run, verify included, so that each new
 * endpoint's ratios can be set beside verify's:
 *
 * - store A: `POST /v1/storea/verify` (Get Transaction Info, one JWS), `/subscriptions` (Get All
 *   Subscription Statuses: one group, its last transaction and renewal info, two JWS),
 *   `/history` (one page of {@linkcode HISTORY_PAGE} signed transactions) and `/consumption`
 *   (Send Consumption Information, a PUT Apple answers 202);
 * - store B: `POST /v1/storeb/verify` (one read), `/acknowledge` of a subscription not yet
 *   acknowledged (the read, then `:acknowledge`) and `/consume` of a one-time product not yet
 *   consumed (the read, then `:consume`): the steady state the actions exist for, every purchase
 *   a new one. A repeated action finds its work done and costs the read alone, which verify's
 *   row measures.
 *
 * The upstreams are `bench/verify_upstream.ts` with `--gateway`: the same as verify's, plus the
 * calls above, each counted. Every answer is checked (status 200 and a marker: the service's
 * `"alreadyAcknowledged":false`, `"alreadyConsumed":false`, `"sent":true`, `"statusName":"active"`
 * or `"valid":true`; the proxies' upstream bodies or their own), and after each server the
 * upstream's counts must show each of the endpoint's calls once per request: a wrong answer, an
 * error or a call too many or too few fails the run.
 *
 * Processes and cores as in `bench/verify.ts`: the server under test alone on core 0; the load
 * generators and both upstreams on core 1. In each of `rounds` (3) rounds, every endpoint in turn:
 * the service, then the bare proxy, each a fresh process, warmed up with wrk, measured closed loop
 * (wrk, 100 connections), then open loop in the same process (`bench/open_loop.mjs`, warmed up,
 * then measured) at half the service's req/s of that round's closed loop, the rate for both. Each
 * ratio is taken between the two servers of one round; the table gives the medians of the rounds.
 * The runs are shorter than verify's own (4 s measured after 2 s of warm-up, by default) to keep
 * `deno task bench` within reason: seven endpoints, two servers, two phases, three rounds.
 *
 * Why half the service's rate rather than the floor's, as verify's own goal has it: a rate the
 * service cannot keep up with builds a queue that grows for the whole run, and its p99 then says
 * how long the run was. At half its own capacity every endpoint is judged at the same load, one a
 * production service could run at.
 *
 * The goal (docs/benchmarks.md, "The store gateway beside verify"): each new endpoint's req/s
 * ratio at least 90% of its store's verify's, and its open-loop p99 ratio at most 110% of verify's.
 *
 * The bare proxy checks no signature, so an endpoint whose answer holds more JWS than verify's
 * one is further from it for work the service cannot skip. Store A's verify, subscriptions and
 * history are therefore also measured against the floor proxy (`bench/floor_verify_proxy.ts`:
 * the bare proxy plus the ES256 check of each JWS), third in each round at the same rate, and
 * judged a second time on those ratios: what the service adds beyond the required checks.
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/gateway.ts
 *
 * Flags: `--json`, `--duration S`, `--warmup S`, `--rounds N`, `--keep-temp`, as for
 * `bench/verify.ts`. `BENCH_DATABASE_URL` names the PostgreSQL server.
 * @module
 */
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
  pct,
  type Progress,
  ROOT,
  runLoadBenchmarkCommand,
  runOpenLoopGenerator,
  scanStdout,
  type Server,
  spawnPinned,
  startBaseline,
  startService,
  stop,
  STOREA_BUNDLE_ID,
  STOREA_ISSUER_ID,
  STOREA_KEY_ID,
  waitForLine,
  writeProgress,
  type WrkFigures,
} from "./support.ts";
import {
  checkNode,
  createTenant,
  fetchStorebAccessToken,
  loadStore,
  OPEN_LOOP_CONNECTIONS,
  type OpenLoopFigures,
  PACKAGE_NAME,
  type RoundRatio,
  roundRatio,
  signStoreaToken,
  writeWrkScript,
  WrongAnswersError,
} from "./verify.ts";
import {
  HISTORY_PAGE,
  type IdPattern,
  STOREA_IDS,
  type StoreaUpstreamReady,
  STOREB_ACKNOWLEDGE_IDS,
  STOREB_CONSUME_IDS,
  STOREB_IDS,
  type StorebUpstreamReady,
  type UpstreamCounts,
  upstreamId,
} from "./verify_upstream.ts";

/** Options of {@linkcode runGatewayBenchmark}. */
export interface GatewayBenchmarkOptions extends LoadOptions {
  /** Distinct ids each upstream answers; 4,000 by default. */
  transactions?: number;
  /** PostgreSQL to create the temporary database on; `BENCH_DATABASE_URL` or local by default. */
  databaseUrl?: string;
  /** Rounds; 3 by default. */
  rounds?: number;
}

/** The two stores: App Store (A) and Google Play (B). */
export type GatewayStore = "storea" | "storeb";

/** One endpoint: how to ask it, what it asks upstream, and what its right answers hold. */
export interface GatewayEndpoint {
  /** The route's path, e.g. `/v1/storeb/acknowledge`. */
  path: string;
  store: GatewayStore;
  /** Whether it is its store's verify, which the others are set beside. */
  isVerify: boolean;
  /**
   * Whether it is also measured against the floor proxy (`bench/floor_verify_proxy.ts`): the
   * bare proxy plus the ES256 check of each JWS the store answered, the work it cannot skip.
   */
  hasFloor: boolean;
  /** The measured case, for the table: the upstream calls of one request. */
  upstreamCalls: string;
  /** The upstream's counts ({@linkcode UpstreamCounts}) one request adds 1 to, each. */
  countedCalls: string[];
  ids: IdPattern;
  /** The request body is `bodyPrefix + id + bodySuffix`. */
  bodyPrefix: string;
  bodySuffix: string;
  /** What each right answer of the service holds. */
  serviceMarker: string;
  /** What each right answer of the bare proxy holds. */
  bareMarker: string;
}

const TRANSACTION_BODY = ['{"transactionId":"', '"}'] as const;

/** Every endpoint measured, in the order of each round. */
export const GATEWAY_ENDPOINTS: readonly GatewayEndpoint[] = [
  {
    path: "/v1/storea/verify",
    store: "storea",
    isVerify: true,
    hasFloor: true,
    upstreamCalls: "GET transaction (1 JWS)",
    countedCalls: ["transaction"],
    ids: STOREA_IDS,
    bodyPrefix: TRANSACTION_BODY[0],
    bodySuffix: TRANSACTION_BODY[1],
    serviceMarker: '"valid":true',
    bareMarker: '"signedTransactionInfo":"',
  },
  {
    path: "/v1/storea/subscriptions",
    store: "storea",
    isVerify: false,
    hasFloor: true,
    upstreamCalls: "GET statuses (2 JWS)",
    countedCalls: ["subscriptions"],
    ids: STOREA_IDS,
    bodyPrefix: TRANSACTION_BODY[0],
    bodySuffix: TRANSACTION_BODY[1],
    serviceMarker: '"statusName":"active"',
    bareMarker: '"lastTransactions":[',
  },
  {
    path: "/v1/storea/history",
    store: "storea",
    isVerify: false,
    hasFloor: true,
    upstreamCalls: `GET history (${HISTORY_PAGE} JWS)`,
    countedCalls: ["history"],
    ids: STOREA_IDS,
    bodyPrefix: TRANSACTION_BODY[0],
    bodySuffix: TRANSACTION_BODY[1],
    serviceMarker: '"valid":true',
    bareMarker: '"signedTransactions":[',
  },
  {
    path: "/v1/storea/consumption",
    store: "storea",
    isVerify: false,
    hasFloor: false,
    upstreamCalls: "PUT consumption (202)",
    countedCalls: ["consumption"],
    ids: STOREA_IDS,
    bodyPrefix: TRANSACTION_BODY[0],
    // A refund request for a subscription: no consumptionPercentage, which Apple refuses for one.
    bodySuffix: '","customerConsented":true,"sampleContentProvided":false,' +
      '"deliveryStatus":"DELIVERED","refundPreference":"DECLINE"}',
    serviceMarker: '"sent":true',
    bareMarker: '"sent":true',
  },
  {
    path: "/v1/storeb/verify",
    store: "storeb",
    isVerify: true,
    hasFloor: false,
    upstreamCalls: "GET subscription",
    countedCalls: ["subscription_read"],
    ids: STOREB_IDS,
    bodyPrefix: `{"packageName":"${PACKAGE_NAME}","productId":"premium_monthly",` +
      `"type":"subscription","purchaseToken":"`,
    bodySuffix: '"}',
    serviceMarker: '"valid":true',
    bareMarker: '"kind":"androidpublisher#subscriptionPurchaseV2"',
  },
  {
    path: "/v1/storeb/acknowledge",
    store: "storeb",
    isVerify: false,
    hasFloor: false,
    upstreamCalls: "GET subscription + POST :acknowledge",
    countedCalls: ["subscription_read", "subscription_acknowledge"],
    ids: STOREB_ACKNOWLEDGE_IDS,
    bodyPrefix: `{"packageName":"${PACKAGE_NAME}","productId":"premium_monthly",` +
      `"type":"subscription","purchaseToken":"`,
    bodySuffix: '"}',
    serviceMarker: '"alreadyAcknowledged":false',
    bareMarker: '"acknowledged":true',
  },
  {
    path: "/v1/storeb/consume",
    store: "storeb",
    isVerify: false,
    hasFloor: false,
    upstreamCalls: "GET product + POST :consume",
    countedCalls: ["product_read", "product_consume"],
    ids: STOREB_CONSUME_IDS,
    bodyPrefix: `{"packageName":"${PACKAGE_NAME}","productId":"coins_100","purchaseToken":"`,
    bodySuffix: '"}',
    serviceMarker: '"alreadyConsumed":false',
    bareMarker: '"consumed":true',
  },
];

/** The goal: each new endpoint's ratios within this share of its store's verify's. */
export const WITHIN_VERIFY = 0.1;

/** One closed-loop (wrk) run of one server. */
export interface GatewayClosedRun extends WrkFigures {
  checkedGood: number;
  checkedBad: number;
  /** CPU time of the server per request, µs. */
  cpuMicrosPerRequest: number;
  /** CPU time of the server per second of the run (1 = a whole core). */
  serverCpuCores: number;
  /** CPU time of the upstream serving the endpoint per second of the run. */
  upstreamCpuCores: number;
  /** How busy the server's core and the load core were (0 to 1), whoever used them. */
  serverCoreBusy: number;
  loadCoreBusy: number;
  peakRssMb: number;
}

/** One server's process in one round: a closed-loop run, then an open-loop run. */
export interface GatewayRun {
  server: "bare proxy" | "floor proxy" | "purchase-relay";
  closed: GatewayClosedRun;
  open: OpenLoopFigures;
  /** Requests answered over the process's life: the check, both wrk runs, the open loop. */
  answered: number;
  /** Upstream calls over the process's life, by kind ({@linkcode UpstreamCounts}). */
  upstreamCalls: UpstreamCounts;
  /** `http_request` lines of the service's stdout (its whole life); null for the proxy. */
  httpRequestLogLines: number | null;
}

/** One endpoint in one round. */
export interface GatewayRound {
  /** The 1-minute load average when the endpoint's round began. */
  loadAverage: number;
  /** The open-loop rate of both servers: half the service's closed-loop req/s. */
  rate: number;
  service: GatewayRun;
  bare: GatewayRun;
  /** The floor proxy at the same rate, for an endpoint that {@linkcode GatewayEndpoint.hasFloor}. */
  floor: GatewayRun | null;
}

/** One endpoint over every round. */
export interface GatewayEndpointResult {
  /** e.g. `POST /v1/storeb/acknowledge`. */
  endpoint: string;
  store: GatewayStore;
  isVerify: boolean;
  upstreamCalls: string;
  rounds: GatewayRound[];
  /** The service's closed-loop req/s over the bare proxy's. */
  rpsRatio: RoundRatio;
  /** The service's open-loop p99 over the bare proxy's. */
  p99Ratio: RoundRatio;
  /**
   * The bare proxy's CPU time per request over the service's, closed loop: the share of the bare
   * proxy's req/s the service would keep on a whole core, steadier than req/s when other
   * processes share the server's core.
   */
  cpuRatio: RoundRatio;
  /** The service's closed-loop req/s over the floor proxy's; null without a floor. */
  floorRpsRatio: RoundRatio | null;
  /** The service's open-loop p99 over the floor proxy's; null without a floor. */
  floorP99Ratio: RoundRatio | null;
  /** Medians over the rounds. */
  median: {
    rate: number;
    bareRps: number;
    serviceRps: number;
    bareOpenP99Ms: number;
    serviceOpenP99Ms: number;
    bareCpuMicros: number;
    serviceCpuMicros: number;
    /** Null without a floor. */
    floorRps: number | null;
    floorOpenP99Ms: number | null;
  };
}

/** Whether an endpoint's ratios are within {@linkcode WITHIN_VERIFY} of its store's verify's. */
export interface GatewayVerdict {
  endpoint: string;
  /** Verify's endpoint of the same store. */
  verify: string;
  rpsRatio: number;
  verifyRpsRatio: number;
  /** The least req/s ratio that meets the goal. */
  minRpsRatio: number;
  rpsMet: boolean;
  p99Ratio: number;
  verifyP99Ratio: number;
  /** The greatest p99 ratio that meets the goal. */
  maxP99Ratio: number;
  p99Met: boolean;
  /**
   * The same judgement on the ratios to the floor proxy, where the endpoint and its verify both
   * have one: whether what the service adds beyond the required signature checks is within the
   * goal, whatever the number of JWS an answer holds.
   */
  floor?: Omit<GatewayVerdict, "endpoint" | "verify" | "floor">;
}

/** What {@linkcode runGatewayBenchmark} returns. */
export interface GatewayBenchmarkResult {
  startedAt: string;
  machine: Machine;
  settings: GatewaySettings;
  /** How long each upstream took to get ready (store A: make its PKI and sign everything). */
  upstreamSetupMs: Record<GatewayStore, number>;
  endpoints: GatewayEndpointResult[];
  verdicts: GatewayVerdict[];
}

/** The settings of a run, defaults filled in. */
export type GatewaySettings = LoadSettings & { transactions: number; rounds: number };

/**
 * Sets an endpoint's median ratios beside its store's verify's: its req/s ratio must be at least
 * (1 - {@linkcode WITHIN_VERIFY}) times verify's, its p99 ratio at most (1 +
 * {@linkcode WITHIN_VERIFY}) times verify's. Higher req/s and lower p99 are better, so an
 * endpoint that does better than verify always meets it.
 */
export function judgeAgainstVerify(
  endpoint: { endpoint: string; rpsRatio: number; p99Ratio: number },
  verify: { endpoint: string; rpsRatio: number; p99Ratio: number },
): GatewayVerdict {
  const minRpsRatio = verify.rpsRatio * (1 - WITHIN_VERIFY);
  const maxP99Ratio = verify.p99Ratio * (1 + WITHIN_VERIFY);
  return {
    endpoint: endpoint.endpoint,
    verify: verify.endpoint,
    rpsRatio: endpoint.rpsRatio,
    verifyRpsRatio: verify.rpsRatio,
    minRpsRatio,
    rpsMet: endpoint.rpsRatio >= minRpsRatio,
    p99Ratio: endpoint.p99Ratio,
    verifyP99Ratio: verify.p99Ratio,
    maxP99Ratio,
    p99Met: endpoint.p99Ratio <= maxP99Ratio,
  };
}

/**
 * What is wrong with the upstream calls of one server's process, one line each: each of
 * `countedCalls` must have been made once per request answered, plus at most one per connection
 * of each of the two wrk runs (requests in flight when wrk stopped, sent upstream but never
 * counted as answered); no other kind of call may have been made.
 */
export function unexpectedCalls(
  run: { answered: number; upstreamCalls: UpstreamCounts },
  countedCalls: readonly string[],
  connections: number,
): string[] {
  const problems: string[] = [];
  const most = run.answered + 2 * connections;
  for (const kind of countedCalls) {
    const made = run.upstreamCalls[kind] ?? 0;
    if (made < run.answered || made > most) {
      problems.push(
        `${made} ${kind} calls for ${run.answered} answered requests (expected ` +
          `${run.answered} to ${most})`,
      );
    }
  }
  for (const [kind, made] of Object.entries(run.upstreamCalls)) {
    if (made > 0 && !countedCalls.includes(kind)) problems.push(`${made} unexpected ${kind} calls`);
  }
  return problems;
}

/** The change of each count from `before` to `after`, kinds that did not change left out. */
export function countsDelta(before: UpstreamCounts, after: UpstreamCounts): UpstreamCounts {
  const delta: UpstreamCounts = {};
  for (const [kind, value] of Object.entries(after)) {
    const change = value - (before[kind] ?? 0);
    if (change !== 0) delta[kind] = change;
  }
  return delta;
}

// --- the run -------------------------------------------------------------------------------------

interface Context {
  settings: GatewaySettings;
  progress: Progress;
  tmp: string;
  apiKey: string;
  serviceEnv: Record<string, string>;
  bareEnv: Record<string, string>;
  upstreams: Record<GatewayStore, { pid: number; countsUrl: string }>;
  /** Each process writes its own files: a later run must not find an earlier "listening" line. */
  nextPrefix: () => string;
}

/** Runs every round of every endpoint; fails on a wrong answer or a wrong upstream call. */
export async function runGatewayBenchmark(
  options: GatewayBenchmarkOptions = {},
): Promise<GatewayBenchmarkResult> {
  const settings: GatewaySettings = {
    ...loadSettings({
      ...options,
      durationSeconds: options.durationSeconds ?? 4,
      warmupSeconds: options.warmupSeconds ?? 2,
    }),
    transactions: options.transactions ?? 4_000,
    rounds: options.rounds ?? 3,
  };
  if (settings.transactions % settings.threads !== 0) {
    throw new Error("transactions must be a multiple of threads");
  }
  const progress = options.progress ?? writeProgress;
  await checkNode();
  const { startedAt, machine } = await beginRun(settings, progress);

  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-gateway-" });
  const database = await createDatabase(options.databaseUrl);
  const upstreams: Server[] = [];
  try {
    progress(`temporary database ${database.name}, temp dir ${tmp}`);
    const { storeaKeyFile, storebAccountFile, serviceEnv, tenant } = await createTenant(
      tmp,
      database.url,
    );
    progress(`tenant ${tenant.tenantId} with store A and store B credentials`);

    progress(`starting both upstreams with ${settings.transactions} ids each`);
    const start = (store: GatewayStore, args: string[]) => {
      const upstream = spawnPinned({
        core: settings.loadCore,
        args: [
          "run",
          "--allow-net=127.0.0.1",
          "--allow-read",
          ...args,
          "--count",
          String(settings.transactions),
          "--gateway",
        ],
        env: {},
        stdoutPath: `${tmp}/${store}-upstream.out`,
        stderrPath: `${tmp}/${store}-upstream.err`,
      });
      upstreams.push(upstream);
      return upstream;
    };
    const storeaUpstream = start("storea", [
      `--allow-write=${tmp}`,
      `${ROOT}/bench/verify_upstream.ts`,
      "storea",
      "--dir",
      tmp,
      "--key-file",
      storeaKeyFile,
      "--issuer-id",
      STOREA_ISSUER_ID,
      "--key-id",
      STOREA_KEY_ID,
      "--bundle-id",
      STOREA_BUNDLE_ID,
    ]);
    const storebUpstream = start("storeb", [
      `${ROOT}/bench/verify_upstream.ts`,
      "storeb",
      "--account-file",
      storebAccountFile,
      "--package-name",
      PACKAGE_NAME,
    ]);
    const ready = async <T>(server: Server) =>
      JSON.parse(await waitForLine(server, (line) => line.startsWith("{"))) as T;
    const storea = await ready<StoreaUpstreamReady>(storeaUpstream);
    const storeb = await ready<StorebUpstreamReady>(storebUpstream);
    if (storeb.gatewayApiUrl === null || storeb.countsUrl === null) {
      throw new Error("the store B upstream did not start its gateway API");
    }
    progress(
      `upstreams ready: store A (pid ${storeaUpstream.pid}) in ${
        (storea.setupMs / 1000).toFixed(1)
      } s, store B (pid ${storebUpstream.pid}) in ${(storeb.setupMs / 1000).toFixed(1)} s`,
    );

    let started = 0;
    const context: Context = {
      settings,
      progress,
      tmp,
      apiKey: tenant.apiKey,
      serviceEnv: {
        ...serviceEnv,
        STOREA_API_URL_PRODUCTION: storea.productionUrl,
        STOREA_API_URL_SANDBOX: storea.sandboxUrl,
        STOREA_ROOT_CERTS: storea.rootPemPath,
        STOREB_API_URL: storeb.gatewayApiUrl,
        STOREB_TOKEN_URL: storeb.tokenUrl,
      },
      bareEnv: {
        STOREA_URL: storea.productionUrl,
        STOREA_TOKEN: await signStoreaToken(storeaKeyFile),
        STOREB_URL: storeb.gatewayApiUrl,
        STOREB_TOKEN: await fetchStorebAccessToken(storebAccountFile, storeb.tokenUrl),
      },
      upstreams: {
        storea: { pid: storeaUpstream.pid, countsUrl: storea.countsUrl },
        storeb: { pid: storebUpstream.pid, countsUrl: storeb.countsUrl },
      },
      nextPrefix: () => `${tmp}/gateway-${started++}-`,
    };

    const scripts = new Map<GatewayEndpoint, string>();
    for (const [i, endpoint] of GATEWAY_ENDPOINTS.entries()) {
      scripts.set(
        endpoint,
        await writeWrkScript(`${tmp}/gateway-${i}.lua`, endpoint, tenant.apiKey),
      );
    }
    const rounds = new Map<GatewayEndpoint, GatewayRound[]>(
      GATEWAY_ENDPOINTS.map((endpoint) => [endpoint, []]),
    );
    for (let round = 1; round <= settings.rounds; round++) {
      for (const endpoint of GATEWAY_ENDPOINTS) {
        progress(`round ${round} of ${settings.rounds}: POST ${endpoint.path}`);
        rounds.get(endpoint)!.push(
          await measureRound(context, endpoint, scripts.get(endpoint)!, round),
        );
      }
    }

    const endpoints = GATEWAY_ENDPOINTS.map((endpoint) =>
      summarize(endpoint, rounds.get(endpoint)!)
    );
    const failures = GATEWAY_ENDPOINTS.flatMap((endpoint, i) =>
      problemsOf(endpoint, endpoints[i], settings.connections)
    );
    if (failures.length > 0) {
      throw new WrongAnswersError(`wrong answers or upstream calls:\n${failures.join("\n")}`);
    }
    return {
      startedAt,
      machine,
      settings,
      upstreamSetupMs: { storea: storea.setupMs, storeb: storeb.setupMs },
      endpoints,
      verdicts: verdictsOf(endpoints),
    };
  } finally {
    for (const upstream of upstreams) await stop(upstream);
    await database.drop();
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

/** Each new endpoint judged against its store's verify ({@linkcode judgeAgainstVerify}). */
export function verdictsOf(endpoints: GatewayEndpointResult[]): GatewayVerdict[] {
  const ratios = (result: GatewayEndpointResult) => ({
    endpoint: result.endpoint,
    rpsRatio: result.rpsRatio.median,
    p99Ratio: result.p99Ratio.median,
  });
  const floorRatios = (result: GatewayEndpointResult) =>
    result.floorRpsRatio && result.floorP99Ratio
      ? {
        endpoint: result.endpoint,
        rpsRatio: result.floorRpsRatio.median,
        p99Ratio: result.floorP99Ratio.median,
      }
      : null;
  return endpoints.filter((result) => !result.isVerify).map((result) => {
    const verify = endpoints.find((other) => other.isVerify && other.store === result.store);
    if (verify === undefined) throw new Error(`no verify of ${result.store} was measured`);
    const verdict = judgeAgainstVerify(ratios(result), ratios(verify));
    const [own, verifyOwn] = [floorRatios(result), floorRatios(verify)];
    if (own === null || verifyOwn === null) return verdict;
    const { endpoint: _, verify: __, ...floor } = judgeAgainstVerify(own, verifyOwn);
    return { ...verdict, floor };
  });
}

/** The wrong answers and wrong upstream calls of an endpoint's runs, one line each. */
function problemsOf(
  endpoint: GatewayEndpoint,
  result: GatewayEndpointResult,
  connections: number,
): string[] {
  return result.rounds.flatMap((round, i) =>
    [round.service, round.bare, ...(round.floor ? [round.floor] : [])].flatMap((run) => {
      const where = `${result.endpoint}, round ${i + 1}, ${run.server}`;
      const { closed, open } = run;
      const lines = unexpectedCalls(run, endpoint.countedCalls, connections);
      if (
        closed.non2xx > 0 || closed.checkedBad > 0 || closed.socketErrors > 0 ||
        closed.checkedGood < closed.requests
      ) {
        lines.push(
          `closed loop: ${closed.non2xx} non-2xx, ${closed.checkedBad} wrong bodies, ` +
            `${closed.socketErrors} socket errors, ${closed.checkedGood} of ${closed.requests} ` +
            `answers checked right`,
        );
      }
      if (open.bad > 0 || open.good < open.requests) {
        lines.push(
          `open loop: ${open.good} of ${open.requests} right, ${open.bad} wrong; first: ` +
            `${open.firstWrong}`,
        );
      }
      if (run.httpRequestLogLines !== null && run.httpRequestLogLines < run.answered) {
        lines.push(
          `${run.httpRequestLogLines} http_request lines for ${run.answered} answered requests: ` +
            `its logging is not what was measured`,
        );
      }
      return lines.map((line) => `${where}: ${line}`);
    })
  );
}

function summarize(endpoint: GatewayEndpoint, rounds: GatewayRound[]): GatewayEndpointResult {
  const of = (field: (round: GatewayRound) => number) => median(rounds.map(field));
  const floors = endpoint.hasFloor ? rounds.map((round) => round.floor!) : null;
  return {
    endpoint: `POST ${endpoint.path}`,
    store: endpoint.store,
    isVerify: endpoint.isVerify,
    upstreamCalls: endpoint.upstreamCalls,
    rounds,
    rpsRatio: roundRatio(
      rounds.map((round) => round.service),
      rounds.map((round) => round.bare),
      (run) => run.closed.requestsPerSecond,
    ),
    p99Ratio: roundRatio(
      rounds.map((round) => round.service),
      rounds.map((round) => round.bare),
      (run) => run.open.p99Ms,
    ),
    cpuRatio: roundRatio(
      rounds.map((round) => round.bare),
      rounds.map((round) => round.service),
      (run) => run.closed.cpuMicrosPerRequest,
    ),
    floorRpsRatio: floors === null ? null : roundRatio(
      rounds.map((round) => round.service),
      floors,
      (run) => run.closed.requestsPerSecond,
    ),
    floorP99Ratio: floors === null ? null : roundRatio(
      rounds.map((round) => round.service),
      floors,
      (run) => run.open.p99Ms,
    ),
    median: {
      rate: of((round) => round.rate),
      bareRps: of((round) => round.bare.closed.requestsPerSecond),
      serviceRps: of((round) => round.service.closed.requestsPerSecond),
      bareOpenP99Ms: of((round) => round.bare.open.p99Ms),
      serviceOpenP99Ms: of((round) => round.service.open.p99Ms),
      bareCpuMicros: of((round) => round.bare.closed.cpuMicrosPerRequest),
      serviceCpuMicros: of((round) => round.service.closed.cpuMicrosPerRequest),
      floorRps: floors && median(floors.map((run) => run.closed.requestsPerSecond)),
      floorOpenP99Ms: floors && median(floors.map((run) => run.open.p99Ms)),
    },
  };
}

/**
 * The service, then the bare proxy, then (for an endpoint with one) the floor proxy, the proxies
 * at the rate the service's closed loop set.
 */
async function measureRound(
  context: Context,
  endpoint: GatewayEndpoint,
  script: string,
  round: number,
): Promise<GatewayRound> {
  const load = loadAverage();
  const service = await measureServer(context, endpoint, script, round, "purchase-relay", null);
  const rate = service.rate;
  const bare = await measureServer(context, endpoint, script, round, "bare proxy", rate);
  const floor = endpoint.hasFloor
    ? (await measureServer(context, endpoint, script, round, "floor proxy", rate)).run
    : null;
  const line = (run: GatewayRun) =>
    `${run.closed.requestsPerSecond.toFixed(0)} req/s, open p99 ${run.open.p99Ms.toFixed(2)} ms`;
  context.progress(
    `POST ${endpoint.path}, round ${round}: service ${line(service.run)}; bare proxy ${
      line(bare.run)
    }; req/s ratio ${
      (service.run.closed.requestsPerSecond / bare.run.closed.requestsPerSecond).toFixed(2)
    }, p99 ratio ${(service.run.open.p99Ms / bare.run.open.p99Ms).toFixed(2)}${
      floor ? `; floor proxy ${line(floor)}` : ""
    }`,
  );
  return { loadAverage: load, rate, service: service.run, bare: bare.run, floor };
}

/**
 * One process of `server`: started, checked, warmed up and measured closed loop, then measured
 * open loop at `rate` (null: half its own closed-loop req/s), then stopped; the upstream's counts
 * are read before it starts and after it stops.
 */
async function measureServer(
  context: Context,
  endpoint: GatewayEndpoint,
  script: string,
  round: number,
  server: GatewayRun["server"],
  rate: number | null,
): Promise<{ run: GatewayRun; rate: number }> {
  const { settings, progress } = context;
  const upstream = context.upstreams[endpoint.store];
  const isService = server === "purchase-relay";
  const marker = isService ? endpoint.serviceMarker : endpoint.bareMarker;
  const target = { script, marker };
  const countsBefore = await readCounts(upstream.countsUrl);
  const prefix = context.nextPrefix();
  let child: Server | undefined = isService
    ? await startService(prefix, { core: settings.serverCore, env: context.serviceEnv })
    : server === "floor proxy"
    ? await startBaseline("bench/floor_verify_proxy.ts", prefix, {
      core: settings.serverCore,
      env: context.bareEnv,
      permissions: ["--allow-ffi"],
    })
    : await startBaseline("bench/bare_verify_proxy.ts", prefix, {
      core: settings.serverCore,
      env: context.bareEnv,
    });
  try {
    const url = child.url;
    await checkAnswer(`${url}${endpoint.path}`, {
      headers: { authorization: `Bearer ${context.apiKey}` },
      body: `${endpoint.bodyPrefix}${upstreamId(endpoint.ids, 0)}${endpoint.bodySuffix}`,
      marker,
    });
    progress(`${server}: pid ${child.pid}, warming up ${settings.warmupSeconds} s`);
    const warm = await loadStore(url, target, settings, settings.warmupSeconds);
    const measured = await measureLoad(
      () => loadStore(url, target, settings, settings.durationSeconds),
      { pids: [child.pid, upstream.pid], cores: settings },
    );
    const [serverCpu, upstreamCpu] = measured.cpuSeconds;
    const closed: GatewayClosedRun = {
      ...measured.load,
      cpuMicrosPerRequest: serverCpu / measured.load.requests * 1e6,
      serverCpuCores: serverCpu / settings.durationSeconds,
      upstreamCpuCores: upstreamCpu / settings.durationSeconds,
      serverCoreBusy: measured.busy.serverCore,
      loadCoreBusy: measured.busy.loadCore,
      peakRssMb: measured.peakRssMb,
    };
    const openRate = rate ?? Math.max(10, Math.round(closed.requestsPerSecond / 2 / 10) * 10);
    progress(
      `${server}: ${closed.requestsPerSecond.toFixed(0)} req/s, ${
        closed.cpuMicrosPerRequest.toFixed(0)
      } µs CPU per request, core ${settings.serverCore} ${pct(closed.serverCoreBusy)} busy, ` +
        `core ${settings.loadCore} ${pct(closed.loadCoreBusy)}; open loop at ${openRate} req/s`,
    );
    const open = {
      name: server,
      ...await runOpenLoopGenerator(settings.loadCore, {
        url: `${url}${endpoint.path}`,
        headers: { authorization: `Bearer ${context.apiKey}` },
        bodyPrefix: endpoint.bodyPrefix,
        bodySuffix: endpoint.bodySuffix,
        idPrefix: endpoint.ids.prefix,
        idSuffix: endpoint.ids.suffix,
        // Each round starts elsewhere in the ids, as the wrk runs do not repeat one either.
        idStart: (round * 1_009) % settings.transactions,
        idCount: settings.transactions,
        marker,
        rate: openRate,
        warmupSeconds: settings.warmupSeconds,
        seconds: settings.durationSeconds,
        connections: OPEN_LOOP_CONNECTIONS,
      }),
    } as OpenLoopFigures;
    const stdoutPath = child.stdoutPath;
    await stop(child);
    child = undefined;
    const answered = 1 + warm.requests + closed.requests +
      Math.round(openRate * settings.warmupSeconds) + open.requests;
    return {
      rate: openRate,
      run: {
        server,
        closed,
        open,
        answered,
        upstreamCalls: countsDelta(countsBefore, await readCounts(upstream.countsUrl)),
        httpRequestLogLines: isService ? (await scanStdout(stdoutPath)).httpRequestLines : null,
      },
    };
  } finally {
    if (child) await stop(child);
  }
}

async function readCounts(url: string): Promise<UpstreamCounts> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`the upstream's counts answered ${response.status}`);
  return await response.json();
}

// --- tables --------------------------------------------------------------------------------------

const times = (value: number) => `${value.toFixed(2)}x`;
const ratio = (value: number) => value.toFixed(2);

/** The medians of the rounds, one row per endpoint, verify first in each store. */
export function formatGatewayTable(result: GatewayBenchmarkResult): string {
  return formatTable(
    [
      { header: "endpoint" },
      { header: "upstream calls" },
      { header: "bare req/s", numeric: true },
      { header: "service req/s", numeric: true },
      { header: "req/s vs bare", numeric: true },
      { header: "open loop req/s", numeric: true },
      { header: "bare p99 ms", numeric: true },
      { header: "service p99 ms", numeric: true },
      { header: "p99 vs bare", numeric: true },
      { header: "CPU µs/req bare", numeric: true },
      { header: "CPU µs/req service", numeric: true },
      { header: "floor req/s", numeric: true },
      { header: "req/s vs floor", numeric: true },
      { header: "p99 vs floor", numeric: true },
    ],
    result.endpoints.map((endpoint) => [
      endpoint.isVerify ? `${endpoint.endpoint} (verify)` : endpoint.endpoint,
      endpoint.upstreamCalls,
      endpoint.median.bareRps.toFixed(0),
      endpoint.median.serviceRps.toFixed(0),
      ratio(endpoint.rpsRatio.median),
      endpoint.median.rate.toFixed(0),
      endpoint.median.bareOpenP99Ms.toFixed(2),
      endpoint.median.serviceOpenP99Ms.toFixed(2),
      times(endpoint.p99Ratio.median),
      endpoint.median.bareCpuMicros.toFixed(0),
      endpoint.median.serviceCpuMicros.toFixed(0),
      endpoint.median.floorRps?.toFixed(0) ?? "-",
      endpoint.floorRpsRatio ? ratio(endpoint.floorRpsRatio.median) : "-",
      endpoint.floorP99Ratio ? times(endpoint.floorP99Ratio.median) : "-",
    ]),
  );
}

/** Each round's figures, one row per endpoint and round. */
export function formatGatewayRoundsTable(result: GatewayBenchmarkResult): string {
  return formatTable(
    [
      { header: "endpoint" },
      { header: "round", numeric: true },
      { header: "load avg", numeric: true },
      { header: "bare req/s", numeric: true },
      { header: "service req/s", numeric: true },
      { header: "req/s vs bare", numeric: true },
      { header: "open loop req/s", numeric: true },
      { header: "bare p99 ms", numeric: true },
      { header: "service p99 ms", numeric: true },
      { header: "p99 vs bare", numeric: true },
      { header: "core 0 busy bare / service", numeric: true },
      { header: "floor req/s", numeric: true },
      { header: "floor p99 ms", numeric: true },
    ],
    result.endpoints.flatMap((endpoint) =>
      endpoint.rounds.map((round, i) => [
        endpoint.endpoint,
        String(i + 1),
        round.loadAverage.toFixed(2),
        round.bare.closed.requestsPerSecond.toFixed(0),
        round.service.closed.requestsPerSecond.toFixed(0),
        ratio(endpoint.rpsRatio.rounds[i]),
        round.rate.toFixed(0),
        round.bare.open.p99Ms.toFixed(2),
        round.service.open.p99Ms.toFixed(2),
        times(endpoint.p99Ratio.rounds[i]),
        `${pct(round.bare.closed.serverCoreBusy)} / ${pct(round.service.closed.serverCoreBusy)}`,
        round.floor?.closed.requestsPerSecond.toFixed(0) ?? "-",
        round.floor?.open.p99Ms.toFixed(2) ?? "-",
      ])
    ),
  );
}

/** One line per new endpoint saying whether it is within the goal, then the run's context. */
export function formatGatewayGoal(result: GatewayBenchmarkResult): string {
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  const rounds = (endpoint: string, pick: (result: GatewayEndpointResult) => RoundRatio) => {
    const found = result.endpoints.find((other) => other.endpoint === endpoint)!;
    return pick(found).rounds;
  };
  const within = pct(WITHIN_VERIFY);
  const lines = result.verdicts.map((verdict) =>
    `- ${verdict.endpoint}: req/s vs bare ${ratio(verdict.rpsRatio)} (rounds ${
      rounds(verdict.endpoint, (r) => r.rpsRatio).map(ratio).join(", ")
    }) against verify's ${ratio(verdict.verifyRpsRatio)}, at least ${
      ratio(verdict.minRpsRatio)
    } wanted: ${mark(verdict.rpsMet)}; open p99 vs bare ${times(verdict.p99Ratio)} (rounds ${
      rounds(verdict.endpoint, (r) => r.p99Ratio).map(times).join(", ")
    }) against verify's ${times(verdict.verifyP99Ratio)}, at most ${
      times(verdict.maxP99Ratio)
    } wanted: ${mark(verdict.p99Met)}${
      verdict.floor
        ? `; beside the floor proxy, req/s ${ratio(verdict.floor.rpsRatio)} against verify's ${
          ratio(verdict.floor.verifyRpsRatio)
        }: ${mark(verdict.floor.rpsMet)}, open p99 ${times(verdict.floor.p99Ratio)} against ${
          times(verdict.floor.verifyP99Ratio)
        }: ${mark(verdict.floor.p99Met)}`
        : ""
    }`
  );
  const verifyLines = result.endpoints.filter((endpoint) => endpoint.isVerify).map((endpoint) =>
    `- ${endpoint.endpoint} (the reference): req/s vs bare rounds ${
      endpoint.rpsRatio.rounds.map(ratio).join(", ")
    }; open p99 vs bare rounds ${endpoint.p99Ratio.rounds.map(times).join(", ")}`
  );
  const cpu = result.endpoints.map((endpoint) =>
    `${endpoint.endpoint.replace("POST /v1/", "")} ${pct(endpoint.cpuRatio.median)} (${
      endpoint.median.bareCpuMicros.toFixed(0)
    } against ${endpoint.median.serviceCpuMicros.toFixed(0)} µs)`
  );
  const all = result.endpoints.flatMap((endpoint) => endpoint.rounds);
  const busy = (pick: (round: GatewayRound) => number) => pct(median(all.map(pick)));
  return [
    `Goal: each endpoint's ratios within ${within} of its store's verify's, in the same run ` +
    `(req/s ratio at least ${pct(1 - WITHIN_VERIFY)} of verify's, open-loop p99 ratio at most ` +
    `${pct(1 + WITHIN_VERIFY)} of verify's):`,
    "",
    ...lines,
    ...verifyLines,
    `- server CPU per request, closed loop (steadier than req/s when other processes share the ` +
    `server's core): on a whole core the service would keep, of the bare proxy's req/s, ` +
    `${cpu.join(", ")}`,
    `- runs: ${result.settings.warmupSeconds} s of warm-up, then ${result.settings.durationSeconds} ` +
    `s measured closed loop; then, in the same process, ${result.settings.warmupSeconds} s and ` +
    `${result.settings.durationSeconds} s open loop at half the service's req/s; ` +
    `${result.settings.rounds} rounds`,
    `- cores, median over every closed-loop run: core ${result.settings.serverCore} (the server) ` +
    `${busy((round) => round.service.closed.serverCoreBusy)} busy under the service, ${
      busy((round) => round.bare.closed.serverCoreBusy)
    } under the bare proxy; core ${result.settings.loadCore} (load and upstreams) ${
      busy((round) => round.service.closed.loadCoreBusy)
    } and ${busy((round) => round.bare.closed.loadCoreBusy)}`,
    `- open loop: the generator sent requests late by ${
      median(all.map((round) => round.service.open.sendLagP99Ms)).toFixed(1)
    } ms (service runs) and ${
      median(all.map((round) => round.bare.open.sendLagP99Ms)).toFixed(1)
    } ms (bare proxy runs) at p99, median over the runs (counted in the latencies)`,
    `- load average (1 min) when each round began: ${
      Array.from({ length: result.settings.rounds }, (_, i) =>
        result.endpoints.map((endpoint) =>
          endpoint.rounds[i].loadAverage.toFixed(2)
        ).join(" "))
        .join("; ")
    } (each endpoint in turn, rounds apart by ";")`,
  ].join("\n");
}

// --- main ----------------------------------------------------------------------------------------

if (import.meta.main) {
  await runLoadBenchmarkCommand(runGatewayBenchmark, (result) => [
    formatGatewayTable(result),
    formatGatewayGoal(result),
    formatGatewayRoundsTable(result),
  ]);
}
