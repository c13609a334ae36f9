/**
 * What refusing forged store A certificate chains costs the service, against what refusing garbage
 * signatures costs it, in the same run (docs/architecture.md, "The certificate chain check").
 *
 * The service runs as in production on one core, trusting Apple's root by its built-in pin, with a
 * tenant of the real Sandbox notifications' app. One genuine notification first verifies Apple's
 * chain. Then two floods from wrk, each a measured run after a warm-up, in three rounds whose order
 * alternates:
 *
 * - **garbage**: Apple's real header (verified, so cached) and payload under random signatures, each
 *   refused 401: the floor of what a receiver's refusal costs, one ES256 check;
 * - **forged**: Apple's payload under 4,000 distinct chains, each a leaf minted as an attacker would
 *   (its own key, Apple's marker, Apple's intermediate named byte for byte as its issuer) followed by
 *   Apple's real intermediate and root, its JWS signed with that leaf: each verifies with its leaf,
 *   so each would cost a certificate check. Refused 401 or 429.
 *
 * During each forged flood a genuine notification (one of the real Sandbox ones) is posted every
 * 250 ms and must be answered 200; the slowest answer is reported. The goal: forged chains refused
 * at no less than half the garbage rate (median of the rounds' ratios), and every genuine
 * notification answered 200 within a second.
 *
 *     deno task bench:forged [--duration S] [--warmup S] [--rounds N] [--json] [--keep-temp]
 *
 * Needs `wrk` and `taskset`; no database server (the embedded engine: refusals touch no database).
 * @module
 */
import * as pkijs from "pkijs";
import {
  beginRun,
  cpuSeconds,
  formatTable,
  type LoadOptions,
  type LoadSettings,
  loadSettings,
  type Machine,
  median,
  parseWrk,
  productionServiceEnv,
  ROOT,
  runCli,
  runLoadBenchmarkCommand,
  runWrk,
  startService,
  stop,
  STOREA_ISSUER_ID,
  STOREA_KEY_ID,
  writeProgress,
  writeStoreaKey,
} from "./support.ts";
import { forgeStoreaLeaf } from "../simulators/storea_pki.ts";

const VECTORS = `${ROOT}/tests/fixtures/storea/real-sandbox/`;
/** Distinct forged chains; wrk cycles through them. */
const FORGED_CHAINS = 4_000;
/** How often a genuine notification is posted during a forged flood. */
const GENUINE_EVERY_MS = 250;
/** Rounds of both floods, each with its own ratio: the goal is judged on their median. */
const DEFAULT_ROUNDS = 3;
/** The goal: forged chains refused at this fraction of the garbage rate at least. */
const GOAL_RATIO = 0.5;
/** The goal: a genuine notification during the flood is answered 200 within this. */
const GOAL_GENUINE_MS = 1_000;

/** Options of {@linkcode runForgedChainsBenchmark}. */
export interface ForgedChainsOptions extends LoadOptions {
  rounds?: number;
}

/** One flood's figures. */
export interface FloodResult {
  requestsPerSecond: number;
  p99Ms: number;
  /** Service CPU per request, in µs. */
  cpuUsPerRequest: number;
  /** Answers by status. */
  statuses: Record<string, number>;
}

/** One round: both floods, and the genuine notifications sent during the forged one. */
export interface ForgedChainsRound {
  garbage: FloodResult;
  forged: FloodResult;
  ratio: number;
  /** Latency of each genuine notification posted during the forged flood, ms. */
  genuineMs: number[];
  /** Genuine notifications answered other than 200. */
  genuineRefused: number;
}

/** What {@linkcode runForgedChainsBenchmark} returns. */
export interface ForgedChainsResult {
  startedAt: string;
  machine: Machine;
  durationSeconds: number;
  warmupSeconds: number;
  forgedChains: number;
  rounds: ForgedChainsRound[];
  ratioMedian: number;
  genuineMaxMs: number;
  genuineRefused: number;
}

/** Runs the benchmark; see the module's description. */
export async function runForgedChainsBenchmark(
  options: ForgedChainsOptions = {},
): Promise<ForgedChainsResult> {
  const progress = options.progress ?? writeProgress;
  const settings = loadSettings({
    ...options,
    durationSeconds: options.durationSeconds ?? 8,
    warmupSeconds: options.warmupSeconds ?? 2,
  });
  const roundCount = options.rounds ?? DEFAULT_ROUNDS;
  const { startedAt, machine } = await beginRun(settings, progress);
  const tmp = await Deno.makeTempDir({ prefix: "pr-bench-forged-" });
  try {
    const index = JSON.parse(await Deno.readTextFile(`${VECTORS}index.json`));
    const genuine: string[] = [];
    for (const entry of index) {
      genuine.push((await Deno.readTextFile(`${VECTORS}${entry.file}`)).trim());
    }
    const [header, payload] = genuine[0].split(".");
    const x5c = JSON.parse(
      new TextDecoder().decode(Uint8Array.fromBase64(header, { alphabet: "base64url" })),
    ).x5c as string[];

    progress(`minting ${FORGED_CHAINS} forged chains`);
    await writeBodies(`${tmp}/forged.txt`, await forgedBodies(x5c, payload, FORGED_CHAINS));
    await writeBodies(
      `${tmp}/garbage.txt`,
      Array.from({ length: FORGED_CHAINS }, () => body(`${header}.${payload}.${randomSig()}`)),
    );
    const script = await writeScript(`${tmp}/flood.lua`);

    // The vectors were signed in 2025: an age limit that reaches them.
    const env = await productionServiceEnv(tmp, { STOREA_NOTIFICATION_MAX_AGE: "36500d" });
    await runCli(["migrate"], env);
    const tenant = await runCli(["tenant", "create", "--name", "Forged chains"], env);
    const keyFile = await writeStoreaKey(`${tmp}/AuthKey_${STOREA_KEY_ID}.p8`);
    await runCli([
      "storea",
      "set-credentials",
      String(tenant.id),
      "--bundle-id",
      index[0].bundleId,
      "--key-id",
      STOREA_KEY_ID,
      "--issuer-id",
      STOREA_ISSUER_ID,
      "--private-key-file",
      keyFile,
    ], env);
    const service = await startService(`${tmp}/`, { core: settings.serverCore, env });
    const url = `${service.url}/v1/webhooks/storea/${tenant.id}`;
    try {
      const first = await post(url, genuine[0]);
      if (first.status !== 200) throw new Error(`the genuine notification got ${first.status}`);
      const rounds: ForgedChainsRound[] = [];
      let offset = 0;
      for (let round = 0; round < roundCount; round++) {
        const flood = async (kind: "garbage" | "forged") => {
          progress(`round ${round + 1}: ${kind}, warming up ${settings.warmupSeconds} s`);
          const bodies = `${tmp}/${kind}.txt`;
          await runFlood(url, settings, {
            script,
            bodies,
            seconds: settings.warmupSeconds,
            offset,
          });
          offset += 1_000;
          progress(`round ${round + 1}: ${kind}, measuring ${settings.durationSeconds} s`);
          const genuineRun = kind === "forged" ? sendGenuine(url, genuine.slice(1)) : null;
          const before = await cpuSeconds(service.pid);
          const text = await runFlood(url, settings, {
            script,
            bodies,
            seconds: settings.durationSeconds,
            offset,
          });
          const cpu = await cpuSeconds(service.pid) - before;
          const latencies = await genuineRun?.stop();
          offset += 1_000;
          return { flood: floodResult(text, cpu), latencies };
        };
        // Alternate which flood goes first, so that neither always meets a warmer process.
        const order = round % 2 === 0
          ? ["garbage", "forged"] as const
          : ["forged", "garbage"] as const;
        const results: Record<string, Awaited<ReturnType<typeof flood>>> = {};
        for (const kind of order) results[kind] = await flood(kind);
        const genuineRun = results.forged.latencies!;
        const result: ForgedChainsRound = {
          garbage: results.garbage.flood,
          forged: results.forged.flood,
          ratio: results.forged.flood.requestsPerSecond / results.garbage.flood.requestsPerSecond,
          genuineMs: genuineRun.latencies,
          genuineRefused: genuineRun.refused,
        };
        rounds.push(result);
        progress(describeRound(round, result));
      }
      const allGenuine = rounds.flatMap((round) => round.genuineMs);
      return {
        startedAt,
        machine,
        durationSeconds: settings.durationSeconds,
        warmupSeconds: settings.warmupSeconds,
        forgedChains: FORGED_CHAINS,
        rounds,
        ratioMedian: median(rounds.map((round) => round.ratio)),
        genuineMaxMs: Math.max(...allGenuine),
        genuineRefused: rounds.reduce((sum, round) => sum + round.genuineRefused, 0),
      };
    } finally {
      await stop(service);
    }
  } finally {
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true });
    else progress(`kept ${tmp}`);
  }
}

/**
 * `count` JWS of `payload` under distinct forged chains. Minting a leaf with pkijs takes tens of
 * milliseconds, so one leaf is minted and then given `count` serial numbers: each is a chain the
 * service has never seen, as a new leaf would be, signed with the leaf's key.
 */
async function forgedBodies(x5c: string[], payload: string, count: number): Promise<string[]> {
  const leaf = await forgeStoreaLeaf(Uint8Array.fromBase64(x5c[1]));
  const der = Uint8Array.fromBase64(leaf.x5c);
  const serial = pkijs.Certificate.fromBER(der).serialNumber.valueBlock.valueHexView;
  const at = indexOf(der, serial);
  const bodies: string[] = [];
  for (let i = 0; i < count; i++) {
    const copy = der.slice();
    new DataView(copy.buffer).setUint32(at + serial.length - 4, i);
    const header = base64url(
      new TextEncoder().encode(
        JSON.stringify({ alg: "ES256", x5c: [copy.toBase64(), x5c[1], x5c[2]] }),
      ),
    );
    const signature = await crypto.subtle.sign(
      { name: "ECDSA", hash: "SHA-256" },
      leaf.privateKey,
      new TextEncoder().encode(`${header}.${payload}`),
    );
    bodies.push(body(`${header}.${payload}.${base64url(new Uint8Array(signature))}`));
  }
  return bodies;
}

function indexOf(haystack: Uint8Array, needle: Uint8Array): number {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  throw new Error("the serial number is not in the certificate");
}

function base64url(bytes: Uint8Array): string {
  return bytes.toBase64({ alphabet: "base64url", omitPadding: true });
}

function randomSig(): string {
  return base64url(crypto.getRandomValues(new Uint8Array(64)));
}

function body(signedPayload: string): string {
  return JSON.stringify({ signedPayload });
}

async function writeBodies(path: string, bodies: string[]): Promise<void> {
  await Deno.writeTextFile(path, bodies.join("\n") + "\n");
}

async function post(url: string, signedPayload: string): Promise<{ status: number }> {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: body(signedPayload),
  });
  await response.body?.cancel();
  return { status: response.status };
}

/** Posts `notifications` in turn, one every GENUINE_EVERY_MS, until stopped. */
function sendGenuine(url: string, notifications: string[]) {
  let running = true;
  const latencies: number[] = [];
  let refused = 0;
  const done = (async () => {
    for (let i = 0; running; i++) {
      const started = performance.now();
      const answer = await post(url, notifications[i % notifications.length]);
      latencies.push(performance.now() - started);
      if (answer.status !== 200) refused++;
      await new Promise((resolve) => setTimeout(resolve, GENUINE_EVERY_MS));
    }
  })();
  return {
    async stop() {
      running = false;
      await done;
      return { latencies, refused };
    },
  };
}

/** A wrk script that cycles through a file of bodies and counts the answers by status. */
async function writeScript(path: string): Promise<string> {
  await Deno.writeTextFile(
    path,
    `-- Written by bench/forged_chains.ts.
local threads = {}
function setup(thread)
  thread:set("first", #threads)
  table.insert(threads, thread)
end
function init(args)
  bodies = {}
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  index = tonumber(args[2]) + first * 7919
  target = args[3]
  headers = { ["content-type"] = "application/json" }
  c200, c401, c429, cother = 0, 0, 0, 0
end
function request()
  index = index + 1
  return wrk.format("POST", target, headers, bodies[(index % #bodies) + 1])
end
function response(status, headers, body)
  if status == 200 then c200 = c200 + 1
  elseif status == 401 then c401 = c401 + 1
  elseif status == 429 then c429 = c429 + 1
  else cother = cother + 1 end
end
function done(summary, latency, requests)
  local totals = { 0, 0, 0, 0 }
  for _, thread in ipairs(threads) do
    totals[1] = totals[1] + thread:get("c200")
    totals[2] = totals[2] + thread:get("c401")
    totals[3] = totals[3] + thread:get("c429")
    totals[4] = totals[4] + thread:get("cother")
  end
  io.write(string.format("statuses: 200=%d 401=%d 429=%d other=%d\\n", totals[1], totals[2],
    totals[3], totals[4]))
end
`,
  );
  return path;
}

async function runFlood(
  url: string,
  settings: LoadSettings,
  flood: { script: string; bodies: string; seconds: number; offset: number },
): Promise<string> {
  const { script, bodies, seconds, offset } = flood;
  return await runWrk(url, settings, {
    seconds,
    latency: true,
    script,
    scriptArgs: [bodies, String(offset), new URL(url).pathname],
  });
}

function floodResult(text: string, cpu: number): FloodResult {
  const figures = parseWrk(text);
  const statuses: Record<string, number> = {};
  const line = /^statuses: (.*)$/m.exec(text)?.[1];
  if (line === undefined) throw new Error(`no status counts in wrk's output:\n${text}`);
  for (const [, status, count] of line.matchAll(/(\w+)=(\d+)/g)) {
    if (Number(count) > 0) statuses[status] = Number(count);
  }
  return {
    requestsPerSecond: figures.requestsPerSecond,
    p99Ms: figures.p99Ms,
    cpuUsPerRequest: (cpu * 1e6) / Math.max(1, figures.requests),
    statuses,
  };
}

function describeStatuses(statuses: Record<string, number>): string {
  return Object.entries(statuses).map(([status, count]) => `${count} × ${status}`).join(", ");
}

function describeRound(round: number, result: ForgedChainsRound): string {
  return `round ${round + 1}: garbage ${result.garbage.requestsPerSecond.toFixed(0)}/s ` +
    `(${result.garbage.cpuUsPerRequest.toFixed(0)} µs CPU each; ${
      describeStatuses(result.garbage.statuses)
    }), forged ${result.forged.requestsPerSecond.toFixed(0)}/s ` +
    `(${result.forged.cpuUsPerRequest.toFixed(0)} µs CPU each; ${
      describeStatuses(result.forged.statuses)
    }): ${
      result.ratio.toFixed(2)
    }x; genuine during the flood: ${result.genuineMs.length} sent, slowest ${
      Math.max(...result.genuineMs).toFixed(0)
    } ms, ${result.genuineRefused} not 200`;
}

/** The table of every round. */
export function formatForgedChainsTable(result: ForgedChainsResult): string {
  return formatTable(
    [
      { header: "round" },
      { header: "garbage, req/s", numeric: true },
      { header: "garbage, µs CPU/req", numeric: true },
      { header: "forged, req/s", numeric: true },
      { header: "forged, µs CPU/req", numeric: true },
      { header: "forged / garbage", numeric: true },
      { header: "forged answers" },
      { header: "genuine: sent, slowest", numeric: true },
    ],
    result.rounds.map((round, i) => [
      String(i + 1),
      round.garbage.requestsPerSecond.toFixed(0),
      round.garbage.cpuUsPerRequest.toFixed(0),
      round.forged.requestsPerSecond.toFixed(0),
      round.forged.cpuUsPerRequest.toFixed(0),
      `${round.ratio.toFixed(2)}x`,
      describeStatuses(round.forged.statuses),
      `${round.genuineMs.length}, ${Math.max(...round.genuineMs).toFixed(0)} ms`,
    ]),
  );
}

/** The goal lines. */
export function formatForgedChainsGoal(result: ForgedChainsResult): string {
  const ratioMet = result.ratioMedian >= GOAL_RATIO;
  const genuineMet = result.genuineRefused === 0 && result.genuineMaxMs <= GOAL_GENUINE_MS;
  return [
    `- Forged chains refused at ${result.ratioMedian.toFixed(2)}x the garbage rate (median of ` +
    `${result.rounds.length} rounds; goal at least ${GOAL_RATIO}x): ${
      ratioMet ? "met" : "NOT met"
    }.`,
    `- Genuine notifications during the floods: ${
      result.rounds.reduce((sum, round) => sum + round.genuineMs.length, 0)
    } sent, ${result.genuineRefused} not answered 200, slowest ${
      result.genuineMaxMs.toFixed(0)
    } ms (goal: all 200 within ${GOAL_GENUINE_MS} ms): ${genuineMet ? "met" : "NOT met"}.`,
  ].join("\n");
}

if (import.meta.main) {
  await runLoadBenchmarkCommand(runForgedChainsBenchmark, (result) => [
    formatForgedChainsTable(result),
    formatForgedChainsGoal(result),
  ]);
}
