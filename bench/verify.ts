/**
 * `POST /v1/storea/verify` and `POST /v1/storeb/verify` end to end on loopback with no added
 * upstream latency, each side by side in one run with a baseline that makes the same upstream call
 * and nothing else (`bench/bare_verify_proxy.ts`).
 *
 * Processes and cores (the machine has 2):
 * - core 0: the server under test alone, first the baseline, then the service;
 * - core 1: `wrk` and the upstream (`bench/verify_upstream.ts`), each its own process.
 * The server under test is what is compared, so it gets a core nobody else uses; the load
 * generator and the upstream are the same for both servers, and the benchmark records how busy
 * core 1 was, to show whether they, rather than the server, set the pace.
 *
 * The service runs as `deno task start` would run it (same permissions, `main.ts serve`) on a
 * temporary PostgreSQL database that is dropped afterwards, with `NODE_ENV=production`,
 * `LOG_LEVEL=info` (one `http_request` line per request, written to a file in the temporary
 * directory, so the logging is part of what is measured) and a rate limit raised out of the way.
 * The upstream (`bench/verify_upstream.ts`) answers `transactions` distinct ids (store A: each with
 * its own JWS, signed once before timing; store B: subscription purchase tokens); the wrk script
 * cycles through the ids, each thread through its own residue class, so no two requests in flight
 * ask for the same id and the service's coalescing of identical requests never helps it. Every
 * answer is checked by the wrk script: status 200 and `"valid":true` (the baseline: the upstream's
 * own body); any other answer, non-2xx status or socket error fails the run.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/verify.ts
 *
 * Flags: `--json` also prints every figure as JSON, `--duration S` and `--warmup S` change the
 * length of the runs, `--keep-temp` keeps the temporary directory (logs, keys, wrk script).
 * `BENCH_DATABASE_URL` names the PostgreSQL server to create the database on (default
 * `postgres://postgres@127.0.0.1:5432/postgres`). It needs `wrk` and `taskset`.
 * @module
 */
import { parseArgs } from "node:util";
import { importPKCS8, SignJWT } from "jose";
import {
  beginRun,
  checkAnswer,
  createDatabase,
  exitWithError,
  formatComparisonTable,
  LOAD_FLAGS,
  type LoadOptions,
  loadOptionsFromFlags,
  loadSettings,
  type Machine,
  measureLoad,
  parseCheckedAnswers,
  parseWrk,
  pct,
  productionServiceEnv,
  type Progress,
  ROOT,
  runCli,
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
}

/** The figures of one server under load. */
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
  /** `http_request` lines in the service's stdout file (the whole run); null for the baseline. */
  httpRequestLogLines: number | null;
}

/** The two stores: App Store (A) and Google Play (B). */
export type StoreName = "storea" | "storeb";

/** The outcome for one store. */
export interface StoreVerifyResult {
  store: StoreName;
  endpoint: string;
  /** How long the upstream took to get ready (store A: make its PKI and sign every transaction). */
  upstreamSetupMs: number;
  bare: VerifyTargetResult;
  service: VerifyTargetResult;
  /** service req/s divided by baseline req/s. */
  rpsRatio: number;
  /** service p99 divided by baseline p99. */
  p99Ratio: number;
  goal: {
    minRpsRatio: number;
    maxP99Ratio: number;
    maxRssMb: number;
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

/** The goal: the service keeps at least this share of the baseline's req/s. */
export const MIN_RPS_RATIO = 0.6;
/** The goal: the service's p99 is at most this many times the baseline's. */
export const MAX_P99_RATIO = 1.5;
/** The goal: the service's peak RSS under load stays under this many MiB. */
export const MAX_RSS_MB = 150;

/** Thrown when the run saw a wrong answer: the figures would not be of a verification. */
export class WrongAnswersError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WrongAnswersError";
  }
}

const PACKAGE_NAME = "com.example.app";
/** Far above what one tenant can send here: the rate limiter must not be what is measured. */
const RATE_LIMIT = "1000000";

type Settings = VerifyBenchmarkResult["settings"];

/** Runs the benchmark for each store whose upstream exists: baseline first, then the service. */
export async function runVerifyBenchmark(
  options: VerifyBenchmarkOptions = {},
): Promise<VerifyBenchmarkResult> {
  const settings: Settings = {
    ...loadSettings(options),
    transactions: options.transactions ?? 20_000,
  };
  const progress = options.progress ?? writeProgress;
  const { startedAt, machine } = await beginRun(settings, progress);

  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-verify-" });
  const database = await createDatabase(options.databaseUrl);
  try {
    progress(`temporary database ${database.name}, temp dir ${tmp}`);
    const storeaKeyFile = await writeStoreaKey(`${tmp}/AuthKey_${STOREA_KEY_ID}.p8`);
    const storebAccountFile = `${tmp}/service-account.json`;
    await Deno.writeTextFile(storebAccountFile, (await createServiceAccount()).json);
    const serviceEnv = await productionServiceEnv(tmp, {
      DATABASE_URL: database.url,
      RATE_LIMIT_PER_SECOND: RATE_LIMIT,
      RATE_LIMIT_BURST: RATE_LIMIT,
    });
    const tenant = await createTenant(serviceEnv, { storeaKeyFile, storebAccountFile });
    progress(`tenant ${tenant.tenantId} with store A and store B credentials`);

    const context = { settings, progress, tmp, serviceEnv, apiKey: tenant.apiKey };
    const stores: StoreVerifyResult[] = [];
    for (const store of options.stores ?? ["storea", "storeb"]) {
      const spec = store === "storea"
        ? storeaSpec(tmp, storeaKeyFile)
        : storebSpec(storebAccountFile);
      stores.push(await benchStore(context, spec));
    }
    const failures = stores.flatMap((store) =>
      [store.bare, store.service].filter((target) =>
        target.non2xx > 0 || target.checkedBad > 0 || target.socketErrors > 0 ||
        target.checkedGood < target.requests
      ).map((target) =>
        `${store.store} ${target.name}: ${target.non2xx} non-2xx, ${target.checkedBad} wrong ` +
        `bodies, ${target.socketErrors} socket errors, ${target.checkedGood} of ` +
        `${target.requests} answers checked right`
      )
    );
    if (failures.length > 0) {
      throw new WrongAnswersError(`wrong answers under load:\n${failures.join("\n")}`);
    }
    return { startedAt, machine, settings, stores };
  } finally {
    await database.drop();
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

/** The markdown table of one store's result. */
export function formatVerifyTable(result: StoreVerifyResult): string {
  return formatComparisonTable(result);
}

/** One line per goal, saying whether it is met, then where the CPU went. */
export function formatVerifyGoal(result: StoreVerifyResult): string {
  const { goal, service, bare } = result;
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  const cpu = (target: VerifyTargetResult) =>
    `${target.name}: server ${target.serverCpuCores.toFixed(2)} cores, upstream ${
      target.upstreamCpuCores.toFixed(2)
    } cores, core busy ${pct(target.serverCoreBusy)} (server) / ${
      pct(target.loadCoreBusy)
    } (wrk + upstream)`;
  return [
    `- req/s at least ${pct(goal.minRpsRatio)} of baseline: ${pct(result.rpsRatio)}, ${
      mark(goal.rpsMet)
    }`,
    `- p99 at most ${goal.maxP99Ratio}x baseline: ${result.p99Ratio.toFixed(2)}x, ${
      mark(goal.p99Met)
    }`,
    `- peak RSS under ${goal.maxRssMb} MB: ${service.peakRssMb.toFixed(1)} MB, ${
      mark(goal.rssMet)
    }`,
    `- ${cpu(bare)}`,
    `- ${cpu(service)}`,
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
  /** What every right answer of the baseline (the upstream's own body) holds. */
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

/** Starts the store's upstream, then measures the baseline and the service against it. */
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
    const prefix = `${tmp}/${spec.store}-`;
    const bare = await measure(
      settings,
      progress,
      target(
        "bare proxy",
        () =>
          startBaseline("bench/bare_verify_proxy.ts", prefix, {
            core: settings.serverCore,
            env: bareEnv,
          }),
        spec.bareMarker,
      ),
    );
    const service = await measure(
      settings,
      progress,
      target(
        "purchase-relay",
        () =>
          startService(prefix, {
            core: settings.serverCore,
            env: { ...context.serviceEnv, ...spec.serviceEnv(ready) },
          }),
        '"valid":true',
      ),
    );
    return summarize(spec.store, `POST ${spec.path}`, ready.setupMs, bare, service);
  } finally {
    await stop(upstream);
  }
}

/** An App Store Server API token as the service signs it, for the baseline to send. */
async function signStoreaToken(keyFile: string): Promise<string> {
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

/** An access token for the baseline, from the simulator's token endpoint (JWT-bearer grant). */
async function fetchStorebAccessToken(accountFile: string, tokenUrl: string): Promise<string> {
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

function summarize(
  store: StoreName,
  endpoint: string,
  upstreamSetupMs: number,
  bare: VerifyTargetResult,
  service: VerifyTargetResult,
): StoreVerifyResult {
  const rpsRatio = service.requestsPerSecond / bare.requestsPerSecond;
  const p99Ratio = service.p99Ms / bare.p99Ms;
  return {
    store,
    endpoint,
    upstreamSetupMs,
    bare,
    service,
    rpsRatio,
    p99Ratio,
    goal: {
      minRpsRatio: MIN_RPS_RATIO,
      maxP99Ratio: MAX_P99_RATIO,
      maxRssMb: MAX_RSS_MB,
      rpsMet: rpsRatio >= MIN_RPS_RATIO,
      p99Met: p99Ratio <= MAX_P99_RATIO,
      rssMet: service.peakRssMb < MAX_RSS_MB,
    },
  };
}

// --- tenant -------------------------------------------------------------------------------------

/** Migrates, then makes a tenant, a live API key and both stores' credentials through the CLI. */
async function createTenant(
  env: Record<string, string>,
  files: { storeaKeyFile: string; storebAccountFile: string },
): Promise<{ tenantId: string; apiKey: string }> {
  await runCli(["migrate"], env);
  const tenant = await runCli(["tenant", "create", "--name", "Bench tenant"], env);
  const tenantId = String(tenant.id);
  const key = await runCli(["key", "create", tenantId, "--env", "live"], env);
  await setStoreaCredentials(env, { tenantId, keyFile: files.storeaKeyFile });
  await runCli([
    "storeb",
    "set-credentials",
    tenantId,
    "--package-name",
    PACKAGE_NAME,
    "--service-account-file",
    files.storebAccountFile,
    "--push-audience",
    "https://relay.example.com/push",
    "--push-service-account",
    "push@bench-project.iam.gserviceaccount.com",
  ], env);
  return { tenantId, apiKey: String(key.key) };
}

// --- servers -------------------------------------------------------------------------------------

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

async function measure(
  settings: Settings,
  progress: Progress,
  target: Target,
): Promise<VerifyTargetResult> {
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
    const isService = name !== "bare proxy";
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
 * The wrk script: POSTs the store's request body with the API key, thread `t` of `T` taking ids
 * t, t+T, t+2T, ... (modulo the count), so two requests in flight never share an id; and checks
 * every answer (status 200 and `marker` in the body), reporting the counts from `done`.
 * Arguments after `--`: thread count, id count, marker.
 */
async function writeWrkScript(path: string, spec: StoreSpec, apiKey: string): Promise<string> {
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
async function loadStore(
  url: string,
  target: Target,
  settings: Settings,
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
  const { values } = parseArgs({ args: Deno.args, options: LOAD_FLAGS });
  try {
    const result = await runVerifyBenchmark(loadOptionsFromFlags(values));
    for (const store of result.stores) {
      console.log(`## ${store.endpoint}\n`);
      console.log(formatVerifyTable(store));
      console.log();
      console.log(formatVerifyGoal(store));
      console.log();
    }
    if (values.json) console.log(JSON.stringify(result, null, 2));
  } catch (error) {
    exitWithError(error);
  }
}
