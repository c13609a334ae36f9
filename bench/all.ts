/**
 * Every benchmark in one command: `GET /health`, verify for store A and store B, the store
 * gateway's endpoints beside verify (each against its bare proxy), store A JWS verification
 * against Apple's library, forged certificate chains, the notification relay and the
 * cold start, one after the other in this process (each starts and stops its own servers). It
 * prints each result's tables and a summary, then rewrites the generated tables of
 * `docs/benchmarks.md`: each stands between `<!-- bench:NAME:begin -->` and
 * `<!-- bench:NAME:end -->`, under a line that says when, at what commit, by what command and on
 * what machine it was measured. Nothing else in the page changes.
 *
 * Run it:
 *
 *     deno task bench [--duration S] [--warmup S]
 *                     [--only health,verify,gateway,jws,forged,relay,relay-embedded,cold-start]
 *                     [--runs N] [--no-write] [--json] [--keep-temp] [--doc PATH]
 *
 * `--duration` and `--warmup` set the length of every load benchmark's measured and warm-up runs
 * (by default each keeps its own: 10 s and 3 s, the gateway 4 s and 2 s, the relay 20 s and 5 s);
 * `--runs` the cold start's measured boots of each kind (5). `--only` runs some of the
 * benchmarks. `--no-write` prints the tables without touching the page; `--doc` writes another
 * page. A benchmark that fails is reported and its tables are left as they were; the others still
 * run and are written, and the command exits 1. It needs what the benchmarks need: `wrk`,
 * `taskset` and a PostgreSQL server (`BENCH_DATABASE_URL`).
 * @module
 */
import { parseArgs } from "node:util";
import {
  checkTools,
  type CoresBusy,
  describeHost,
  exitWithError,
  formatTable,
  type LoadOptions,
  median,
  numberFlag,
  type Progress,
  ROOT,
  writeProgress,
} from "./support.ts";
import { formatRunCaption, replaceSections } from "./report.ts";
import { formatHealthGoal, formatHealthTable, runHealthBenchmark } from "./health.ts";
import { formatVerifyGoal, formatVerifyTable, runVerifyBenchmark } from "./verify.ts";
import {
  formatGatewayGoal,
  formatGatewayRoundsTable,
  formatGatewayTable,
  runGatewayBenchmark,
} from "./gateway.ts";
import { formatJwsGoal, formatJwsTable, runJwsBenchmark } from "./storea_jws.ts";
import {
  formatForgedChainsGoal,
  formatForgedChainsTable,
  runForgedChainsBenchmark,
} from "./forged_chains.ts";
import {
  engineName,
  formatRelayDeliveryTable,
  formatRelayRoundsTable,
  formatRelaySummary,
  formatRelayTable,
  RelayRunError,
  runRelayRounds,
} from "./relay.ts";
import {
  formatColdStartGoal,
  formatColdStartSummary,
  formatColdStartTable,
  runColdStartBenchmark,
} from "./cold_start.ts";

/** The benchmarks, in the order they run. */
export const BENCHMARK_NAMES = [
  "health",
  "verify",
  "gateway",
  "jws",
  "forged",
  "relay",
  "relay-embedded",
  "cold-start",
] as const;

/** One of {@linkcode BENCHMARK_NAMES}. */
export type BenchmarkName = typeof BENCHMARK_NAMES[number];

/** Options of {@linkcode runAllBenchmarks}. */
export interface AllBenchmarksOptions {
  /** Length of every load benchmark's measured run, in seconds; each one's own by default. */
  durationSeconds?: number;
  /** Length of every load benchmark's warm-up run, in seconds; each one's own by default. */
  warmupSeconds?: number;
  /** The cold start's measured boots of each kind; 5 by default. */
  runs?: number;
  /** The benchmarks to run; all by default. */
  only?: readonly BenchmarkName[];
  /** Keep the benchmarks' temporary files. */
  keepTemp?: boolean;
  /** The command to name above each table; `deno task bench` by default. */
  command?: string;
  /** Where progress lines go (each prefixed with the benchmark's name); stderr by default. */
  progress?: Progress;
}

/** What one benchmark gave: its generated sections of the page and its summary rows. */
export interface BenchmarkOutcome {
  name: BenchmarkName;
  /** How long it took, in seconds. */
  seconds: number;
  /** Section name -> markdown (caption, table, goal lines), as written into the page. */
  sections: Record<string, string>;
  /** Its rows of the summary table: what, ours, baseline, ratio. */
  summary: string[][];
  /** Every figure it returned. */
  result: unknown;
}

/** A benchmark that did not finish or whose run does not count. */
export interface BenchmarkFailure {
  name: BenchmarkName;
  seconds: number;
  error: string;
}

/** What {@linkcode runAllBenchmarks} returns. */
export interface AllBenchmarksResult {
  startedAt: string;
  command: string;
  commit: string;
  /** e.g. `2 cores, 23.4 GiB, linux 6.18.0 x86_64, Deno 2.9.6, wrk 4.1.0`. */
  machine: string;
  outcomes: BenchmarkOutcome[];
  failures: BenchmarkFailure[];
}

/** The page's sections each benchmark writes. */
export const SECTIONS: Record<BenchmarkName, readonly string[]> = {
  health: ["health"],
  verify: ["verify-storea", "verify-storeb"],
  gateway: ["verify-gateway", "verify-gateway-rounds"],
  jws: ["jws"],
  forged: ["forged-chains"],
  relay: ["relay", "relay-deliveries", "relay-rounds"],
  "relay-embedded": ["relay-embedded", "relay-embedded-deliveries", "relay-embedded-rounds"],
  "cold-start": ["cold-start"],
};

/** The page the tables are written into, from the repository root. */
const DOC = "docs/benchmarks.md";

/** The relay's signed notifications last this many requests per second of its runs at least. */
const RELAY_NOTIFICATIONS_PER_SECOND = 2_880;
/** Rounds of the relay, each with its own baselines: its goals are judged on their medians. */
const RELAY_ROUNDS = 3;
/** The relay's own default number of notifications. */
const RELAY_NOTIFICATIONS = 72_000;

/** Runs the chosen benchmarks one after the other; a failure does not stop the others. */
export async function runAllBenchmarks(
  options: AllBenchmarksOptions = {},
): Promise<AllBenchmarksResult> {
  const only = options.only ?? BENCHMARK_NAMES;
  const progress = options.progress ?? writeProgress;
  const needsWrk = only.some((name) => name !== "jws" && name !== "cold-start");
  const wrk = needsWrk ? await checkTools() : null;
  const startedAt = new Date().toISOString();
  const machine = describeMachineLine(wrk);
  const commit = await describeCommit();
  const command = options.command ?? "deno task bench";
  const caption = (run: { startedAt: string; busyBefore?: CoresBusy }) =>
    formatRunCaption({ ...run, command, commit, machine });
  const load: LoadOptions = {
    durationSeconds: options.durationSeconds,
    warmupSeconds: options.warmupSeconds,
    keepTemp: options.keepTemp,
  };

  const outcomes: BenchmarkOutcome[] = [];
  const failures: BenchmarkFailure[] = [];
  for (const [index, name] of only.entries()) {
    const prefixed: Progress = (line) => progress(`[${name}] ${line}`);
    progress(`== ${name} (${index + 1} of ${only.length}) ==`);
    const started = performance.now();
    const seconds = () => (performance.now() - started) / 1000;
    try {
      const outcome = await runOne(name, { ...load, progress: prefixed }, options, caption);
      outcomes.push({ name, seconds: seconds(), ...outcome });
      progress(`== ${name}: done in ${seconds().toFixed(0)} s ==`);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      failures.push({ name, seconds: seconds(), error: message });
      progress(`== ${name}: FAILED after ${seconds().toFixed(0)} s: ${message} ==`);
    }
  }
  return { startedAt, command, commit, machine, outcomes, failures };
}

type Caption = (run: { startedAt: string; busyBefore?: CoresBusy }) => string;

/** Runs one benchmark and turns its result into sections and summary rows. */
async function runOne(
  name: BenchmarkName,
  load: LoadOptions,
  options: AllBenchmarksOptions,
  caption: Caption,
): Promise<Omit<BenchmarkOutcome, "name" | "seconds">> {
  const join = (...parts: string[]) => parts.join("\n\n");
  switch (name) {
    case "health": {
      const result = await runHealthBenchmark(load);
      const head = caption({ startedAt: result.startedAt, busyBefore: result.machine.busyBefore });
      return {
        sections: { health: join(head, formatHealthTable(result), formatHealthGoal(result)) },
        summary: [[
          "GET /health",
          `${result.service.requestsPerSecond.toFixed(0)} req/s`,
          `${result.floor.requestsPerSecond.toFixed(0)} req/s (floor)`,
          result.serviceVsFloor.toFixed(2),
        ]],
        result,
      };
    }
    case "verify": {
      const result = await runVerifyBenchmark(load);
      const head = caption({ startedAt: result.startedAt, busyBefore: result.machine.busyBefore });
      const sections: Record<string, string> = {};
      for (const store of result.stores) {
        sections[`verify-${store.store}`] = join(
          head,
          formatVerifyTable(store),
          formatVerifyGoal(store),
        );
      }
      return {
        sections,
        summary: result.stores.map((store) => [
          store.endpoint,
          `${store.service.median.requestsPerSecond.toFixed(0)} req/s`,
          `${store.floor.median.requestsPerSecond.toFixed(0)} req/s (floor)`,
          store.rpsRatio.median.toFixed(2),
        ]),
        result,
      };
    }
    case "gateway": {
      // The store gateway's endpoints beside verify, each against its bare proxy.
      const gateway = await runGatewayBenchmark(load);
      const head = caption({
        startedAt: gateway.startedAt,
        busyBefore: gateway.machine.busyBefore,
      });
      return {
        sections: {
          "verify-gateway": join(head, formatGatewayTable(gateway), formatGatewayGoal(gateway)),
          "verify-gateway-rounds": formatGatewayRoundsTable(gateway),
        },
        summary: gateway.endpoints.filter((endpoint) => !endpoint.isVerify).map((endpoint) => [
          endpoint.endpoint,
          `${endpoint.median.serviceRps.toFixed(0)} req/s`,
          `${endpoint.median.bareRps.toFixed(0)} req/s (bare)`,
          endpoint.rpsRatio.median.toFixed(2),
        ]),
        result: gateway,
      };
    }
    case "jws": {
      const result = await runJwsBenchmark({ progress: load.progress });
      const head = caption({ startedAt: result.startedAt });
      return {
        sections: { jws: join(head, formatJwsTable(result), formatJwsGoal(result)) },
        summary: [[
          "store A JWS verification",
          `${result.ours.opsPerSecond.toFixed(0)} /s`,
          `${result.apple.opsPerSecond.toFixed(0)} /s (Apple's)`,
          result.ratio.toFixed(2),
        ]],
        result,
      };
    }
    case "forged": {
      const result = await runForgedChainsBenchmark(load);
      const head = caption({ startedAt: result.startedAt, busyBefore: result.machine.busyBefore });
      const rounds = (pick: (round: (typeof result.rounds)[number]) => number) =>
        median(result.rounds.map(pick));
      return {
        sections: {
          "forged-chains": join(
            head,
            formatForgedChainsTable(result),
            formatForgedChainsGoal(result),
          ),
        },
        summary: [[
          "store A receiver, forged chains refused",
          `${rounds((round) => round.forged.requestsPerSecond).toFixed(0)} req/s`,
          `${rounds((round) => round.garbage.requestsPerSecond).toFixed(0)} req/s (garbage)`,
          result.ratioMedian.toFixed(2),
        ]],
        result,
      };
    }
    case "relay":
    case "relay-embedded": {
      const engine = name === "relay" ? "postgresql" : "embedded";
      let results;
      try {
        results = await runRelayRounds(
          { ...load, notifications: relayNotifications(load), engine },
          RELAY_ROUNDS,
        );
      } catch (error) {
        if (error instanceof RelayRunError) {
          load.progress?.(`the failed run's figures:\n${formatRelaySummary(error.result)}`);
        }
        throw error;
      }
      const result = results.at(-1)!;
      const head = caption({ startedAt: result.startedAt, busyBefore: result.machine.busyBefore });
      return {
        sections: {
          [name]: join(head, formatRelayTable(result)),
          [`${name}-deliveries`]: formatRelayDeliveryTable(result),
          [`${name}-rounds`]: formatRelayRoundsTable(results),
        },
        summary: [[
          `POST /v1/webhooks/storea/:tenantId (${engineName(engine)})`,
          `${result.service.requestsPerSecond.toFixed(0)} req/s`,
          `${result.bare.requestsPerSecond.toFixed(0)} req/s`,
          result.rpsRatio.toFixed(3),
        ]],
        result,
      };
    }
    case "cold-start": {
      const result = await runColdStartBenchmark({
        runs: options.runs,
        keepTemp: load.keepTemp,
        progress: load.progress,
      });
      const head = caption({ startedAt: result.startedAt, busyBefore: result.machine.busyBefore });
      const bare = result.boots.find((boot) => boot.kind === "bare")!;
      return {
        sections: {
          "cold-start": join(
            head,
            formatColdStartTable(result),
            formatColdStartSummary(result),
            formatColdStartGoal(result),
          ),
        },
        summary: result.boots.filter((boot) => boot !== bare).map((boot) => [
          `cold start: ${boot.label.replace("purchase-relay, ", "")}`,
          `${boot.ms.median.toFixed(0)} ms`,
          `${bare.ms.median.toFixed(0)} ms`,
          boot.ratio.toFixed(2),
        ]),
        result,
      };
    }
  }
}

/**
 * The relay's own number of notifications, or more when the runs are longer than its defaults
 * (20 s and 5 s) would need: it fails rather than send one twice.
 */
function relayNotifications(load: LoadOptions): number | undefined {
  if (load.durationSeconds === undefined && load.warmupSeconds === undefined) return undefined;
  const seconds = (load.durationSeconds ?? 20) + (load.warmupSeconds ?? 5);
  const needed = Math.ceil(seconds * RELAY_NOTIFICATIONS_PER_SECOND / 100) * 100;
  return Math.max(RELAY_NOTIFICATIONS, needed);
}

/** The summary table of a run: one row per measurement, then one per failure. */
export function formatSummaryTable(result: AllBenchmarksResult): string {
  // The time a benchmark took goes on its first row only.
  const rows = result.outcomes.flatMap((outcome) =>
    outcome.summary.map((row, i) => [...row, i === 0 ? `${outcome.seconds.toFixed(0)} s` : ""])
  );
  for (const failure of result.failures) {
    rows.push([failure.name, "FAILED", "-", "-", `${failure.seconds.toFixed(0)} s`]);
  }
  return formatTable([
    { header: "benchmark" },
    { header: "ours", numeric: true },
    { header: "baseline", numeric: true },
    { header: "ours / baseline", numeric: true },
    { header: "took", numeric: true },
  ], rows);
}

/** Every generated section of a run, by name. */
export function sectionsOf(result: AllBenchmarksResult): Record<string, string> {
  return Object.assign({}, ...result.outcomes.map((outcome) => outcome.sections));
}

// --- machine and commit --------------------------------------------------------------------------

/** Cores, memory, operating system, Deno and wrk, on one line. */
function describeMachineLine(wrk: string | null): string {
  const host = describeHost();
  let memory = "";
  try {
    memory = `, ${(Deno.systemMemoryInfo().total / 2 ** 30).toFixed(1)} GiB`;
  } catch {
    // without --allow-sys the memory is left out
  }
  return `${host.cpus} cores${memory}, ${host.os}, Deno ${host.deno}` +
    (wrk === null ? "" : `, wrk ${wrk}`);
}

/**
 * The checkout's commit, and whether files other than the benchmarks' page differ from it (the
 * page itself is what the run rewrites).
 */
async function describeCommit(): Promise<string> {
  const git = async (args: string[]) => {
    const output = await new Deno.Command("git", {
      args,
      cwd: ROOT,
      stdout: "piped",
      stderr: "null",
    })
      .output();
    if (!output.success) throw new Error(`git ${args.join(" ")} failed`);
    return new TextDecoder().decode(output.stdout).trim();
  };
  try {
    const commit = await git(["rev-parse", "--short", "HEAD"]);
    const changes = await git(["status", "--porcelain", "--", ".", `:!${DOC}`]);
    return changes === "" ? commit : `${commit} with uncommitted changes`;
  } catch {
    return "unknown";
  }
}

// --- main ----------------------------------------------------------------------------------------

/** The benchmarks `--only` names, checked. */
export function parseOnly(text: string | undefined): BenchmarkName[] {
  if (text === undefined) return [...BENCHMARK_NAMES];
  const names = text.split(",").map((name) => name.trim()).filter((name) => name !== "");
  const unknown = names.filter((name) => !(BENCHMARK_NAMES as readonly string[]).includes(name));
  if (unknown.length > 0 || names.length === 0) {
    throw new Error(
      `--only takes a comma-separated list of ${BENCHMARK_NAMES.join(", ")}; got "${text}"`,
    );
  }
  // In the order they always run, each once.
  return BENCHMARK_NAMES.filter((name) => names.includes(name));
}

/** The command line as typed, for the line above each table. */
/**
 * The command named above each table. `--doc PATH` is left out: the caption stands on the page it
 * names, and the path is only where that page was on the machine that ran it.
 */
export function commandLine(args: string[]): string {
  const quote = (arg: string) =>
    /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`;
  const named = args.filter((arg, i) =>
    arg !== "--doc" && args[i - 1] !== "--doc" && !arg.startsWith("--doc=")
  );
  return ["deno task bench", ...named.map(quote)].join(" ");
}

/** Writes the sections into the page, then lets `deno fmt` lay the page out as it always does. */
async function writeDoc(path: string, sections: Record<string, string>): Promise<void> {
  const page = await Deno.readTextFile(path);
  await Deno.writeTextFile(path, replaceSections(page, sections));
  const fmt = await new Deno.Command(Deno.execPath(), {
    // The project's settings (line width) also for a page outside the repository.
    args: ["fmt", "--quiet", `--config=${ROOT}/deno.json`, path],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!fmt.success) {
    throw new Error(`deno fmt ${path} failed: ${new TextDecoder().decode(fmt.stderr)}`);
  }
}

/** What the command line asks for. */
interface Plan {
  options: AllBenchmarksOptions;
  only: BenchmarkName[];
  /** The page to rewrite, or null with `--no-write`. */
  doc: { path: string; name: string } | null;
  json: boolean;
}

/**
 * Reads the flags and, unless `--no-write`, checks that the page has every marker the chosen
 * benchmarks write, so that a mistake fails now rather than after minutes of measuring.
 */
async function planFromArgs(args: string[]): Promise<Plan> {
  const { values } = parseArgs({
    args,
    options: {
      duration: { type: "string" },
      warmup: { type: "string" },
      runs: { type: "string" },
      only: { type: "string" },
      "no-write": { type: "boolean", default: false },
      json: { type: "boolean", default: false },
      "keep-temp": { type: "boolean", default: false },
      doc: { type: "string" },
    },
  });
  const only = parseOnly(values.only);
  const numbers = { duration: values.duration, warmup: values.warmup, runs: values.runs };
  for (const [flag, text] of Object.entries(numbers)) {
    const value = numberFlag(text);
    if (value !== undefined && !(value > 0)) {
      throw new Error(`--${flag} takes a positive number, got "${text}"`);
    }
  }
  const doc = values["no-write"]
    ? null
    : { path: values.doc ?? `${ROOT}/${DOC}`, name: values.doc ?? DOC };
  if (doc !== null) {
    const wanted = only.flatMap((name) => SECTIONS[name]);
    replaceSections(
      await Deno.readTextFile(doc.path),
      Object.fromEntries(wanted.map((name) => [name, ""])),
    );
  }
  return {
    options: {
      durationSeconds: numberFlag(values.duration),
      warmupSeconds: numberFlag(values.warmup),
      runs: numberFlag(values.runs),
      only,
      keepTemp: values["keep-temp"],
      command: commandLine(args),
    },
    only,
    doc,
    json: values.json,
  };
}

if (import.meta.main) {
  let plan: Plan;
  try {
    plan = await planFromArgs(Deno.args);
  } catch (error) {
    // A wrong flag or a page without its markers: the message says it all.
    console.error(`bench: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
  try {
    const started = performance.now();
    const result = await runAllBenchmarks(plan.options);
    for (const outcome of result.outcomes) {
      for (const [name, markdown] of Object.entries(outcome.sections)) {
        console.log(`## ${name}\n\n${markdown}\n`);
      }
    }
    console.log(`## Summary\n`);
    console.log(formatSummaryTable(result));
    console.log(
      `\n${result.outcomes.length} of ${plan.only.length} benchmarks ran in ${
        ((performance.now() - started) / 60_000).toFixed(1)
      } min; ${result.machine}; commit ${result.commit}.`,
    );
    for (const failure of result.failures) {
      console.log(`\n${failure.name} FAILED: ${failure.error}`);
    }
    const sections = sectionsOf(result);
    if (plan.doc === null) {
      console.log(`\n--no-write: the page was left as it was.`);
    } else if (Object.keys(sections).length > 0) {
      await writeDoc(plan.doc.path, sections);
      console.log(`\nRewrote ${Object.keys(sections).join(", ")} in ${plan.doc.name}.`);
    }
    if (plan.json) console.log(`\n${JSON.stringify(result, null, 2)}`);
    if (result.failures.length > 0) Deno.exit(1);
  } catch (error) {
    exitWithError(error);
  }
}
