/**
 * `POST /v1/webhooks/storea/:tenantId` end to end on loopback: the service receives distinct signed
 * App Store notifications, verifies their JWS (the outer `signedPayload`, the nested
 * `signedTransactionInfo` and `signedRenewalInfo`), commits the event and its delivery, answers
 * 200, and its dispatcher delivers each one to a callback sink. Side by side in the same run with a
 * baseline (`bench/bare_receiver.ts`) that reads the same bodies and answers a receipt of the same
 * shape without verifying, storing or delivering anything.
 *
 * Processes and cores (the machine has 2):
 * - core 0: the server under test alone, first the baseline, then the service;
 * - core 1: `wrk` and the callback sink (this module run as `bench/relay.ts sink`), each its own
 *   process. PostgreSQL is not ours to pin: its backends run on either core, and the benchmark
 *   reports their CPU time.
 *
 * Before any timing it makes a fresh test PKI (`createStoreaTestPki`), which the service trusts
 * through `STOREA_ROOT_CERTS`, and signs `notifications` distinct `DID_RENEW` notifications, each
 * with its own `notificationUUID`, transaction and renewal info, written one body per line to one
 * file per wrk thread. Thread `t` of `T` takes notifications `t, t+T, ...`; the measured run
 * starts where the warm-up stopped, so no notification is sent twice to the service, and the wrk
 * script counts a wrap-around (too few notifications for the run) as a failure. It checks every
 * answer: status 200 with `"isNew":true,"enqueuedDelivery":true` in the body; any other answer,
 * non-2xx status or socket error fails the run.
 *
 * The service runs as `deno task start` would run it (same permissions, `main.ts serve`) on a
 * temporary PostgreSQL database that is dropped afterwards (or, with `--engine embedded`, on the
 * embedded engine in a temporary data directory, which the bench reads through the socket the
 * service shares it on), with `NODE_ENV=production`, a random
 * `ENCRYPTION_KEY`, `CALLBACK_ALLOW_HTTP=true` and `CALLBACK_ALLOW_PRIVATE_NETWORKS=true` (the sink
 * is plain http on loopback) and `LOG_LEVEL=info`, its stdout (one `http_request` line per request, one `delivery_attempt` line
 * per delivery) written to a file in the temporary directory. One tenant, with store A credentials
 * and a callback URL pointing at the sink, made through the CLI.
 *
 * After the measured run it waits (up to `--drain` seconds) until every delivery is delivered, then
 * checks that none was lost: events in the database = delivered rows = distinct event ids the sink
 * received with a valid `X-Service-Signature`.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/relay.ts
 *
 * Flags: `--json` also prints every figure as JSON; `--duration S` and `--warmup S` change the
 * length of the runs (20 s and 5 s); `--rounds N` runs it all N times, baselines included, and adds
 * a table of each round's goal figures and their medians; `--notifications N` the number signed
 * (72,000; 16,000 on the embedded engine); `--engine postgresql|embedded` the service's engine (PostgreSQL); `--drain S`
 * the longest wait for the deliveries after the measured run (60 s); `--keep-temp` keeps the
 * temporary directory (logs, bodies, wrk script). `BENCH_DATABASE_URL` names the PostgreSQL server
 * to create the database on (default `postgres://postgres@127.0.0.1:5432/postgres`). It needs `wrk`
 * and `taskset`.
 * @module
 */
import { parseArgs } from "node:util";
import {
  type IngestBaseline,
  runEmbeddedIngestBaseline,
  runIngestBaseline,
} from "./ingest_baseline.ts";
import type { PostLoopClient, SignedPostLoopResult } from "./signed_post_loop.ts";
import postgres from "postgres";
import { sharedEmbeddedClient } from "../src/db/connect.ts";
import { CONFIG_VARIABLES } from "../src/config.ts";
import {
  beginRun,
  checkAnswer,
  type CheckedAnswers,
  cpuSeconds,
  createDatabase,
  exitWithError,
  formatComparisonTable,
  formatTable,
  LOAD_FLAGS,
  type LoadMeasurement,
  type LoadOptions,
  loadOptionsFromFlags,
  type LoadSettings,
  loadSettings,
  type Machine,
  measureLoad,
  median,
  numberFlag,
  parseCheckedAnswers,
  parseWrk,
  pct,
  productionServiceEnv,
  type Progress,
  readMemory,
  runCli,
  runOpenLoopGenerator,
  runPinnedForJson,
  runWrk,
  type Server,
  setStoreaCredentials,
  spawnPinned,
  startBaseline,
  startService,
  stop,
  STOREA_BUNDLE_ID,
  STOREA_KEY_ID,
  waitForLine,
  writeProgress,
  writeStoreaKey,
  WRK_CHECKED_ANSWERS_LUA,
  type WrkFigures,
} from "./support.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { verifySignature } from "../simulators/webhook_signature.ts";

/** Options of {@linkcode runRelayBenchmark}. */
export interface RelayBenchmarkOptions extends LoadOptions {
  /** Distinct notifications signed before timing; 72,000 by default, 16,000 on the embedded engine. */
  notifications?: number;
  /** The longest wait for the deliveries after the measured run, in seconds; 60 by default. */
  drainSeconds?: number;
  /** PostgreSQL to create the temporary database on; `BENCH_DATABASE_URL` or local by default. */
  databaseUrl?: string;
  /** The engine the service runs on: PostgreSQL (the default) or the embedded engine. */
  engine?: RelayEngine;
}

/** The engines the relay can be measured on. */
export type RelayEngine = "postgresql" | "embedded";

/** The settings of a run, defaults filled in. */
export interface RelaySettings extends LoadSettings {
  notifications: number;
  drainSeconds: number;
  engine: RelayEngine;
}

/** The figures of one server under load. */
export interface ReceiverResult extends WrkFigures {
  name: string;
  /** Answers the wrk script found right (200 and a new, enqueued receipt) in the measured run. */
  checkedGood: number;
  /** Answers it found wrong, in the measured run. */
  checkedBad: number;
  /** Wrong answers in the warm-up. */
  warmupBad: number;
  /** Requests that had to reuse a notification because the signed ones ran out (both runs). */
  wrapped: number;
  /** The first wrong answer, status and start of the body, or null. */
  firstWrong: string | null;
  /** The largest VmRSS of the server's deno process sampled every 250 ms during the measured run. */
  peakRssMb: number;
  /** VmHWM (peak since the process started, boot and drain included) before it was stopped. */
  hwmMb: number;
  /** The VmRSS samples of the measured run, in MiB, every 250 ms. */
  rssSamplesMb: number[];
  /** CPU time of the server per second of the measured run (1 = a whole core). */
  serverCpuCores: number;
  /** Server CPU time per measured request, in µs. */
  cpuPerRequestUs: number;
  /** How busy the server's core and the load core were (0 to 1), whoever used them. */
  serverCoreBusy: number;
  loadCoreBusy: number;
}

/** Lines of the service's stdout by `msg`, and its warnings and errors. */
export interface ServiceLog {
  httpRequest: number;
  notificationReceived: number;
  deliveryAttempt: number;
  /** `msg` of every `warn`, `error` or `fatal` line, with its count. */
  problems: Record<string, number>;
  /** The first few of those lines, as written. */
  problemLines: string[];
}

/** What the sink received, as it reports it. */
export interface SinkStats {
  /** POSTs to the delivery path. */
  received: number;
  /** Of those, with an `X-Service-Signature` that verifies with the tenant's secret. */
  valid: number;
  invalid: number;
  /** Distinct `X-Service-Event-Id`s among the valid ones. */
  distinct: number;
  /** Valid deliveries of an event id already received. */
  duplicates: number;
  /** Arrival of the first and last delivery, epoch ms (0 before any). */
  firstAt: number;
  lastAt: number;
}

/** The deliveries' side of the service's run. */
export interface DeliveryResult {
  /** Rows in `events` at the end: the notifications the service accepted (check, warm-up, run). */
  accepted: number;
  /** Answers the wrk script counted right over the warm-up and the measured run, plus the check. */
  answeredNew: number;
  /** Rows in `deliveries` by status at the end. */
  delivered: number;
  pending: number;
  failed: number;
  /** Rows in `delivery_attempts`, and those of them without a 2xx answer. */
  attempts: number;
  failedAttempts: number;
  /** The sink's counters at the end. */
  sink: SinkStats;
  /** Time from the receipt (event committed) to the attempt that delivered it, over all rows. */
  lag: { p50Ms: number; p99Ms: number; maxMs: number };
  /** The measured run: the window between the reads just before wrk started and just after. */
  run: {
    seconds: number;
    /** Events committed in the window, and per second. */
    accepted: number;
    acceptedPerSecond: number;
    /** Valid deliveries the sink received in the window, and per second. */
    delivered: number;
    deliveredPerSecond: number;
    /** Accepted but not yet delivered (events - delivered rows) at the start and the end. */
    backlogAtStart: number;
    backlogAtEnd: number;
    /** CPU time of the sink and of the database's backends per second of the window. */
    sinkCpuCores: number;
    postgresCpuCores: number;
  };
  /** From the end of the measured run to the last delivery. */
  drain: {
    /** Whether every delivery was delivered within `drainSeconds`. */
    complete: boolean;
    seconds: number;
    deliveries: number;
    perSecond: number;
    /** CPU time of the service and of the database's backends per delivery while draining. */
    serviceCpuUsPerDelivery: number;
    postgresCpuUsPerDelivery: number;
  };
  /** Valid deliveries between the sink's first and last arrival, per second. */
  overallPerSecond: number;
  /** accepted - delivered rows, and accepted - distinct valid deliveries at the sink. */
  lostRows: number;
  lostAtSink: number;
}

/**
 * The open-loop phase: fresh notifications sent at fixed times (`bench/open_loop.mjs`) at half
 * the accepted/s of the measured run, latency counted from each one's scheduled time.
 */
export interface RelayOpenLoop {
  rate: number;
  seconds: number;
  /** Receipts due in the measured window, right and wrong. */
  requests: number;
  good: number;
  bad: number;
  firstWrong: string | null;
  /** The receiver's answer, from the scheduled time: p50, p99, max. */
  receiverP50Ms: number;
  receiverP99Ms: number;
  receiverMaxMs: number;
  /** How late the generator sent, p99 (counted in the latencies). */
  sendLagP99Ms: number;
  /** Receipt (event committed) to the delivering attempt, over the phase's events. */
  lag: { p50Ms: number; p99Ms: number; maxMs: number };
  /** From the last answer to no delivery pending; null when it did not happen within the drain. */
  backlogZeroMs: number | null;
  /** The phase's events, and those delivered; valid deliveries the sink counted in the phase. */
  events: number;
  delivered: number;
  atSink: number;
}

/** Keep-alive connections of the open-loop generator, as in bench/verify.ts. */
const OPEN_LOOP_CONNECTIONS = 100;
/** The open-loop phase's warm-up and measured window, in seconds. */
const OPEN_LOOP_WARMUP_SECONDS = 2;
const OPEN_LOOP_SECONDS = 10;

/** What {@linkcode runRelayBenchmark} returns. */
export interface RelayBenchmarkResult {
  startedAt: string;
  machine: Machine;
  settings: RelaySettings;
  /** Signing the notifications: how long it took and the mean body size. */
  setup: { signMs: number; meanBodyBytes: number };
  bare: ReceiverResult;
  service: ReceiverResult;
  /** service req/s divided by baseline req/s. */
  rpsRatio: number;
  /** service p99 divided by baseline p99. */
  p99Ratio: number;
  delivery: DeliveryResult;
  /** The raw engine committing the service's one-notification statement (bench/ingest_baseline.ts). */
  ingestBaseline: IngestBaseline;
  /** The service's accepted/s in the measured run divided by the baseline's transactions/s. */
  ingestRatio: number;
  /** A bare loop of the same signed POSTs to the same sink, with `fetch` (bench/signed_post_loop.ts). */
  postLoop: SignedPostLoopResult;
  /** Valid deliveries the sink counted during the loop: every one of its 2xx, none lost. */
  postLoopAtSink: number;
  /** Deliveries per second while draining divided by the loop's POSTs per second. */
  drainRatio: number;
  /** The same loop over the service's own callback client: the drain's floor. */
  postLoopFloor: SignedPostLoopResult;
  /** Valid deliveries the sink counted during the floor loop. */
  postLoopFloorAtSink: number;
  /** Deliveries per second while draining divided by the floor loop's POSTs per second. */
  drainFloorRatio: number;
  /** Notifications sent open loop at half the measured ingest rate, once the backlog was done. */
  openLoop: RelayOpenLoop;
  serviceLog: ServiceLog;
  /** Why the run failed (wrong answers, a wrap-around, lost deliveries, ...); empty when it did not. */
  problems: string[];
}

/** Thrown when the run saw a wrong answer or lost a delivery; `result` holds every figure. */
export class RelayRunError extends Error {
  readonly result: RelayBenchmarkResult;
  constructor(result: RelayBenchmarkResult) {
    super(`the relay benchmark failed:\n${result.problems.map((p) => `- ${p}`).join("\n")}`);
    this.name = "RelayRunError";
    this.result = result;
  }
}

/** What every right receipt holds: a new event whose delivery was enqueued. */
const RECEIPT_MARKER = '"isNew":true,"enqueuedDelivery":true';
/** The sink's delivery path. */
const SINK_PATH = "/hooks";
/** Notifications signed at the same time while preparing the bodies. */
const SIGNING_BATCH = 100;
/** Connections of the raw-engine ingest baseline. */
const INGEST_BASELINE_CLIENTS = 10;

/**
 * Runs the benchmark: signs the notifications, measures the baseline, then the service, waits
 * for its deliveries and counts them.
 * @throws {RelayRunError} after the run, when an answer was wrong or a delivery is missing.
 */
export async function runRelayBenchmark(
  options: RelayBenchmarkOptions = {},
): Promise<RelayBenchmarkResult> {
  const settings: RelaySettings = {
    ...loadSettings({
      ...options,
      durationSeconds: options.durationSeconds ?? 20,
      warmupSeconds: options.warmupSeconds ?? 5,
    }),
    // The embedded engine accepts about a third of what PostgreSQL does: fewer last its runs.
    notifications: options.notifications ?? (options.engine === "embedded" ? 16_000 : 72_000),
    drainSeconds: options.drainSeconds ?? 60,
    engine: options.engine ?? "postgresql",
  };
  if (settings.notifications % settings.threads !== 0) {
    // Otherwise the threads' residue classes would not split the notifications evenly.
    throw new Error("notifications must be a multiple of threads");
  }
  const progress = options.progress ?? writeProgress;
  const { startedAt, machine } = await beginRun(settings, progress);

  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-relay-" });
  const database = settings.engine === "postgresql"
    ? await createDatabase(options.databaseUrl)
    : null;
  let sink: Server | undefined;
  let sql: postgres.Sql | undefined;
  try {
    progress(
      `${database ? `temporary database ${database.name}` : "embedded engine"}, temp dir ${tmp}`,
    );
    const pki = await createStoreaTestPki();
    const signer = new StoreaSigner(pki, { bundleId: STOREA_BUNDLE_ID });
    progress(`signing ${settings.notifications} notifications (3 JWS each)`);
    const bodies = await writeNotificationBodies(signer, settings, `${tmp}/bodies-`);
    const checkBody = await signedNotificationBody(signer);
    progress(
      `signed in ${(bodies.signMs / 1000).toFixed(1)} s, ${
        Math.round(bodies.meanBodyBytes)
      } bytes per body on average`,
    );

    const secret = `whsec_${crypto.randomUUID().replaceAll("-", "")}`;
    sink = await startSink(tmp, settings, secret);
    const serviceEnv = await productionServiceEnv(tmp, {
      ...(database ? { DATABASE_URL: database.url } : {}),
      CALLBACK_ALLOW_HTTP: "true",
      CALLBACK_ALLOW_PRIVATE_NETWORKS: "true",
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, `${tmp}/storea-root.pem`),
      // The one tenant may have as many attempts in flight as the signed-POST loop and the
      // service's DELIVERY_CONCURRENCY: the drain measures the dispatcher, not the fairness cap
      // (at its default of 8, one tenant's drain is 8 attempts per commit round trip).
      DELIVERY_TENANT_CONCURRENCY: String(POST_LOOP_IN_FLIGHT),
    });
    const tenantId = await createTenant(serviceEnv, {
      storeaKeyFile: await writeStoreaKey(`${tmp}/AuthKey_${STOREA_KEY_ID}.p8`),
      callbackUrl: `${sink.url}${SINK_PATH}`,
      secret,
    });
    progress(`tenant ${tenantId}, callback ${sink.url}${SINK_PATH} (sink pid ${sink.pid})`);

    const path = `/v1/webhooks/storea/${tenantId}`;
    const script = await writeWrkScript(`${tmp}/relay.lua`);
    const load: LoadSpec = { settings, script, path, bodiesPrefix: `${tmp}/bodies-` };

    // The baseline first: it sends the same bodies, and duplicates do not matter to it.
    progress("bare receiver: starting");
    const bareServer = await startBaseline("bench/bare_receiver.ts", `${tmp}/`, {
      core: settings.serverCore,
    });
    let bare: ReceiverResult;
    try {
      await checkAnswer(`${bareServer.url}${path}`, { body: checkBody, marker: RECEIPT_MARKER });
      progress(`bare receiver: pid ${bareServer.pid}, warming up ${settings.warmupSeconds} s`);
      const warmup = await runLoad(bareServer.url, load, settings.warmupSeconds, 0);
      progress(`bare receiver: measuring ${settings.durationSeconds} s`);
      const timed = await measureRun(bareServer, load, 0);
      bare = receiverResult("bare receiver", settings, warmup, timed);
    } finally {
      await stop(bareServer);
    }
    progress(describeReceiver(bare, settings));

    progress("purchase-relay: starting");
    const service = await startService(`${tmp}/`, { core: settings.serverCore, env: serviceEnv });
    let serviceResult: ReceiverResult;
    let delivery: DeliveryResult;
    let openLoop: RelayOpenLoop;
    let sample: { payload: string };
    try {
      sql = connectQueue(database?.url ?? null, serviceEnv.DATA_DIR);
      await checkAnswer(`${service.url}${path}`, { body: checkBody, marker: RECEIPT_MARKER });
      progress(
        `purchase-relay: pid ${service.pid} on ${service.url}, warming up ${settings.warmupSeconds} s`,
      );
      const warmup = await runLoad(service.url, load, settings.warmupSeconds, 0);
      const pids: RelayPids = {
        service: service.pid,
        sink: sink.pid,
        postgres: database ? await postgresBackends(sql) : [],
      };
      progress(
        `purchase-relay: measuring ${settings.durationSeconds} s (from notification ${warmup.nextBase}, ` +
          `${pids.postgres.length} database backends)`,
      );
      const before = await relayCounters(sql, sink.url, pids);
      const timed = await measureRun(service, load, warmup.nextBase);
      const after = await relayCounters(sql, sink.url, pids);
      serviceResult = receiverResult("purchase-relay", settings, warmup, timed);
      progress(describeReceiver(serviceResult, settings));
      progress(`purchase-relay: waiting up to ${settings.drainSeconds} s for the deliveries`);
      const complete = await waitForDeliveries(sql, settings.drainSeconds);
      const end = await relayCounters(sql, sink.url, pids);
      serviceResult.hwmMb = (await readMemory(service.pid)).hwmKb / 1024;
      delivery = deliveryResult({
        before,
        after,
        end,
        complete,
        lag: await queueLag(sql),
        answeredNew: 1 + warmup.checkedGood + timed.load.checkedGood,
      });
      progress(describeDelivery(delivery));
      openLoop = await measureOpenLoop({
        signer,
        settings,
        tmp,
        sql,
        sinkUrl: sink.url,
        url: `${service.url}${path}`,
        rate: Math.max(1, Math.round(delivery.run.acceptedPerSecond / 2)),
      }, progress);
      [sample] = await sql`
        SELECT payload FROM events ORDER BY received_at LIMIT 1`;
    } finally {
      // The embedded engine's socket closes with the service.
      if (!database) {
        await sql?.end();
        sql = undefined;
      }
      await stop(service);
    }
    const serviceLog = await scanServiceLog(service.stdoutPath);
    // The service is stopped: the engine now runs the service's own statement for the baseline.
    const { payload } = sample;
    const baselineSpec = {
      tenantId,
      clients: INGEST_BASELINE_CLIENTS,
      payload,
      seconds: settings.durationSeconds,
    };
    progress(
      `raw ${engineName(settings.engine)}: ${INGEST_BASELINE_CLIENTS} clients, ` +
        `${payload.length} B payload`,
    );
    const ingestBaseline = database
      ? await runIngestBaseline({
        ...baselineSpec,
        databaseUrl: database.url,
        countEvents: async () => (await sql!`SELECT count(*)::int AS n FROM events`)[0].n,
        tmp,
        core: settings.loadCore,
      })
      : await runEmbeddedIngestBaseline({
        ...baselineSpec,
        dataDir: serviceEnv.DATA_DIR,
        core: settings.serverCore,
      });
    progress(
      `raw ${engineName(settings.engine)}: ${ingestBaseline.transactionsPerSecond.toFixed(0)} tps`,
    );
    const loop = async (client: PostLoopClient) => {
      const atSinkBefore = (await sinkStats(sink!.url)).valid;
      const result = await runSignedPostLoop(tmp, settings, {
        url: `${sink!.url}${SINK_PATH}`,
        secret,
        payload,
        client,
      });
      const atSink = (await sinkStats(sink!.url)).valid - atSinkBefore;
      progress(`bare signed-POST loop (${client}): ${result.perSecond.toFixed(0)} POSTs/s`);
      return { result, atSink };
    };
    const { result: postLoop, atSink: postLoopAtSink } = await loop("fetch");
    const { result: postLoopFloor, atSink: postLoopFloorAtSink } = await loop("service");
    const result: RelayBenchmarkResult = {
      startedAt,
      machine,
      settings,
      setup: bodies,
      bare,
      service: serviceResult,
      rpsRatio: serviceResult.requestsPerSecond / bare.requestsPerSecond,
      p99Ratio: serviceResult.p99Ms / bare.p99Ms,
      delivery,
      ingestBaseline,
      ingestRatio: delivery.run.acceptedPerSecond / ingestBaseline.transactionsPerSecond,
      postLoop,
      postLoopAtSink,
      drainRatio: delivery.drain.perSecond / postLoop.perSecond,
      postLoopFloor,
      postLoopFloorAtSink,
      drainFloorRatio: delivery.drain.perSecond / postLoopFloor.perSecond,
      openLoop,
      serviceLog,
      problems: [],
    };
    result.problems = problemsOf(result);
    if (result.problems.length > 0) throw new RelayRunError(result);
    return result;
  } finally {
    await sql?.end();
    if (sink) await stop(sink);
    await database?.drop();
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

/** The markdown table of the two servers. */
export function formatRelayTable(result: RelayBenchmarkResult): string {
  // Three decimals: the service's share of the baseline's req/s is around 1%.
  return formatComparisonTable(result, { rpsRatioDigits: 3 });
}

/** The markdown table of the deliveries: none lost, how fast they went, how long they waited. */
export function formatRelayDeliveryTable(result: RelayBenchmarkResult): string {
  const { delivery: d } = result;
  const raw = engineName(result.settings.engine);
  const count = (n: number) => n.toLocaleString("en-US");
  const rate = (n: number) => (Number.isFinite(n) ? n.toFixed(0) : "-");
  const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
  const ms = (value: number) => `${value.toFixed(1)} ms`;
  return formatTable([{ header: "deliveries" }, { header: "this run" }], [
    ["accepted (rows in `events`)", count(d.accepted)],
    ["delivered rows / received by the sink", `${count(d.delivered)} / ${count(d.sink.distinct)}`],
    [
      "lost, duplicates, bad signatures, failed tries",
      [Math.max(d.lostRows, d.lostAtSink), d.sink.duplicates, d.sink.invalid, d.failedAttempts]
        .join(", "),
    ],
    [
      `raw ${raw}, one notification per transaction (${result.ingestBaseline.tool}, tps)`,
      `${rate(result.ingestBaseline.transactionsPerSecond)} (${result.ingestBaseline.clients} ` +
      `clients, ${count(result.ingestBaseline.payloadBytes)} B payload)`,
    ],
    [`accepted per second / raw ${raw}`, `${result.ingestRatio.toFixed(2)}x`],
    [
      "bare signed-POST loop to the sink, `fetch` (POSTs per second)",
      `${rate(result.postLoop.perSecond)} (${result.postLoop.inFlight} in flight)`,
    ],
    [
      "floor: the same loop over the service's callback client (POSTs per second)",
      `${rate(result.postLoopFloor.perSecond)} (${result.postLoopFloor.inFlight} in flight)`,
    ],
    [
      "accepted / delivered per second in the run",
      `${rate(d.run.acceptedPerSecond)} / ${rate(d.run.deliveredPerSecond)}`,
    ],
    [
      "backlog (accepted, not delivered), start -> end",
      `${count(d.run.backlogAtStart)} -> ${count(d.run.backlogAtEnd)}`,
    ],
    ["drain", `${count(d.drain.deliveries)} in ${d.drain.seconds.toFixed(1)} s`],
    ["deliveries per second while draining", drainFigure(d.drain.perSecond, 0)],
    ["draining / bare signed-POST loop (`fetch`)", drainFigure(result.drainRatio, 2, "x")],
    ["draining / floor loop (the service's client)", drainFigure(result.drainFloorRatio, 2, "x")],
    ["deliveries per second, first to last", rate(d.overallPerSecond)],
    ["receipt to delivery, p50 / p99", `${seconds(d.lag.p50Ms)} / ${seconds(d.lag.p99Ms)}`],
    [
      "open loop: notifications per second (half the accepted/s above), seconds measured",
      `${rate(result.openLoop.rate)}, ${result.openLoop.seconds}`,
    ],
    [
      "open loop: receiver p50 / p99 / max, from the scheduled time",
      `${ms(result.openLoop.receiverP50Ms)} / ${ms(result.openLoop.receiverP99Ms)} / ${
        ms(result.openLoop.receiverMaxMs)
      } (generator late by ${ms(result.openLoop.sendLagP99Ms)} at p99)`,
    ],
    [
      "open loop: receipt to delivery, p50 / p99 / max",
      `${ms(result.openLoop.lag.p50Ms)} / ${ms(result.openLoop.lag.p99Ms)} / ${
        ms(result.openLoop.lag.maxMs)
      }`,
    ],
    [
      "open loop: backlog at zero after the last answer",
      result.openLoop.backlogZeroMs === null
        ? "not within the drain wait"
        : ms(result.openLoop.backlogZeroMs),
    ],
  ]);
}

/**
 * Runs the whole benchmark `rounds` times, each round with its own baselines, so every ratio is
 * taken within one round and the rounds interleave service and baselines; see
 * {@linkcode formatRelayRoundsTable} for the medians.
 */
export async function runRelayRounds(
  options: RelayBenchmarkOptions,
  rounds: number,
): Promise<RelayBenchmarkResult[]> {
  const results: RelayBenchmarkResult[] = [];
  for (let round = 1; round <= rounds; round++) {
    options.progress?.(`relay round ${round} of ${rounds}`);
    results.push(await runRelayBenchmark(options));
  }
  return results;
}

/** Each round's goal figures, then their medians (each column's own median). */
export function formatRelayRoundsTable(results: RelayBenchmarkResult[]): string {
  const columns: {
    header: string;
    of: (r: RelayBenchmarkResult) => number;
    digits: number;
    /** A drain figure: NaN when the round had nothing to drain. */
    drain?: true;
  }[] = [
    { header: "accepted/s", of: (r) => r.delivery.run.acceptedPerSecond, digits: 0 },
    {
      header: `raw ${engineName(results[0].settings.engine)} tps`,
      of: (r) => r.ingestBaseline.transactionsPerSecond,
      digits: 0,
    },
    { header: "ingest ratio", of: (r) => r.ingestRatio, digits: 2 },
    { header: "delivered/s at full load", of: (r) => r.delivery.run.deliveredPerSecond, digits: 0 },
    { header: "drain/s", of: (r) => r.delivery.drain.perSecond, digits: 0, drain: true },
    { header: "signed-POST loop/s", of: (r) => r.postLoop.perSecond, digits: 0 },
    { header: "drain ratio", of: (r) => r.drainRatio, digits: 2, drain: true },
    { header: "floor loop/s", of: (r) => r.postLoopFloor.perSecond, digits: 0 },
    { header: "drain vs floor", of: (r) => r.drainFloorRatio, digits: 2, drain: true },
    { header: "open loop/s", of: (r) => r.openLoop.rate, digits: 0 },
    { header: "receiver p99 ms", of: (r) => r.openLoop.receiverP99Ms, digits: 1 },
    { header: "receipt to delivery p99 ms", of: (r) => r.openLoop.lag.p99Ms, digits: 1 },
    {
      header: "backlog zero ms",
      of: (r) => r.openLoop.backlogZeroMs ?? Infinity,
      digits: 1,
    },
  ];
  const cell = (value: number, column: typeof columns[number]) =>
    column.drain
      ? drainFigure(value, column.digits)
      : Number.isFinite(value)
      ? value.toFixed(column.digits)
      : "not within the wait";
  const rows = results.map((r, i) => [
    String(i + 1),
    ...columns.map((c) => cell(c.of(r), c)),
  ]);
  rows.push([
    "median",
    // A drain's median is of the rounds that had something to drain.
    ...columns.map((c) => cell(median(results.map(c.of).filter((v) => !Number.isNaN(v))), c)),
  ]);
  return formatTable([{ header: "round" }, ...columns.map((c) => ({ header: c.header }))], rows);
}

/**
 * A drain rate or ratio; "no backlog" for NaN, a round whose deliveries kept pace and left nothing
 * to drain.
 */
function drainFigure(value: number, digits: number, unit = ""): string {
  return Number.isNaN(value) ? "no backlog" : `${value.toFixed(digits)}${unit}`;
}

/** The deliveries, the CPU and the log, one line each. */
export function formatRelaySummary(result: RelayBenchmarkResult): string {
  const { delivery, service, bare, serviceLog } = result;
  const cpu = (target: ReceiverResult) =>
    `${target.name}: ${target.serverCpuCores.toFixed(2)} cores, ${
      target.cpuPerRequestUs.toFixed(0)
    } µs per request; core busy ${pct(target.serverCoreBusy)} (server) / ${
      pct(target.loadCoreBusy)
    } (wrk + sink)`;
  const problems = Object.entries(serviceLog.problems).map(([msg, n]) => `${msg} ${n}`);
  return [
    `- ${describeDelivery(delivery)}`,
    `- CPU in the measured run: ${cpu(bare)}; ${cpu(service)}; ${
      result.settings.engine === "postgresql"
        ? `PostgreSQL backends ${delivery.run.postgresCpuCores.toFixed(2)} cores`
        : "the embedded engine runs in the service's process"
    }, sink ${delivery.run.sinkCpuCores.toFixed(2)} cores`,
    `- service log: ${serviceLog.httpRequest} http_request, ${serviceLog.notificationReceived} ` +
    `notification_received, ${serviceLog.deliveryAttempt} delivery_attempt lines; warnings and ` +
    `errors: ${problems.length === 0 ? "none" : problems.join(", ")}`,
    `- ${result.settings.notifications} notifications signed in ${
      (result.setup.signMs / 1000).toFixed(1)
    } s (${Math.round(result.setup.meanBodyBytes)} bytes per body), ${
      result.service.wrapped === 0 ? "none sent twice" : `${result.service.wrapped} SENT TWICE`
    }`,
  ].join("\n");
}

// --- notifications -------------------------------------------------------------------------------

/** One `DID_RENEW` notification body as Apple posts it: a fresh UUID, transaction and renewal. */
async function signedNotificationBody(signer: StoreaSigner): Promise<string> {
  const transaction = signer.sampleTransaction({ transactionReason: "RENEWAL" });
  const renewalInfo = signer.sampleRenewalInfo({
    originalTransactionId: transaction.originalTransactionId,
    productId: transaction.productId,
  });
  const payload = await signer.notificationPayload({
    notificationType: "DID_RENEW",
    transaction,
    renewalInfo,
    status: 1,
  });
  return JSON.stringify({ signedPayload: await signer.signNotification(payload) });
}

/**
 * Signs `settings.notifications` bodies and writes them one per line to `${prefix}${t}.txt`,
 * notification `i` to file `i % threads`: each wrk thread reads only its own file.
 */
async function writeNotificationBodies(
  signer: StoreaSigner,
  settings: RelaySettings,
  prefix: string,
): Promise<{ signMs: number; meanBodyBytes: number }> {
  const started = performance.now();
  const threads = settings.threads;
  for (let t = 0; t < threads; t++) await Deno.writeTextFile(`${prefix}${t}.txt`, "");
  let bytes = 0;
  for (let first = 0; first < settings.notifications; first += SIGNING_BATCH) {
    const size = Math.min(SIGNING_BATCH, settings.notifications - first);
    const bodies = await Promise.all(
      Array.from({ length: size }, () => signedNotificationBody(signer)),
    );
    const lines: string[] = Array.from({ length: threads }, () => "");
    bodies.forEach((body, i) => {
      lines[(first + i) % threads] += `${body}\n`;
      bytes += body.length;
    });
    for (let t = 0; t < threads; t++) {
      await Deno.writeTextFile(`${prefix}${t}.txt`, lines[t], { append: true });
    }
  }
  return {
    signMs: performance.now() - started,
    meanBodyBytes: bytes / settings.notifications,
  };
}

// --- load ----------------------------------------------------------------------------------------

/** What every wrk run of either server needs. */
interface LoadSpec {
  settings: RelaySettings;
  script: string;
  path: string;
  bodiesPrefix: string;
}

/** One wrk run, with what the script checked. */
type LoadRun = WrkFigures & CheckedAnswers;

/**
 * The wrk script. Thread `t` of `T` reads its own bodies file, `bodies-t.txt` (line `k` is
 * notification `t + k*T`), on its first request, so reading it delays its first request and not
 * the start of the other thread; it then sends notifications `base + t, base + t + T, ...`.
 * Past the last notification it wraps around and counts the reuse. It checks every answer
 * (status 200 with the receipt marker) and reports the counts from `done`, with the first wrong
 * answer and where the next run must start.
 * Arguments after `--`: thread count, notification count, marker, bodies prefix, base, path.
 */
async function writeWrkScript(path: string): Promise<string> {
  const script = `-- Written by bench/relay.ts.
${WRK_CHECKED_ANSWERS_LUA}
function init(args)
  step = tonumber(args[1])
  count = tonumber(args[2])
  marker = args[3]
  bodies_path = args[4] .. first .. ".txt"
  index = tonumber(args[5]) + first
  target = args[6]
  headers = { ["content-type"] = "application/json" }
  reset_checks()
end

local bodies = nil

local function load_bodies()
  bodies = {}
  for line in io.lines(bodies_path) do
    bodies[#bodies + 1] = line
  end
  if #bodies * step ~= count then
    error(string.format("%s holds %d bodies, expected %d", bodies_path, #bodies, count / step))
  end
end

function request()
  if bodies == nil then load_bodies() end
  if index >= count then wrapped = wrapped + 1 end
  local body = bodies[math.floor((index % count) / step) + 1]
  index = index + step
  return wrk.format("POST", target, headers, body)
end
`;
  await Deno.writeTextFile(path, script);
  return path;
}

/** One wrk run from notification `base` on. */
async function runLoad(
  url: string,
  spec: LoadSpec,
  seconds: number,
  base: number,
): Promise<LoadRun> {
  const { settings } = spec;
  const text = await runWrk(url, settings, {
    seconds,
    latency: true,
    script: spec.script,
    scriptArgs: [
      String(settings.threads),
      String(settings.notifications),
      RECEIPT_MARKER,
      spec.bodiesPrefix,
      String(base),
      spec.path,
    ],
  });
  return { ...parseWrk(text), ...parseCheckedAnswers(text) };
}

/** The measured run, with the server's CPU time, RSS samples and the cores' use. */
function measureRun(
  server: Server,
  spec: LoadSpec,
  base: number,
): Promise<LoadMeasurement<LoadRun>> {
  const { settings } = spec;
  return measureLoad(() => runLoad(server.url, spec, settings.durationSeconds, base), {
    pids: [server.pid],
    cores: settings,
  });
}

function receiverResult(
  name: string,
  settings: RelaySettings,
  warmup: LoadRun,
  measured: LoadMeasurement<LoadRun>,
): ReceiverResult {
  const timed = measured.load;
  const [serverCpuSeconds] = measured.cpuSeconds;
  return {
    name,
    requestsPerSecond: timed.requestsPerSecond,
    p50Ms: timed.p50Ms,
    p99Ms: timed.p99Ms,
    requests: timed.requests,
    non2xx: timed.non2xx,
    socketErrors: timed.socketErrors,
    checkedGood: timed.checkedGood,
    checkedBad: timed.checkedBad,
    warmupBad: warmup.checkedBad + warmup.non2xx + warmup.socketErrors,
    wrapped: warmup.wrapped + timed.wrapped,
    firstWrong: warmup.firstWrong ?? timed.firstWrong,
    peakRssMb: measured.peakRssMb,
    hwmMb: measured.hwmMb,
    rssSamplesMb: measured.rssSamplesMb,
    serverCpuCores: serverCpuSeconds / settings.durationSeconds,
    cpuPerRequestUs: timed.requests > 0 ? serverCpuSeconds / timed.requests * 1e6 : NaN,
    serverCoreBusy: measured.busy.serverCore,
    loadCoreBusy: measured.busy.loadCore,
  };
}

function describeReceiver(result: ReceiverResult, settings: RelaySettings): string {
  return `${result.name}: ${result.requestsPerSecond.toFixed(0)} req/s, p50 ${result.p50Ms} ms, ` +
    `p99 ${result.p99Ms} ms, peak RSS ${result.peakRssMb.toFixed(1)} MB, server CPU ${
      result.serverCpuCores.toFixed(2)
    } cores (${result.cpuPerRequestUs.toFixed(0)} µs per request), core ${settings.serverCore} ${
      pct(result.serverCoreBusy)
    } busy, core ${settings.loadCore} ${pct(result.loadCoreBusy)} busy; ${result.checkedGood} ` +
    `right, ${result.checkedBad} wrong, ${result.non2xx} non-2xx, ${result.socketErrors} socket ` +
    `errors${result.firstWrong === null ? "" : `; first wrong answer: ${result.firstWrong}`}`;
}

// --- servers -------------------------------------------------------------------------------------

/** POSTs in flight in the signed-POST loop: the service's default `DELIVERY_CONCURRENCY`. */
const POST_LOOP_IN_FLIGHT = Number(
  CONFIG_VARIABLES.find((variable) => variable.name === "DELIVERY_CONCURRENCY")!.default,
);

/** Runs bench/signed_post_loop.ts on the service's core for as long as the measured run. */
async function runSignedPostLoop(
  tmp: string,
  settings: RelaySettings,
  target: { url: string; secret: string; payload: string; client: PostLoopClient },
): Promise<SignedPostLoopResult> {
  const bodyFile = `${tmp}/post-loop-body.json`;
  await Deno.writeTextFile(bodyFile, target.payload);
  const config = {
    url: target.url,
    secret: target.secret,
    bodyFile,
    seconds: settings.durationSeconds,
    inFlight: POST_LOOP_IN_FLIGHT,
    client: target.client,
  };
  return await runPinnedForJson("the signed-POST loop", settings.serverCore, [
    Deno.execPath(),
    "run",
    "--allow-net=127.0.0.1",
    `--allow-read=${tmp}`,
    new URL("./signed_post_loop.ts", import.meta.url).pathname,
    JSON.stringify(config),
  ]) as SignedPostLoopResult;
}

/** Starts the sink (this module, `sink`) on the load core; it prints its port once listening. */
async function startSink(tmp: string, settings: RelaySettings, secret: string): Promise<Server> {
  const sink = spawnPinned({
    core: settings.loadCore,
    args: [
      "run",
      "--allow-net=127.0.0.1",
      "--allow-env=SINK_SECRET",
      import.meta.filename!,
      "sink",
    ],
    env: { SINK_SECRET: secret },
    stdoutPath: `${tmp}/sink.out`,
    stderrPath: `${tmp}/sink.err`,
  });
  const line = await waitForLine(sink, (text) => text.startsWith('{"listening"'));
  sink.url = `http://127.0.0.1:${JSON.parse(line).port}`;
  return sink;
}

/**
 * The callback sink: answers every delivery 200 at once, counting those whose
 * `X-Service-Signature` verifies with `secret` and their distinct event ids; `GET /stats` returns
 * the {@linkcode SinkStats}. It keeps the event ids only, not the bodies.
 */
function serveSink(secret: string): void {
  const stats: SinkStats = {
    received: 0,
    valid: 0,
    invalid: 0,
    distinct: 0,
    duplicates: 0,
    firstAt: 0,
    lastAt: 0,
  };
  const seen = new Set<string>();
  const headers = { "content-type": "application/json" };
  Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: ({ port }) => console.log(JSON.stringify({ listening: true, port })),
  }, async (request) => {
    const path = new URL(request.url).pathname;
    if (request.method === "GET" && path === "/stats") return Response.json(stats);
    if (request.method !== "POST" || path !== SINK_PATH) return new Response(null, { status: 404 });
    const body = await request.text();
    const now = Date.now();
    stats.received++;
    if (stats.firstAt === 0) stats.firstAt = now;
    stats.lastAt = now;
    // Answered 200 either way: a refusal would only be retried; the bench reports the count.
    if (!verifySignature(secret, request.headers.get("x-service-signature"), body)) {
      stats.invalid++;
    } else {
      stats.valid++;
      const eventId = request.headers.get("x-service-event-id") ?? "";
      if (seen.has(eventId)) {
        stats.duplicates++;
      } else {
        seen.add(eventId);
        stats.distinct++;
      }
    }
    return new Response('{"ok":true}', { headers });
  });
}

async function sinkStats(url: string): Promise<SinkStats> {
  const response = await fetch(`${url}/stats`);
  if (!response.ok) throw new Error(`the sink answered ${response.status}`);
  return await response.json();
}

// --- deliveries ----------------------------------------------------------------------------------

/** The processes whose CPU time a window of the service's run is charged with. */
interface RelayPids {
  service: number;
  sink: number;
  /** The database's backends serving the service. */
  postgres: number[];
}

/** The queue's and the sink's counters at one moment, with the CPU seconds used so far. */
interface RelayCounters {
  at: number;
  queue: QueueCounts;
  sink: SinkStats;
  cpuSeconds: { service: number; sink: number; postgres: number[] };
}

async function relayCounters(
  sql: postgres.Sql,
  sinkUrl: string,
  pids: RelayPids,
): Promise<RelayCounters> {
  // A backend that has closed since it was listed reads 0 seconds; cpuBetween then counts it 0.
  const [service, sink, ...postgres] = await Promise.all(
    [pids.service, pids.sink, ...pids.postgres].map((pid) => cpuSeconds(pid).catch(() => 0)),
  );
  return {
    at: Date.now(),
    queue: await queueCounts(sql),
    sink: await sinkStats(sinkUrl),
    cpuSeconds: { service, sink, postgres },
  };
}

/** CPU seconds each process used between two readings (a backend gone meanwhile counts 0). */
function cpuBetween(before: RelayCounters, after: RelayCounters) {
  const a = before.cpuSeconds;
  const b = after.cpuSeconds;
  return {
    service: b.service - a.service,
    sink: b.sink - a.sink,
    postgres: b.postgres.reduce((sum, s, i) => sum + Math.max(0, s - a.postgres[i]), 0),
  };
}

interface QueueCounts {
  events: number;
  delivered: number;
  pending: number;
  failed: number;
  attempts: number;
  failedAttempts: number;
}

async function queueCounts(sql: postgres.Sql): Promise<QueueCounts> {
  const [row] = await sql`
    SELECT (SELECT count(*) FROM events)::int AS events,
           (SELECT count(*) FROM deliveries WHERE status = 'delivered')::int AS delivered,
           (SELECT count(*) FROM deliveries WHERE status = 'pending')::int AS pending,
           (SELECT count(*) FROM deliveries WHERE status = 'failed')::int AS failed,
           (SELECT count(*) FROM delivery_attempts)::int AS attempts,
           (SELECT count(*) FROM delivery_attempts
            WHERE response_code IS NULL OR response_code NOT BETWEEN 200 AND 299)::int
             AS failed_attempts`;
  return {
    events: row.events,
    delivered: row.delivered,
    pending: row.pending,
    failed: row.failed,
    attempts: row.attempts,
    failedAttempts: row.failed_attempts,
  };
}

/** Time from receipt to the delivered attempt over delivered rows (received after `since`), ms. */
async function queueLag(
  sql: postgres.Sql,
  since: Date = new Date(0),
): Promise<{ p50Ms: number; p99Ms: number; maxMs: number }> {
  const [row] = await sql`
    WITH lag AS (
      SELECT extract(epoch FROM d.delivered_at - e.received_at) * 1000 AS ms
      FROM deliveries d JOIN events e ON e.id = d.event_id
      WHERE d.status = 'delivered' AND e.received_at > ${since}
    )
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
           max(ms) AS max
    FROM lag`;
  return { p50Ms: Number(row.p50), p99Ms: Number(row.p99), maxMs: Number(row.max) };
}

/**
 * The open-loop phase: signs fresh notifications, sends them to the service at `rate` per second
 * at fixed times (`bench/open_loop.mjs` under Node on the load core), then times how long the
 * backlog takes to reach zero after the last answer and reads the phase's receipt-to-delivery.
 */
async function measureOpenLoop(
  phase: {
    signer: StoreaSigner;
    settings: RelaySettings;
    tmp: string;
    sql: postgres.Sql;
    sinkUrl: string;
    url: string;
    rate: number;
  },
  progress: Progress,
): Promise<RelayOpenLoop> {
  const { signer, settings, sql, rate } = phase;
  const count = Math.ceil(rate * (OPEN_LOOP_WARMUP_SECONDS + OPEN_LOOP_SECONDS)) + 1;
  const bodiesFile = `${phase.tmp}/open-loop-bodies.txt`;
  const lines: string[] = [];
  for (let first = 0; first < count; first += SIGNING_BATCH) {
    const size = Math.min(SIGNING_BATCH, count - first);
    lines.push(
      ...await Promise.all(Array.from({ length: size }, () => signedNotificationBody(signer))),
    );
  }
  await Deno.writeTextFile(bodiesFile, lines.join("\n") + "\n");
  const [{ now: since }] = await sql`SELECT now() AS now`;
  const [{ n: eventsBefore }] = await sql`SELECT count(*)::int AS n FROM events`;
  const atSinkBefore = (await sinkStats(phase.sinkUrl)).valid;
  progress(
    `open loop: ${rate} notifications/s for ${OPEN_LOOP_WARMUP_SECONDS} s, then ` +
      `${OPEN_LOOP_SECONDS} s measured (${count} signed)`,
  );
  const config = {
    url: phase.url,
    headers: {},
    bodiesFile,
    marker: RECEIPT_MARKER,
    rate,
    warmupSeconds: OPEN_LOOP_WARMUP_SECONDS,
    seconds: OPEN_LOOP_SECONDS,
    connections: OPEN_LOOP_CONNECTIONS,
  };
  const figures = await runOpenLoopGenerator(settings.loadCore, config) as {
    requests: number;
    good: number;
    bad: number;
    firstWrong: string | null;
    p50Ms: number;
    p99Ms: number;
    maxMs: number;
    sendLagP99Ms: number;
  };
  const answeredAt = performance.now();
  let backlogZeroMs: number | null = null;
  const deadline = answeredAt + settings.drainSeconds * 1000;
  while (performance.now() < deadline) {
    const [{ n }] = await sql`SELECT count(*)::int AS n FROM deliveries WHERE status = 'pending'`;
    if (n === 0) {
      backlogZeroMs = performance.now() - answeredAt;
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const [{ events, delivered }] = await sql`
    SELECT count(*)::int AS events,
           (count(*) FILTER (WHERE d.status = 'delivered'))::int AS delivered
    FROM events e JOIN deliveries d ON d.event_id = e.id
    WHERE e.received_at > ${since}`;
  const result: RelayOpenLoop = {
    rate,
    seconds: OPEN_LOOP_SECONDS,
    requests: figures.requests,
    good: figures.good,
    bad: figures.bad,
    firstWrong: figures.firstWrong,
    receiverP50Ms: figures.p50Ms,
    receiverP99Ms: figures.p99Ms,
    receiverMaxMs: figures.maxMs,
    sendLagP99Ms: figures.sendLagP99Ms,
    lag: await queueLag(sql, since),
    backlogZeroMs,
    events,
    delivered,
    atSink: (await sinkStats(phase.sinkUrl)).valid - atSinkBefore,
  };
  progress(
    `open loop: receiver p99 ${result.receiverP99Ms.toFixed(1)} ms, receipt to delivery p99 ` +
      `${result.lag.p99Ms.toFixed(1)} ms, backlog zero ${
        backlogZeroMs === null ? "not reached" : `${backlogZeroMs.toFixed(0)} ms`
      } after the last answer; ${events} events (${eventsBefore} before)`,
  );
  return result;
}

/** Polls the queue until no delivery is pending, or `seconds` go by; says which. */
async function waitForDeliveries(sql: postgres.Sql, seconds: number): Promise<boolean> {
  const deadline = Date.now() + seconds * 1000;
  while (true) {
    const counts = await queueCounts(sql);
    if (counts.pending === 0 && counts.delivered + counts.failed >= counts.events) return true;
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

function deliveryResult(readings: {
  /** Just before and just after the measured run's wrk, and once the deliveries were done. */
  before: RelayCounters;
  after: RelayCounters;
  end: RelayCounters;
  complete: boolean;
  lag: DeliveryResult["lag"];
  answeredNew: number;
}): DeliveryResult {
  const { before, after, end } = readings;
  const seconds = (after.at - before.at) / 1000;
  const runCpu = cpuBetween(before, after);
  const drainCpu = cpuBetween(after, end);
  // From the end of wrk to the last delivery's arrival, when there was any backlog.
  const drainSeconds = Math.max(0, end.sink.lastAt - after.at) / 1000;
  const drained = end.sink.valid - after.sink.valid;
  const span = (end.sink.lastAt - end.sink.firstAt) / 1000;
  return {
    accepted: end.queue.events,
    answeredNew: readings.answeredNew,
    delivered: end.queue.delivered,
    pending: end.queue.pending,
    failed: end.queue.failed,
    attempts: end.queue.attempts,
    failedAttempts: end.queue.failedAttempts,
    sink: end.sink,
    lag: readings.lag,
    run: {
      seconds,
      accepted: after.queue.events - before.queue.events,
      acceptedPerSecond: (after.queue.events - before.queue.events) / seconds,
      delivered: after.sink.valid - before.sink.valid,
      deliveredPerSecond: (after.sink.valid - before.sink.valid) / seconds,
      backlogAtStart: before.queue.events - before.queue.delivered,
      backlogAtEnd: after.queue.events - after.queue.delivered,
      sinkCpuCores: runCpu.sink / seconds,
      postgresCpuCores: runCpu.postgres / seconds,
    },
    drain: {
      complete: readings.complete,
      seconds: drainSeconds,
      deliveries: drained,
      // No rate for nothing drained: the backlog the queue still showed had reached the sink.
      perSecond: drained > 0 && drainSeconds > 0 ? drained / drainSeconds : NaN,
      serviceCpuUsPerDelivery: drained > 0 ? drainCpu.service / drained * 1e6 : NaN,
      postgresCpuUsPerDelivery: drained > 0 ? drainCpu.postgres / drained * 1e6 : NaN,
    },
    overallPerSecond: span > 0 ? end.sink.distinct / span : NaN,
    lostRows: end.queue.events - end.queue.delivered,
    lostAtSink: end.queue.events - end.sink.distinct,
  };
}

function describeDelivery(d: DeliveryResult): string {
  const lost = d.lostRows === 0 && d.lostAtSink === 0
    ? "none lost"
    : `LOST: ${d.lostRows} not delivered in the database, ${d.lostAtSink} never reached the sink`;
  return [
    `deliveries: ${d.accepted} accepted (${d.answeredNew} receipts checked by wrk), ` +
    `${d.delivered} delivered rows (${d.pending} pending, ${d.failed} failed), ${d.attempts} ` +
    `attempts (${d.failedAttempts} without a 2xx), sink ${d.sink.valid} valid deliveries of ` +
    `${d.sink.distinct} distinct events (${d.sink.duplicates} duplicates, ${d.sink.invalid} ` +
    `bad signatures): ${lost}.`,
    `Measured run (${d.run.seconds.toFixed(1)} s): ${d.run.acceptedPerSecond.toFixed(0)} ` +
    `accepted/s, ${d.run.deliveredPerSecond.toFixed(0)} delivered/s, backlog ` +
    `${d.run.backlogAtStart} -> ${d.run.backlogAtEnd}.`,
    `Drain: ${d.drain.deliveries} more in ${d.drain.seconds.toFixed(1)} s (` +
    `${d.drain.perSecond.toFixed(0)}/s, service ${d.drain.serviceCpuUsPerDelivery.toFixed(0)} µs ` +
    `and PostgreSQL's backends ${d.drain.postgresCpuUsPerDelivery.toFixed(0)} µs CPU per ` +
    `delivery)` +
    `${d.drain.complete ? "" : ", NOT COMPLETE"}.`,
    `Overall ${d.overallPerSecond.toFixed(0)} deliveries/s, first to last; receipt to delivery ` +
    `p50 ${fixed(d.lag.p50Ms / 1000)} s, p99 ${fixed(d.lag.p99Ms / 1000)} s, max ` +
    `${fixed(d.lag.maxMs / 1000)} s.`,
  ].join(" ");
}

function fixed(seconds: number): string {
  return seconds.toFixed(seconds < 10 ? 2 : 1);
}

/**
 * The bench's connection to the service's queue: the temporary PostgreSQL database, or the
 * embedded engine the service shares on its data directory's socket (one session with the
 * service's own connections, so no named statements; see src/db/embedded/server.ts).
 */
function connectQueue(databaseUrl: string | null, dataDir: string): postgres.Sql {
  if (databaseUrl) return postgres(databaseUrl, { max: 1, onnotice: () => {} });
  return sharedEmbeddedClient(dataDir);
}

/** How the tables name the engine. */
export function engineName(engine: RelayEngine): string {
  return engine === "postgresql" ? "PostgreSQL" : "embedded engine";
}

/** The backends of the database other than the bench's own connection: the service's. */
async function postgresBackends(sql: postgres.Sql): Promise<number[]> {
  const rows = await sql`
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()`;
  return rows.map((row) => Number(row.pid));
}

/**
 * Warnings the bench's own configuration causes at boot, which are not problems of the run: its
 * test root certificates (`STOREA_ROOT_CERTS`) and its callback sink on loopback over http.
 */
const EXPECTED_WARNINGS = new Set(["storea_root_certs_replace_pin", "callback_checks_relaxed"]);

/** Counts the service's log lines by `msg`, and its unexpected warnings and errors. */
async function scanServiceLog(path: string): Promise<ServiceLog> {
  const scan: ServiceLog = {
    httpRequest: 0,
    notificationReceived: 0,
    deliveryAttempt: 0,
    problems: {},
    problemLines: [],
  };
  const head = /^\{"ts":"[^"]*","level":"(\w+)","msg":"([^"]*)"/;
  let carry = "";
  const count = (line: string) => {
    const match = head.exec(line);
    if (!match) return;
    const [, level, msg] = match;
    if (msg === "http_request") scan.httpRequest++;
    else if (msg === "notification_received") scan.notificationReceived++;
    else if (msg === "delivery_attempt") scan.deliveryAttempt++;
    const problem = level === "error" || level === "fatal" ||
      (level === "warn" && !EXPECTED_WARNINGS.has(msg));
    if (problem) {
      scan.problems[msg] = (scan.problems[msg] ?? 0) + 1;
      if (scan.problemLines.length < 5) scan.problemLines.push(line);
    }
  };
  using file = await Deno.open(path);
  const textDecoder = new TextDecoder();
  for await (const chunk of file.readable) {
    const lines = (carry + textDecoder.decode(chunk, { stream: true })).split("\n");
    carry = lines.pop()!;
    lines.forEach(count);
  }
  count(carry);
  return scan;
}

/** Every reason the run does not count: wrong answers, reuse, lost or unsigned deliveries. */
function problemsOf(result: RelayBenchmarkResult): string[] {
  const problems: string[] = [];
  for (const target of [result.bare, result.service]) {
    if (
      target.checkedBad > 0 || target.non2xx > 0 || target.socketErrors > 0 ||
      target.warmupBad > 0 || target.checkedGood < target.requests
    ) {
      problems.push(
        `${target.name}: ${target.checkedBad} wrong answers, ${target.non2xx} non-2xx, ` +
          `${target.socketErrors} socket errors, ${target.checkedGood} of ${target.requests} ` +
          `right in the measured run; ${target.warmupBad} wrong in the warm-up` +
          (target.firstWrong === null ? "" : `; first wrong answer: ${target.firstWrong}`),
      );
    }
  }
  const open = result.openLoop;
  if (open.bad > 0 || open.good < open.requests) {
    problems.push(
      `open loop: ${open.bad} wrong answers, ${open.good} of ${open.requests} right` +
        (open.firstWrong === null ? "" : `; first wrong answer: ${open.firstWrong}`),
    );
  }
  if (open.delivered < open.events || open.atSink !== open.events) {
    problems.push(
      `open loop: ${open.events} events, ${open.delivered} delivered rows, ${open.atSink} valid ` +
        "deliveries at the sink",
    );
  }
  if (result.service.wrapped > 0) {
    problems.push(
      `${result.service.wrapped} requests reused a notification: raise --notifications ` +
        `(${result.settings.notifications} were too few for this run)`,
    );
  }
  if (result.serviceLog.httpRequest < result.service.requests) {
    problems.push(
      `the service wrote ${result.serviceLog.httpRequest} http_request lines for ` +
        `${result.service.requests} measured requests`,
    );
  }
  const logged = Object.entries(result.serviceLog.problems);
  if (logged.length > 0) {
    problems.push(
      `the service logged ${logged.map(([msg, n]) => `${msg} x${n}`).join(", ")}; first: ` +
        result.serviceLog.problemLines[0],
    );
  }
  const { delivery } = result;
  if (!delivery.drain.complete) {
    problems.push(`deliveries still pending ${result.settings.drainSeconds} s after the run`);
  }
  if (delivery.lostRows !== 0 || delivery.lostAtSink !== 0) {
    problems.push(
      `lost deliveries: ${delivery.accepted} accepted, ${delivery.delivered} delivered rows, ` +
        `${delivery.sink.distinct} distinct events at the sink`,
    );
  }
  const baseline = result.ingestBaseline;
  if (baseline.eventsAdded !== baseline.transactions) {
    problems.push(
      `raw ${engineName(result.settings.engine)}: ${baseline.transactions} transactions added ` +
        `${baseline.eventsAdded} events`,
    );
  }
  for (
    const [loop, atSink] of [
      [result.postLoop, result.postLoopAtSink],
      [result.postLoopFloor, result.postLoopFloorAtSink],
    ] as const
  ) {
    if (loop.failed > 0 || atSink !== loop.requests) {
      problems.push(
        `signed-POST loop (${loop.client}): ${loop.requests} answered 2xx, ${loop.failed} ` +
          `failed, ${atSink} valid at the sink`,
      );
    }
  }
  if (delivery.sink.invalid > 0) {
    problems.push(`${delivery.sink.invalid} deliveries reached the sink with a bad signature`);
  }
  return problems;
}

// --- tenant -------------------------------------------------------------------------------------

/** Migrates, then makes a tenant with the callback and store A credentials through the CLI. */
async function createTenant(
  env: Record<string, string>,
  tenant: { storeaKeyFile: string; callbackUrl: string; secret: string },
): Promise<string> {
  await runCli(["migrate"], env);
  const created = await runCli([
    "tenant",
    "create",
    "--name",
    "Relay bench tenant",
    "--callback-url",
    tenant.callbackUrl,
    "--webhook-secret",
    tenant.secret,
  ], env);
  const tenantId = String(created.id);
  await setStoreaCredentials(env, { tenantId, keyFile: tenant.storeaKeyFile });
  return tenantId;
}

// --- main ----------------------------------------------------------------------------------------

function engineFlag(value: string | undefined): RelayEngine | undefined {
  if (value === undefined || value === "postgresql" || value === "embedded") return value;
  throw new Error(`--engine: postgresql or embedded, not ${value}`);
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      ...LOAD_FLAGS,
      notifications: { type: "string" },
      drain: { type: "string" },
      rounds: { type: "string" },
      engine: { type: "string" },
    },
  });
  const print = (result: RelayBenchmarkResult) => {
    console.log("## POST /v1/webhooks/storea/:tenantId\n");
    console.log(formatRelayTable(result));
    console.log();
    console.log(formatRelayDeliveryTable(result));
    console.log();
    console.log(formatRelaySummary(result));
    if (values.json) console.log(JSON.stringify(result, null, 2));
  };
  if (positionals[0] === "sink") {
    serveSink(Deno.env.get("SINK_SECRET") ?? "");
  } else {
    try {
      const results = await runRelayRounds({
        ...loadOptionsFromFlags(values),
        notifications: numberFlag(values.notifications),
        drainSeconds: numberFlag(values.drain),
        engine: engineFlag(values.engine),
      }, numberFlag(values.rounds) ?? 1);
      print(results.at(-1)!);
      if (results.length > 1) console.log(`\n${formatRelayRoundsTable(results)}`);
    } catch (error) {
      if (error instanceof RelayRunError) print(error.result);
      exitWithError(error);
    }
  }
}
