/**
 * Cold start: the time from spawning the service (`deno run main.ts serve` with the permissions of
 * `deno task start`) to its `listening` log line, and its resident set (VmRSS) at that moment,
 * against a bare `Deno.serve` (`bench/bare_listen_server.ts`) spawned the same way in the same
 * run, which prints a line once it listens.
 *
 * Four boots of the service, each measured `runs` times:
 * - PostgreSQL, a new empty database: migrations at boot included;
 * - PostgreSQL, the same database again, already migrated;
 * - the embedded engine in a new empty `DATA_DIR`: unpacking the shipped template and the
 *   migrations included;
 * - the embedded engine again on that `DATA_DIR`.
 *
 * The embedded engine's goals (first boot, later boots, RSS at listening) are judged on the
 * medians, with PostgreSQL's figures of the same run beside them.
 *
 * Each run (a round) spawns the baseline, then the four boots in that order, each with a new
 * temporary database or `DATA_DIR` made before the clock starts; unmeasured rounds come first, so
 * that Deno's module and code caches and the file system cache are warm for every measured one.
 * The service runs with `NODE_ENV=production`, `LOG_LEVEL=info` and a random `ENCRYPTION_KEY`;
 * its stdout is piped to this process, which notes the time the `listening` line arrives. No
 * process is pinned: a booting service has the machine's cores, as it would in production. The
 * bench checks that the first boot of each database applied the migrations, that the second
 * applied none, and that the service used the engine it was meant to.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/cold_start.ts
 *
 * Flags: `--runs N` measured rounds (5), `--warmup-runs N` unmeasured ones before them (1),
 * `--json` also prints every figure as JSON, `--keep-temp` keeps the temporary directory.
 * `BENCH_DATABASE_URL` names the PostgreSQL server to create the databases on (default
 * `postgres://postgres@127.0.0.1:5432/postgres`).
 * @module
 */
import { parseArgs } from "node:util";
import {
  busyBeforeRun,
  type CoresBusy,
  createDatabase,
  describeHost,
  exitWithError,
  formatTable,
  type Host,
  inheritedEnv,
  numberFlag,
  productionServiceEnv,
  type Progress,
  readMemory,
  ROOT,
  serviceEnvironment,
  servicePermissions,
  type Spread,
  spread,
  writeProgress,
} from "./support.ts";

/** Options of {@linkcode runColdStartBenchmark}. */
export interface ColdStartOptions {
  /** Measured rounds: boots of each kind; 5 by default. */
  runs?: number;
  /** Unmeasured rounds before them; 1 by default. */
  warmupRuns?: number;
  /** PostgreSQL to create the databases on; `BENCH_DATABASE_URL` or local by default. */
  databaseUrl?: string;
  /** Keep the temporary directory (data directories, keys) instead of removing it. */
  keepTemp?: boolean;
  /** Where progress lines go; standard error by default. */
  progress?: Progress;
}

/** The kinds of boot measured, in the order of a round. */
export type BootKind =
  | "bare"
  | "postgresql-new"
  | "postgresql-migrated"
  | "embedded-new"
  | "embedded-existing";

/** What one kind of boot measured over the rounds. */
export interface BootResult {
  kind: BootKind;
  /** The row's name in the table. */
  label: string;
  /** From spawning the process to its listening line, in ms, one per measured round. */
  samplesMs: number[];
  /** VmRSS of the process when its listening line arrived, in MiB, one per measured round. */
  rssSamplesMb: number[];
  ms: Spread;
  rssMb: Spread;
  /** The median time divided by the bare server's median time. */
  ratio: number;
}

/** What {@linkcode runColdStartBenchmark} returns. */
export interface ColdStartResult {
  startedAt: string;
  machine: Host & { busyBefore: CoresBusy };
  settings: { runs: number; warmupRuns: number };
  boots: BootResult[];
  /** The embedded engine's goals, judged on the medians. */
  goal: typeof EMBEDDED_GOAL & {
    firstBootMet: boolean;
    laterBootMet: boolean;
    rssMet: boolean;
  };
}

/** The embedded engine's goals: boot times in ms and the resident set at listening in MB. */
export const EMBEDDED_GOAL = {
  /** The first boot, on a new `DATA_DIR`, at most this long. */
  maxFirstBootMs: 1_500,
  /** A boot on an existing `DATA_DIR` at most this long. */
  maxLaterBootMs: 800,
  /** VmRSS at listening, on a new and on an existing `DATA_DIR`, at most this. */
  maxRssMb: 150,
};

const LABELS: Record<BootKind, string> = {
  bare: "bare Deno.serve",
  "postgresql-new": "purchase-relay, PostgreSQL, new database (migrations)",
  "postgresql-migrated": "purchase-relay, PostgreSQL, migrated database",
  "embedded-new": "purchase-relay, embedded, new DATA_DIR (template, migrations)",
  "embedded-existing": "purchase-relay, embedded, existing DATA_DIR",
};
const KINDS = Object.keys(LABELS) as BootKind[];

/** The longest a boot may take before the run fails. */
const BOOT_TIMEOUT_MS = 120_000;
/** How long a stopped process has to exit before it is killed. */
const STOP_TIMEOUT_MS = 15_000;

/** Runs the rounds and returns every boot's times and memory. */
export async function runColdStartBenchmark(
  options: ColdStartOptions = {},
): Promise<ColdStartResult> {
  const settings = { runs: options.runs ?? 5, warmupRuns: options.warmupRuns ?? 1 };
  if (!Number.isInteger(settings.runs) || settings.runs < 1) {
    throw new Error(`runs must be a positive whole number, got ${settings.runs}`);
  }
  if (!Number.isInteger(settings.warmupRuns) || settings.warmupRuns < 0) {
    throw new Error(`warm-up runs must be a whole number, got ${settings.warmupRuns}`);
  }
  const progress = options.progress ?? writeProgress;
  const startedAt = new Date().toISOString();
  const busyBefore = await busyBeforeRun({ serverCore: 0, loadCore: 1 }, progress);
  const tmp = await Deno.makeTempDir({ prefix: "purchase-relay-bench-cold-start-" });
  const samples = new Map(KINDS.map((kind) => [kind, [] as Boot[]]));
  try {
    const total = settings.warmupRuns + settings.runs;
    for (let round = 0; round < total; round++) {
      const warmup = round < settings.warmupRuns;
      const name = warmup
        ? `warm-up ${round + 1}/${settings.warmupRuns}`
        : `run ${round - settings.warmupRuns + 1}/${settings.runs}`;
      const boots = await runRound(`${tmp}/round-${round}`, options.databaseUrl);
      progress(
        `${name}: ${KINDS.map((kind) => `${kind} ${boots[kind].ms.toFixed(0)} ms`).join(", ")}`,
      );
      if (!warmup) { for (const kind of KINDS) samples.get(kind)!.push(boots[kind]); }
      if (!options.keepTemp) {
        await Deno.remove(`${tmp}/round-${round}`, { recursive: true }).catch(() => {});
      }
    }
  } finally {
    if (!options.keepTemp) await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
  const bareMedian = spread(samples.get("bare")!.map((boot) => boot.ms)).median;
  const boots = KINDS.map((kind): BootResult => {
    const samplesMs = samples.get(kind)!.map((boot) => boot.ms);
    const rssSamplesMb = samples.get(kind)!.map((boot) => Math.round(boot.rssKb / 102.4) / 10);
    const ms = spread(samplesMs);
    return {
      kind,
      label: LABELS[kind],
      samplesMs,
      rssSamplesMb,
      ms,
      rssMb: spread(rssSamplesMb),
      ratio: ms.median / bareMedian,
    };
  });
  const boot = (kind: BootKind) => boots.find((b) => b.kind === kind)!;
  const goal = {
    ...EMBEDDED_GOAL,
    firstBootMet: boot("embedded-new").ms.median <= EMBEDDED_GOAL.maxFirstBootMs,
    laterBootMet: boot("embedded-existing").ms.median <= EMBEDDED_GOAL.maxLaterBootMs,
    rssMet: boot("embedded-new").rssMb.median <= EMBEDDED_GOAL.maxRssMb &&
      boot("embedded-existing").rssMb.median <= EMBEDDED_GOAL.maxRssMb,
  };
  return { startedAt, machine: { ...describeHost(), busyBefore }, settings, boots, goal };
}

/** The markdown table: each boot's times, its median RSS at listening and its ratio to bare. */
export function formatColdStartTable(result: ColdStartResult): string {
  return formatTable(
    [
      { header: "start" },
      { header: "min ms", numeric: true },
      { header: "median ms", numeric: true },
      { header: "max ms", numeric: true },
      { header: "RSS at listening MB", numeric: true },
      { header: "median vs bare", numeric: true },
    ],
    result.boots.map((boot) => [
      boot.label,
      boot.ms.min.toFixed(0),
      boot.ms.median.toFixed(0),
      boot.ms.max.toFixed(0),
      boot.rssMb.median.toFixed(1),
      boot.ratio.toFixed(2),
    ]),
  );
}

/** One line per goal of the embedded engine, with PostgreSQL's figure of the same run beside. */
export function formatColdStartGoal(result: ColdStartResult): string {
  const { goal } = result;
  const boot = (kind: BootKind) => result.boots.find((b) => b.kind === kind)!;
  const ms = (kind: BootKind) => `${boot(kind).ms.median.toFixed(0)} ms`;
  const mb = (kind: BootKind) => `${boot(kind).rssMb.median.toFixed(1)} MB`;
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  return [
    `- embedded, first boot (new DATA_DIR) at most ${goal.maxFirstBootMs} ms: ` +
    `${ms("embedded-new")}, ${mark(goal.firstBootMet)} ` +
    `(PostgreSQL, new database: ${ms("postgresql-new")})`,
    `- embedded, later boots (existing DATA_DIR) at most ${goal.maxLaterBootMs} ms: ` +
    `${ms("embedded-existing")}, ${mark(goal.laterBootMet)} ` +
    `(PostgreSQL, migrated database: ${ms("postgresql-migrated")})`,
    `- embedded, RSS at listening at most ${goal.maxRssMb} MB: ${mb("embedded-new")} on a new ` +
    `DATA_DIR, ${mb("embedded-existing")} on an existing one, ${mark(goal.rssMet)} ` +
    `(PostgreSQL: ${mb("postgresql-new")} and ${mb("postgresql-migrated")})`,
  ].join("\n");
}

/** How many boots the table is made of. */
export function formatColdStartSummary(result: ColdStartResult): string {
  const { runs, warmupRuns } = result.settings;
  const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;
  return `${plural(runs, "measured boot")} of each kind, after ${
    plural(warmupRuns, "unmeasured round")
  }; RSS is the median of the boots' VmRSS when the line arrived.`;
}

// --- one round -----------------------------------------------------------------------------------

/** One boot: spawn to listening line, and the memory then. */
interface Boot {
  ms: number;
  rssKb: number;
}

/** The baseline, then the service's four boots, each on its own new database or `DATA_DIR`. */
async function runRound(
  dir: string,
  databaseUrl: string | undefined,
): Promise<Record<BootKind, Boot>> {
  await Deno.mkdir(dir, { recursive: true });
  const bare = await timeBoot(
    ["run", "--allow-net=127.0.0.1", "--allow-env", `${ROOT}/bench/bare_listen_server.ts`],
    {},
    () => {},
  );

  await Deno.mkdir(`${dir}/postgresql`);
  const database = await createDatabase(databaseUrl);
  let postgresqlNew: Boot;
  let postgresqlMigrated: Boot;
  try {
    const env = await productionServiceEnv(`${dir}/postgresql`, { DATABASE_URL: database.url });
    postgresqlNew = await timeServiceBoot(env, { engine: "postgresql", migrates: true });
    postgresqlMigrated = await timeServiceBoot(env, { engine: "postgresql", migrates: false });
  } finally {
    await database.drop();
  }

  await Deno.mkdir(`${dir}/embedded`);
  const env = await productionServiceEnv(`${dir}/embedded`);
  const embeddedNew = await timeServiceBoot(env, { engine: "embedded", migrates: true });
  const embeddedExisting = await timeServiceBoot(env, { engine: "embedded", migrates: false });
  return {
    bare,
    "postgresql-new": postgresqlNew,
    "postgresql-migrated": postgresqlMigrated,
    "embedded-new": embeddedNew,
    "embedded-existing": embeddedExisting,
  };
}

/**
 * Boots the service as `deno task start` does, writing only to `env.DATA_DIR`, and checks what its
 * log says before `listening`: the engine, and whether migrations were applied.
 */
function timeServiceBoot(
  env: Record<string, string>,
  expect: { engine: "postgresql" | "embedded"; migrates: boolean },
): Promise<Boot> {
  return timeBoot(
    ["run", ...servicePermissions(env), `${ROOT}/main.ts`, "serve"],
    { ...env, ...serviceEnvironment(env) },
    (records) => {
      const listening = records[records.length - 1];
      if (listening.database !== expect.engine) {
        throw new Error(`the service booted on ${listening.database}, not ${expect.engine}`);
      }
      const migrated = records.some((record) => record.msg === "migrations_applied");
      if (migrated !== expect.migrates) {
        throw new Error(
          `the ${expect.engine} boot ${migrated ? "applied" : "did not apply"} migrations, ` +
            `expected it ${expect.migrates ? "to" : "not to"}`,
        );
      }
    },
  );
}

type LogRecord = Record<string, unknown>;

/**
 * Spawns `deno ARGS` on a loopback port of its choosing, notes when its `listening` line arrives
 * on the piped stdout and reads its VmRSS then; then stops it. `check` gets the JSON lines up to
 * and including the `listening` one.
 */
async function timeBoot(
  args: string[],
  env: Record<string, string>,
  check: (records: LogRecord[]) => void,
): Promise<Boot> {
  const command = new Deno.Command(Deno.execPath(), {
    args,
    cwd: ROOT,
    env: { ...inheritedEnv(), ...env, PORT: "0", HOST: "127.0.0.1" },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
  const started = performance.now();
  const child = command.spawn();
  const stderr = new Response(child.stderr).text();
  const lines = readLines(child.stdout);
  const timer = setTimeout(() => child.kill("SIGKILL"), BOOT_TIMEOUT_MS);
  const records: LogRecord[] = [];
  try {
    let listenedAt: number | undefined;
    while (listenedAt === undefined) {
      const line = await lines.next();
      if (line === null) {
        const status = await child.status;
        throw new Error(
          `deno ${args.slice(-2).join(" ")} exited with ${status.code} before listening: ` +
            `${(await stderr).slice(-2000)}${records.map((r) => JSON.stringify(r)).join("\n")}`,
        );
      }
      const record = parseRecord(line);
      if (record === null) continue;
      records.push(record);
      if (record.level === "fatal") throw new Error(`the service did not start: ${line}`);
      if (record.msg === "listening") listenedAt = performance.now();
    }
    const memory = await readMemory(child.pid);
    check(records);
    return { ms: listenedAt - started, rssKb: memory.rssKb };
  } finally {
    clearTimeout(timer);
    await stopChild(child);
    await lines.drain();
    await stderr.catch(() => "");
  }
}

/** Stops the child with SIGTERM, or SIGKILL if it is still there a while later. */
async function stopChild(child: Deno.ChildProcess): Promise<void> {
  try {
    child.kill("SIGTERM");
  } catch {
    return; // already gone
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const exited = await Promise.race([
    child.status.then(() => true),
    new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), STOP_TIMEOUT_MS))),
  ]);
  clearTimeout(timer);
  if (!exited) {
    try {
      child.kill("SIGKILL");
    } catch {
      // exited meanwhile
    }
    await child.status;
  }
}

/** A JSON object line, or null for anything else. */
function parseRecord(line: string): LogRecord | null {
  if (!line.startsWith("{")) return null;
  try {
    const value = JSON.parse(line);
    return typeof value === "object" && value !== null ? value : null;
  } catch {
    return null;
  }
}

/** Reads a byte stream line by line; `drain` reads (and drops) the rest, so the writer never blocks. */
function readLines(stream: ReadableStream<Uint8Array>) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  let done = false;
  return {
    /** The next whole line, or null at the end of the stream (a last partial line included). */
    async next(): Promise<string | null> {
      while (true) {
        const newline = buffered.indexOf("\n");
        if (newline !== -1) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          return line;
        }
        if (done) {
          if (buffered === "") return null;
          const last = buffered;
          buffered = "";
          return last;
        }
        const chunk = await reader.read();
        if (chunk.done) done = true;
        else buffered += chunk.value;
      }
    },
    async drain(): Promise<void> {
      while (!done) done = (await reader.read()).done;
    },
  };
}

// --- main ----------------------------------------------------------------------------------------

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      runs: { type: "string" },
      "warmup-runs": { type: "string" },
      json: { type: "boolean", default: false },
      "keep-temp": { type: "boolean", default: false },
    },
  });
  try {
    const result = await runColdStartBenchmark({
      runs: numberFlag(values.runs),
      warmupRuns: numberFlag(values["warmup-runs"]),
      keepTemp: values["keep-temp"],
    });
    console.log("## Cold start\n");
    console.log(formatColdStartTable(result));
    console.log();
    console.log(formatColdStartSummary(result));
    console.log();
    console.log(formatColdStartGoal(result));
    if (values.json) console.log(`\n${JSON.stringify(result, null, 2)}`);
  } catch (error) {
    exitWithError(error);
  }
}
