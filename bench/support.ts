/**
 * What the benchmarks (`bench/health.ts`, `bench/verify.ts`, `bench/relay.ts`,
 * `bench/storea_jws.ts`, `bench/cold_start.ts`, and `bench/all.ts`, which runs them all) share:
 * their flags and options; starting a `deno` server (the service or a baseline) pinned to one core
 * and stopping it; a temporary PostgreSQL database and a tenant's store A credentials made through
 * the CLI; reading a process's memory and CPU time and each core's busy time from `/proc`, also
 * while a load runs; running `wrk` pinned to another core and reading its report; percentiles;
 * and the markdown tables, among them the one that sets a server beside its baseline.
 *
 * Deno refuses to read `/proc/<pid>/` without `--allow-all`, so the `/proc` readings go through
 * `cat` and `readlink`.
 * @module
 */
import { parseArgs } from "node:util";
import postgres from "postgres";
import { serviceEnvironment, servicePermissions } from "../src/process/permissions.ts";

/** The repository root, which children run in and take their scripts from. */
export const ROOT: string = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(
  /\/$/,
  "",
);

export { serviceEnvironment, servicePermissions };

const decoder = new TextDecoder();

// --- options, progress and machine --------------------------------------------------------------

/** Where a benchmark's progress lines go. */
export type Progress = (line: string) => void;

/** The options every load benchmark takes. */
export interface LoadOptions {
  /** Length of each measured wrk run; 10 s by default. */
  durationSeconds?: number;
  /** Length of the unmeasured wrk run before it; 3 s by default. */
  warmupSeconds?: number;
  /** Open connections; 100 by default. */
  connections?: number;
  /** wrk threads (all pinned to `loadCore`); 2 by default. */
  threads?: number;
  /** The core the server under test runs on; 0 by default. */
  serverCore?: number;
  /** The core wrk runs on, with whatever else serves the run but the server; 1 by default. */
  loadCore?: number;
  /** Keep the temporary files (logs, service data, keys, wrk script) instead of removing them. */
  keepTemp?: boolean;
  /** Where progress lines go; standard error by default. */
  progress?: Progress;
}

/** The {@linkcode LoadOptions} of a run, defaults filled in. */
export type LoadSettings = Required<Omit<LoadOptions, "keepTemp" | "progress">>;

/** `options` with the defaults filled in. */
export function loadSettings(options: LoadOptions): LoadSettings {
  return {
    durationSeconds: options.durationSeconds ?? 10,
    warmupSeconds: options.warmupSeconds ?? 3,
    connections: options.connections ?? 100,
    threads: options.threads ?? 2,
    serverCore: options.serverCore ?? 0,
    loadCore: options.loadCore ?? 1,
  };
}

/**
 * The flags every load benchmark takes, as `parseArgs` of `node:util` wants them: `--json` (also
 * print every figure as JSON), `--keep-temp`, `--duration S` and `--warmup S`.
 */
export const LOAD_FLAGS = {
  json: { type: "boolean", default: false },
  "keep-temp": { type: "boolean", default: false },
  duration: { type: "string" },
  warmup: { type: "string" },
} as const;

/** The values `parseArgs` reads for the {@linkcode LOAD_FLAGS}. */
export interface LoadFlagValues {
  duration?: string;
  warmup?: string;
  "keep-temp"?: boolean;
}

/** The {@linkcode LoadOptions} the {@linkcode LOAD_FLAGS} give; what is not given stays default. */
export function loadOptionsFromFlags(values: LoadFlagValues): LoadOptions {
  return {
    durationSeconds: numberFlag(values.duration),
    warmupSeconds: numberFlag(values.warmup),
    keepTemp: values["keep-temp"],
  };
}

/** A numeric flag's value, or undefined when the flag is not given. */
export function numberFlag(text: string | undefined): number | undefined {
  return text === undefined ? undefined : Number(text);
}

/** The default {@linkcode Progress}: one line on standard error. */
export function writeProgress(line: string): void {
  Deno.stderr.writeSync(new TextEncoder().encode(`${line}\n`));
}

/** A share (0 to 1) as a whole percentage, e.g. `42%`. */
export function pct(share: number): string {
  return `${(share * 100).toFixed(0)}%`;
}

/** The cores a benchmark pins the server under test and its load (wrk) to. */
export interface Cores {
  serverCore: number;
  loadCore: number;
}

/** How busy each of the two {@linkcode Cores} was over some time (0 to 1), whoever used it. */
export interface CoresBusy {
  serverCore: number;
  loadCore: number;
}

/**
 * How busy the two cores are over one second before a run. Above 10% it says so through
 * `progress`: other processes compete for the cores and the figures will be noisy.
 */
export async function busyBeforeRun(cores: Cores, progress: Progress): Promise<CoresBusy> {
  const watch = await watchCpu([], cores);
  await sleep(1000);
  const { busy } = await watch.end();
  if (busy.serverCore > 0.1 || busy.loadCore > 0.1) {
    progress(
      `other processes keep the cores busy (core ${cores.serverCore} ${
        pct(busy.serverCore)
      }, core ${cores.loadCore} ${pct(busy.loadCore)}): expect noisy figures`,
    );
  }
  return busy;
}

/** The computer a benchmark runs on, as far as it can be read without extra permissions. */
export interface Host {
  /** Logical cores. */
  cpus: number;
  /** Operating system, kernel release and architecture, e.g. `linux 6.18.0 x86_64`. */
  os: string;
  /** Deno's version. */
  deno: string;
}

/** This computer: cores, operating system and Deno's version. */
export function describeHost(): Host {
  return {
    cpus: navigator.hardwareConcurrency,
    os: `${Deno.build.os} ${Deno.osRelease()} ${Deno.build.arch}`,
    deno: Deno.version.deno,
  };
}

/** The machine a load run was made on. */
export interface Machine extends Host {
  wrk: string;
  /**
   * How busy the server's and wrk's cores were over one second before the run began (0 to 1):
   * above a few percent, other processes were competing and the figures are noisy.
   */
  busyBefore: CoresBusy;
}

/** This machine, with the wrk version of {@linkcode checkTools} and {@linkcode busyBeforeRun}. */
export function describeMachine(wrk: string, busyBefore: CoresBusy): Machine {
  return { ...describeHost(), wrk, busyBefore };
}

/** When a run began, and on what machine. */
export interface RunStart {
  startedAt: string;
  machine: Machine;
}

/**
 * What every load benchmark does first: checks that its tools are installed
 * ({@linkcode checkTools}), notes the time, then measures how busy the cores are for a second
 * ({@linkcode busyBeforeRun}) and describes the machine.
 */
export async function beginRun(cores: Cores, progress: Progress): Promise<RunStart> {
  const wrkVersion = await checkTools();
  const startedAt = new Date().toISOString();
  const busyBefore = await busyBeforeRun(cores, progress);
  return { startedAt, machine: describeMachine(wrkVersion, busyBefore) };
}

// --- processes -----------------------------------------------------------------------------------

/** A `deno` process started by {@linkcode spawnPinned}. */
export interface Server {
  /** The pid of the deno process itself. */
  pid: number;
  /** Where it answers; empty until the caller knows. */
  url: string;
  stdoutPath: string;
  stderrPath: string;
  status: Promise<Deno.CommandStatus>;
  kill(signal: Deno.Signal): void;
}

/** What {@linkcode spawnPinned} starts. */
export interface SpawnOptions {
  /** The core it runs on. */
  core: number;
  /** The arguments of `deno`, e.g. `["run", "--allow-net", "server.ts"]`. */
  args: string[];
  /** Its environment, on top of {@linkcode inheritedEnv}. */
  env: Record<string, string>;
  stdoutPath: string;
  stderrPath: string;
}

/** The variables a deno child needs to find its cache; nothing else of ours leaks in. */
export function inheritedEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (
    const name of [
      "PATH",
      "HOME",
      "DENO_DIR",
      "DENO_V8_FLAGS",
      "XDG_CACHE_HOME",
      "TMPDIR",
      "NPM_CONFIG_REGISTRY",
    ]
  ) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/**
 * Starts `deno ARGS` pinned to `core`, with stdout and stderr going to files. `sh` redirects and
 * `exec`s taskset, which `exec`s deno, so the pid of the child is the pid of deno itself.
 */
export function spawnPinned(options: SpawnOptions): Server {
  const child = new Deno.Command("sh", {
    args: [
      "-c",
      'out="$1"; err="$2"; shift 2; exec "$@" >"$out" 2>"$err"',
      "sh",
      options.stdoutPath,
      options.stderrPath,
      "taskset",
      "-c",
      String(options.core),
      Deno.execPath(),
      ...options.args,
    ],
    cwd: ROOT,
    env: { ...inheritedEnv(), ...options.env },
    clearEnv: true,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  return {
    pid: child.pid,
    url: "",
    stdoutPath: options.stdoutPath,
    stderrPath: options.stderrPath,
    status: child.status,
    kill: (signal) => child.kill(signal),
  };
}

/**
 * Polls `ready` until it holds, then checks that the pid is deno's, whose memory and CPU time the
 * benchmark reads. Fails if the process exits or 120 s go by, and then stops the process so that
 * no server outlives a failed start.
 */
export async function waitUntil(server: Server, ready: () => Promise<boolean>): Promise<void> {
  let exited: Deno.CommandStatus | undefined;
  server.status.then((status) => (exited = status));
  try {
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      if (await ready()) {
        await checkIsDeno(server.pid);
        return;
      }
      if (exited) {
        const stderr = await Deno.readTextFile(server.stderrPath).catch(() => "");
        throw new Error(`pid ${server.pid} exited with ${exited.code}: ${stderr.slice(-2000)}`);
      }
      await sleep(100);
    }
    throw new Error(`pid ${server.pid} was not ready within 120 s`);
  } catch (error) {
    if (!exited) await stop(server);
    throw error;
  }
}

/** The first whole line of the process's stdout that `matches`; see {@linkcode waitUntil}. */
export async function waitForLine(
  server: Server,
  matches: (line: string) => boolean,
): Promise<string> {
  let found: string | undefined;
  await waitUntil(server, async () => {
    const text = await Deno.readTextFile(server.stdoutPath).catch(() => "");
    found = text.split("\n").find((line) => line.endsWith("}") && matches(line));
    return found !== undefined;
  });
  return found!;
}

/** Throws unless `pid` runs the same deno executable as this process. */
async function checkIsDeno(pid: number): Promise<void> {
  const exe = (await run("readlink", [`/proc/${pid}/exe`])).trim();
  const deno = await Deno.realPath(Deno.execPath());
  if (exe !== deno) throw new Error(`pid ${pid} is ${exe}, not deno (${deno})`);
}

/** Stops the process with SIGTERM, or SIGKILL if it is still there 15 s later. */
export async function stop(server: Server): Promise<void> {
  try {
    server.kill("SIGTERM");
  } catch {
    return; // already gone
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = await Promise.race([
    server.status.then(() => false),
    new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), 15_000))),
  ]);
  clearTimeout(timer);
  if (timedOut) {
    try {
      server.kill("SIGKILL");
    } catch {
      // exited meanwhile
    }
    await server.status;
  }
}

/** Options of {@linkcode startService}. */
export interface ServiceOptions {
  /** The core it runs on. */
  core: number;
  /** Its environment, `DATA_DIR` included; `PORT` and `HOST` are set here. */
  env: Record<string, string>;
}

/**
 * Starts the service (`main.ts serve`) with the permissions of `deno task start`, writing only to
 * `env.DATA_DIR`, on a loopback port of its choosing; resolves once it logs `listening`. Its
 * stdout and stderr go to `${prefix}service.out` and `${prefix}service.err`.
 */
export async function startService(prefix: string, options: ServiceOptions): Promise<Server> {
  const server = spawnPinned({
    core: options.core,
    args: [
      "run",
      ...serviceDenoFlags(),
      ...servicePermissions(options.env),
      `${ROOT}/main.ts`,
      "serve",
    ],
    env: { ...options.env, ...serviceEnvironment(options.env), PORT: "0", HOST: "127.0.0.1" },
    stdoutPath: `${prefix}service.out`,
    stderrPath: `${prefix}service.err`,
  });
  const listening = JSON.parse(
    await waitForLine(server, (line) => {
      if (!line.startsWith("{")) return false;
      const record = JSON.parse(line);
      if (record.level === "fatal") throw new Error(`the service did not start: ${line}`);
      return record.msg === "listening" && typeof record.port === "number";
    }),
  );
  server.url = `http://127.0.0.1:${listening.port}`;
  return server;
}

/**
 * `deno run` flags for the service under test alone, from `BENCH_SERVICE_DENO_FLAGS` (split at
 * spaces): a CPU profile (`--cpu-prof --cpu-prof-dir=DIR`) or V8's flags (`--v8-flags=--trace-gc`)
 * without the baselines, the load generator and the CLI getting them too, as `DENO_V8_FLAGS` would.
 */
function serviceDenoFlags(): string[] {
  return (Deno.env.get("BENCH_SERVICE_DENO_FLAGS") ?? "").split(" ").filter((flag) => flag !== "");
}

/**
 * The service's environment as in production: `NODE_ENV=production`, `LOG_LEVEL=info` (one
 * `http_request` line per request), a fresh `ENCRYPTION_KEY` and `DATA_DIR` `${dir}/data`, which
 * it creates; `extra` on top.
 */
export async function productionServiceEnv(
  dir: string,
  extra: Record<string, string> = {},
): Promise<Record<string, string>> {
  const env = {
    DATA_DIR: `${dir}/data`,
    NODE_ENV: "production",
    ENCRYPTION_KEY: randomEncryptionKey(),
    LOG_LEVEL: "info",
    ...extra,
  };
  await Deno.mkdir(env.DATA_DIR);
  return env;
}

/** Options of {@linkcode startBaseline}. */
export interface BaselineOptions {
  /** The core it runs on. */
  core: number;
  /** Its environment besides `PORT` and `HOST`. */
  env?: Record<string, string>;
  /** Permissions besides `--allow-net=127.0.0.1 --allow-env`, e.g. `--allow-ffi`. */
  permissions?: string[];
}

/**
 * Starts a baseline server, `script` (a path from the repository root, e.g.
 * `bench/bare_receiver.ts`) run with `--allow-net=127.0.0.1 --allow-env`, on a loopback port that
 * was free; resolves once it answers any request. Its stdout and stderr go to `${prefix}bare.out`
 * and `${prefix}bare.err`.
 */
export async function startBaseline(
  script: string,
  prefix: string,
  options: BaselineOptions,
): Promise<Server> {
  const port = freePort();
  const server = spawnPinned({
    core: options.core,
    args: [
      "run",
      "--allow-net=127.0.0.1",
      "--allow-env",
      ...options.permissions ?? [],
      `${ROOT}/${script}`,
    ],
    env: { ...options.env, PORT: String(port), HOST: "127.0.0.1" },
    stdoutPath: `${prefix}bare.out`,
    stderrPath: `${prefix}bare.err`,
  });
  server.url = `http://127.0.0.1:${port}`;
  await waitUntil(server, async () => {
    try {
      const response = await fetch(server.url);
      await response.body?.cancel();
      return true;
    } catch {
      return false;
    }
  });
  return server;
}

/** A request of {@linkcode checkAnswer}. */
export interface CheckedRequest {
  /** Headers besides `content-type: application/json`. */
  headers?: Record<string, string>;
  /** The JSON body. */
  body: string;
  /** What the body of every right answer holds. */
  marker: string;
}

/**
 * POSTs one request to `url` as a benchmark's wrk script sends it, before any timing, and checks
 * the answer as the script checks every answer: status 200 and `marker` in the body.
 */
export async function checkAnswer(url: string, request: CheckedRequest): Promise<void> {
  const response = await fetch(url, {
    method: "POST",
    headers: { ...request.headers, "content-type": "application/json" },
    body: request.body,
  });
  const text = await response.text();
  if (response.status !== 200 || !text.includes(request.marker)) {
    throw new Error(`${url} answered ${response.status}: ${text.slice(0, 500)}`);
  }
}

/**
 * Runs the CLI (`main.ts ARGS`) as the service runs, writing only to `env.DATA_DIR`; returns what
 * it prints, parsed as JSON. Throws with its stderr if it fails.
 */
export async function runCli(
  args: string[],
  env: Record<string, string>,
): Promise<Record<string, unknown>> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...servicePermissions(env, args),
      `${ROOT}/main.ts`,
      ...args,
    ],
    cwd: ROOT,
    env: { ...inheritedEnv(), ...env },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) {
    throw new Error(`main.ts ${args.join(" ")}: ${decoder.decode(output.stderr)}`);
  }
  return JSON.parse(decoder.decode(output.stdout));
}

/** A fresh `ENCRYPTION_KEY` for the service: 32 random bytes in base64. */
function randomEncryptionKey(): string {
  return btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(32))));
}

/** A loopback port that was free a moment ago. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** Resolves after `ms` milliseconds. */
function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Runs `command` and returns its stdout; throws with its stderr if it fails. */
async function run(command: string, args: string[]): Promise<string> {
  const output = await new Deno.Command(command, { args, stdout: "piped", stderr: "piped" })
    .output();
  if (!output.success) {
    throw new Error(`${command} ${args.join(" ")}: ${decoder.decode(output.stderr)}`);
  }
  return decoder.decode(output.stdout);
}

// --- database and tenant ------------------------------------------------------------------------

/** A PostgreSQL database made for one run by {@linkcode createDatabase}. */
export interface TemporaryDatabase {
  /** `pr_bench_` and 16 random hex digits. */
  name: string;
  /** Where to connect to it, as the admin URL's user. */
  url: string;
  /** Drops it, closing any connection still open to it. */
  drop(): Promise<void>;
}

/**
 * Creates a database with a fresh name on the PostgreSQL server of `adminUrl`: by default
 * `BENCH_DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/postgres`.
 */
export async function createDatabase(
  adminUrl: string = Deno.env.get("BENCH_DATABASE_URL") ??
    "postgres://postgres@127.0.0.1:5432/postgres",
): Promise<TemporaryDatabase> {
  const name = `pr_bench_${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    name,
    url: url.toString(),
    async drop() {
      const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
      try {
        await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await admin.end();
      }
    },
  };
}

/** The bench tenant's App Store app (`--bundle-id`). */
export const STOREA_BUNDLE_ID = "com.example.app";
/** The issuer of the bench tenant's App Store Connect key (`--issuer-id`). */
export const STOREA_ISSUER_ID = "57246542-96fe-1a63-e053-0824d011072a";
/** The id of the bench tenant's App Store Connect key (`--key-id`). */
export const STOREA_KEY_ID = "ABC123DEFG";

/** A new EC P-256 key in PKCS#8 PEM at `path`, as App Store Connect hands out `.p8` files. */
export async function writeStoreaKey(path: string): Promise<string> {
  const pair = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
    "sign",
    "verify",
  ]);
  const der = new Uint8Array(await crypto.subtle.exportKey("pkcs8", pair.privateKey));
  const base64 = der.toBase64().match(/.{1,64}/g)!.join("\n");
  await Deno.writeTextFile(
    path,
    `-----BEGIN PRIVATE KEY-----\n${base64}\n-----END PRIVATE KEY-----\n`,
  );
  return path;
}

/**
 * Gives the tenant store A credentials through the CLI ({@linkcode runCli} with `env`): the
 * `STOREA_*` ids above and the key in `keyFile` (see {@linkcode writeStoreaKey}).
 */
export async function setStoreaCredentials(
  env: Record<string, string>,
  tenant: { tenantId: string; keyFile: string },
): Promise<void> {
  await runCli([
    "storea",
    "set-credentials",
    tenant.tenantId,
    "--bundle-id",
    STOREA_BUNDLE_ID,
    "--key-id",
    STOREA_KEY_ID,
    "--issuer-id",
    STOREA_ISSUER_ID,
    "--private-key-file",
    tenant.keyFile,
  ], env);
}

// --- /proc ---------------------------------------------------------------------------------------

/** Resident set of a process, in KiB. */
export interface Memory {
  /** Peak since the process started (VmHWM). */
  hwmKb: number;
  /** Now (VmRSS). */
  rssKb: number;
}

/** VmHWM and VmRSS of `pid`, from /proc/<pid>/status. */
export async function readMemory(pid: number): Promise<Memory> {
  const status = await run("cat", [`/proc/${pid}/status`]);
  const field = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status);
    if (!match) throw new Error(`no ${name} in /proc/${pid}/status`);
    return Number(match[1]);
  };
  return { hwmKb: field("VmHWM"), rssKb: field("VmRSS") };
}

/** What {@linkcode sampleRss} returns. */
export interface RssSampling {
  /** Ends the sampling after one last sample. */
  stop(): void;
  /** The VmRSS samples in KiB, once stopped. */
  samplesKb: Promise<number[]>;
}

/** Samples VmRSS of `pid` every 250 ms until stopped, and once more then. */
export function sampleRss(pid: number): RssSampling {
  let running = true;
  const samplesKb = (async () => {
    const samples: number[] = [];
    while (running) {
      samples.push((await readMemory(pid)).rssKb);
      await sleep(250);
    }
    samples.push((await readMemory(pid)).rssKb);
    return samples;
  })();
  return { stop: () => (running = false), samplesKb };
}

/** User and system CPU time of `pid`, in seconds (clock ticks of 1/100 s on Linux). */
export async function cpuSeconds(pid: number): Promise<number> {
  const stat = await run("cat", [`/proc/${pid}/stat`]);
  // Fields after the command name, which is in parentheses and may hold spaces.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** Clock ticks of each core since boot, by core number: all of them and the idle ones. */
type CoreTicks = Map<number, { total: number; idle: number }>;

/** Busy and idle clock ticks of each core, from /proc/stat. */
async function coreTicks(): Promise<CoreTicks> {
  const ticks: CoreTicks = new Map();
  for (const line of (await run("cat", ["/proc/stat"])).split("\n")) {
    const match = /^cpu(\d+)\s+(.*)$/.exec(line);
    if (!match) continue;
    const values = match[2].trim().split(/\s+/).map(Number);
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    const total = values.slice(0, 8).reduce((sum, n) => sum + n, 0);
    ticks.set(Number(match[1]), { total, idle: values[3] + values[4] });
  }
  return ticks;
}

/** The share of time `core` was busy between two readings of /proc/stat. */
function busyShare(before: CoreTicks, after: CoreTicks, core: number): number {
  const a = before.get(core);
  const b = after.get(core);
  if (!a || !b) return NaN;
  const total = b.total - a.total;
  return total > 0 ? 1 - (b.idle - a.idle) / total : NaN;
}

/** What {@linkcode watchCpu} measured. */
export interface CpuUse {
  /** CPU seconds each process used, in the order of the pids given. */
  seconds: number[];
  /** How busy the two cores were, whoever used them. */
  busy: CoresBusy;
}

/** A measurement begun by {@linkcode watchCpu}. */
export interface CpuWatch {
  /** Ends the measurement. */
  end(): Promise<CpuUse>;
}

/**
 * Begins measuring the CPU time of `pids` and how busy the two cores are. It reads the processes
 * before the cores when it begins, and after them when it ends, so that the processes' window
 * holds the cores' one.
 */
export async function watchCpu(pids: number[], cores: Cores): Promise<CpuWatch> {
  const secondsBefore: number[] = [];
  for (const pid of pids) secondsBefore.push(await cpuSeconds(pid));
  const ticksBefore = await coreTicks();
  return {
    async end() {
      const ticksAfter = await coreTicks();
      const seconds: number[] = [];
      for (const [i, pid] of pids.entries()) seconds.push(await cpuSeconds(pid) - secondsBefore[i]);
      return {
        seconds,
        busy: {
          serverCore: busyShare(ticksBefore, ticksAfter, cores.serverCore),
          loadCore: busyShare(ticksBefore, ticksAfter, cores.loadCore),
        },
      };
    },
  };
}

/** What {@linkcode measureLoad} measured while its load ran. */
export interface LoadMeasurement<T> {
  /** What the load returned, e.g. wrk's figures. */
  load: T;
  /** CPU seconds each process used, in the order of the pids given. */
  cpuSeconds: number[];
  /** How busy the two cores were, whoever used them. */
  busy: CoresBusy;
  /** VmRSS of the first pid, sampled every 250 ms, in MiB to one decimal: growth or a plateau. */
  rssSamplesMb: number[];
  /** The largest of those samples, in MiB. */
  peakRssMb: number;
  /** VmHWM of the first pid (peak since it started, boot included) once the load ended, in MiB. */
  hwmMb: number;
}

/** Options of {@linkcode measureLoad}. */
export interface MeasureOptions {
  /** The processes whose CPU time is measured; the first, the server, also has its RSS sampled. */
  pids: number[];
  cores: Cores;
}

/**
 * Runs `load` (a measured wrk run) while measuring the CPU time of `options.pids` and the cores'
 * use ({@linkcode watchCpu}) and sampling the server's VmRSS ({@linkcode sampleRss}).
 */
export async function measureLoad<T>(
  load: () => Promise<T>,
  options: MeasureOptions,
): Promise<LoadMeasurement<T>> {
  const [server] = options.pids;
  const cpu = await watchCpu(options.pids, options.cores);
  const sampling = sampleRss(server);
  const result = await load().finally(() => sampling.stop());
  const { seconds, busy } = await cpu.end();
  const rssSamplesKb = await sampling.samplesKb;
  const memory = await readMemory(server);
  return {
    load: result,
    cpuSeconds: seconds,
    busy,
    rssSamplesMb: rssSamplesKb.map((kb) => Math.round(kb / 102.4) / 10),
    peakRssMb: Math.max(...rssSamplesKb) / 1024,
    hwmMb: memory.hwmKb / 1024,
  };
}

/** What {@linkcode scanStdout} finds in a service's stdout file. */
export interface StdoutScan {
  bytes: number;
  /** Lines the service logged with `"msg":"http_request"`, one per request. */
  httpRequestLines: number;
}

/** Reads the service's stdout file through once, counting its bytes and `http_request` lines. */
export async function scanStdout(path: string): Promise<StdoutScan> {
  const needle = '"msg":"http_request"';
  using file = await Deno.open(path);
  const textDecoder = new TextDecoder();
  let bytes = 0;
  let count = 0;
  let carry = "";
  for await (const chunk of file.readable) {
    bytes += chunk.length;
    const text = carry + textDecoder.decode(chunk, { stream: true });
    let at = text.indexOf(needle);
    while (at !== -1) {
      count++;
      at = text.indexOf(needle, at + needle.length);
    }
    carry = text.slice(-(needle.length - 1));
  }
  return { bytes, httpRequestLines: count };
}

// --- wrk -----------------------------------------------------------------------------------------

/** Thrown when a tool the benchmark needs is not installed. */
export class MissingToolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "MissingToolError";
  }
}

/** Says why a benchmark failed on standard error (a missing tool: how to install it) and exits 1. */
export function exitWithError(error: unknown): never {
  console.error(error instanceof MissingToolError ? error.message : error);
  Deno.exit(1);
}

/**
 * The command line of a load benchmark run in rounds: the {@linkcode LOAD_FLAGS} and `--rounds N`
 * given to `run`, then the `tables` of its result printed a blank line apart, and with `--json`
 * the whole result; a failure exits 1 ({@linkcode exitWithError}).
 */
export async function runLoadBenchmarkCommand<T>(
  run: (options: LoadOptions & { rounds?: number }) => Promise<T>,
  tables: (result: T) => string[],
): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: { ...LOAD_FLAGS, rounds: { type: "string" } },
  });
  try {
    const result = await run({
      ...loadOptionsFromFlags(values),
      rounds: numberFlag(values.rounds),
    });
    console.log(tables(result).join("\n\n"));
    if (values.json) console.log(`\n${JSON.stringify(result, null, 2)}`);
  } catch (error) {
    exitWithError(error);
  }
}

/**
 * Runs `command` pinned to `core` and returns the last line it printed, parsed as JSON; when it
 * exits non-zero, fails with `what` and everything it printed.
 */
export async function runPinnedForJson(
  what: string,
  core: number,
  command: string[],
  env?: Record<string, string>,
): Promise<unknown> {
  const output = await new Deno.Command("taskset", {
    args: ["-c", String(core), ...command],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(output.stdout);
  if (!output.success) {
    throw new Error(
      `${what} failed (${output.code}): ${text}${new TextDecoder().decode(output.stderr)}`,
    );
  }
  return JSON.parse(text.trim().split("\n").at(-1)!);
}

/**
 * Runs `bench/open_loop.mjs` under Node, pinned to `loadCore`, with `config` (its module doc says
 * what it takes), and returns the one JSON line it prints.
 */
export async function runOpenLoopGenerator(
  loadCore: number,
  config: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  return await runPinnedForJson("open_loop.mjs", loadCore, [
    "node",
    `${ROOT}/bench/open_loop.mjs`,
    JSON.stringify(config),
  ]) as Record<string, unknown>;
}

/** Checks that `wrk` and `taskset` are installed; returns wrk's version. */
export async function checkTools(): Promise<string> {
  let version = "unknown";
  for (const [tool, install] of [["wrk", "wrk"], ["taskset", "util-linux"]]) {
    try {
      const output = await new Deno.Command(tool, {
        args: tool === "wrk" ? ["-v"] : ["-V"],
        stdout: "piped",
        stderr: "piped",
      }).output();
      if (tool === "wrk") {
        const text = decoder.decode(output.stdout) + decoder.decode(output.stderr);
        version = /wrk\s+(\S+)/.exec(text)?.[1] ?? "unknown";
      }
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) {
        throw new MissingToolError(
          `${tool} is not installed. Install it with:\n\n    apt-get update && apt-get install -y ${install}\n\n(as root, or with sudo), then run the benchmark again.`,
        );
      }
      throw error;
    }
  }
  return version;
}

/** Options of {@linkcode runWrk}. */
export interface WrkOptions {
  /** Length of the run. */
  seconds: number;
  /** Report the latency distribution (`--latency`). */
  latency?: boolean;
  /** A Lua script (`-s`). */
  script?: string;
  /** The script's arguments, passed after `--`. */
  scriptArgs?: string[];
}

/**
 * Runs wrk against `url` with the threads and connections of `settings`, pinned to its
 * `loadCore`; returns its report as it printed it.
 */
export async function runWrk(
  url: string,
  settings: LoadSettings,
  options: WrkOptions,
): Promise<string> {
  const args = [
    "-c",
    String(settings.loadCore),
    "wrk",
    `-t${settings.threads}`,
    `-c${settings.connections}`,
    `-d${options.seconds}s`,
    ...(options.latency ? ["--latency"] : []),
    ...(options.script === undefined ? [] : ["-s", options.script]),
    url,
    ...(options.scriptArgs === undefined ? [] : ["--", ...options.scriptArgs]),
  ];
  const output = await new Deno.Command("taskset", { args, stdout: "piped", stderr: "piped" })
    .output();
  const text = decoder.decode(output.stdout);
  if (!output.success) {
    throw new Error(`wrk failed (${output.code}): ${text}${decoder.decode(output.stderr)}`);
  }
  return text;
}

/**
 * The part of a wrk Lua script that checks answers, shared by the benchmarks that send their own
 * requests. `setup` numbers the threads (`first` is 0, 1, ...); `response` counts an answer as
 * right when its status is 200 and its body holds `marker`, and keeps the first wrong one; `done`
 * prints the totals for {@linkcode parseCheckedAnswers}. The script adds its own `init`, which
 * sets `marker`, `step`, `index` (its thread's first request) and `headers`, then calls
 * `reset_checks()`, and its own `request`, which advances `index` by `step` and counts in
 * `wrapped` any request that had to reuse what an earlier one sent.
 */
export const WRK_CHECKED_ANSWERS_LUA = `
local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("first", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function reset_checks()
  good = 0
  bad = 0
  wrapped = 0
  first_wrong = ""
end

function response(status, headers, body)
  if status == 200 and string.find(body, marker, 1, true) then
    good = good + 1
  else
    bad = bad + 1
    if first_wrong == "" then
      first_wrong = status .. " " .. string.sub(string.gsub(body or "", "%s", " "), 1, 300)
    end
  end
end

function done(summary, latency, requests)
  local total_good, total_bad, total_wrapped, next_base = 0, 0, 0, 0
  local wrong = ""
  for _, thread in ipairs(threads) do
    total_good = total_good + thread:get("good")
    total_bad = total_bad + thread:get("bad")
    total_wrapped = total_wrapped + thread:get("wrapped")
    local used = thread:get("index") - thread:get("first")
    if used > next_base then next_base = used end
    if wrong == "" then wrong = thread:get("first_wrong") end
  end
  io.write(string.format("checked: good %d bad %d wrapped %d next %d\\n",
    total_good, total_bad, total_wrapped, next_base))
  if wrong ~= "" then io.write("first wrong: " .. wrong .. "\\n") end
end
`;

/** What a script built on {@linkcode WRK_CHECKED_ANSWERS_LUA} checked, from wrk's output. */
export interface CheckedAnswers {
  checkedGood: number;
  checkedBad: number;
  /** Requests that reused what an earlier request of the run sent. */
  wrapped: number;
  /** How far the furthest thread got: where a next run starts to send nothing twice. */
  nextBase: number;
  /** The first wrong answer, status and start of the body, or null. */
  firstWrong: string | null;
}

/** Reads the counts that {@linkcode WRK_CHECKED_ANSWERS_LUA}'s `done` printed. */
export function parseCheckedAnswers(text: string): CheckedAnswers {
  const checked = /^checked: good (\d+) bad (\d+) wrapped (\d+) next (\d+)$/m.exec(text);
  if (!checked) throw new Error(`no check counts in wrk's output:\n${text}`);
  return {
    checkedGood: Number(checked[1]),
    checkedBad: Number(checked[2]),
    wrapped: Number(checked[3]),
    nextBase: Number(checked[4]),
    firstWrong: /^first wrong: (.*)$/m.exec(text)?.[1] ?? null,
  };
}

/** The figures {@linkcode parseWrk} reads from a wrk report. */
export interface WrkFigures {
  requestsPerSecond: number;
  /** NaN when the report has no latency distribution. */
  p50Ms: number;
  p99Ms: number;
  requests: number;
  /** Responses with a status outside 2xx and 3xx. */
  non2xx: number;
  /** wrk's connect, read, write and timeout errors, added up. */
  socketErrors: number;
}

/** Reads req/s, p50, p99 and the error counts from wrk's report. */
export function parseWrk(text: string, latency = true): WrkFigures {
  const number = (pattern: RegExp, what: string) => {
    const match = pattern.exec(text);
    if (!match) throw new Error(`no ${what} in wrk's output:\n${text}`);
    return match;
  };
  const percentile = (p: number) => {
    const match = number(
      new RegExp(`^\\s*${p}(?:\\.0+)?%\\s+([\\d.]+)(us|ms|s|m)\\s*$`, "m"),
      `p${p}`,
    );
    const scale = { us: 0.001, ms: 1, s: 1000, m: 60_000 }[match[2]]!;
    return Number(match[1]) * scale;
  };
  const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(text);
  return {
    requestsPerSecond: Number(number(/^Requests\/sec:\s+([\d.]+)/m, "Requests/sec")[1]),
    p50Ms: latency ? percentile(50) : NaN,
    p99Ms: latency ? percentile(99) : NaN,
    requests: Number(number(/^\s*(\d+) requests in/m, "request count")[1]),
    non2xx: Number(/Non-2xx or 3xx responses: (\d+)/.exec(text)?.[1] ?? 0),
    socketErrors: socket ? socket.slice(1).reduce((sum, n) => sum + Number(n), 0) : 0,
  };
}

// --- statistics ----------------------------------------------------------------------------------

/**
 * The `p`-th percentile (0 to 100) of `values`, interpolated linearly between the two nearest
 * ranks (so the 50th of an even count is the mean of the middle two). NaN for no values.
 */
export function percentile(values: readonly number[], p: number): number {
  if (!(p >= 0 && p <= 100)) throw new RangeError(`a percentile is between 0 and 100, got ${p}`);
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const below = Math.floor(rank);
  const above = Math.ceil(rank);
  return sorted[below] + (sorted[above] - sorted[below]) * (rank - below);
}

/** The middle of `values` ({@linkcode percentile} 50); NaN for no values. */
export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/**
 * The 1-minute load average (what `uptime` shows first): how many processes wanted a core, on
 * average, over the last minute. On the 2-core machine anything above about 0.1 besides the
 * benchmark means others were competing for the cores.
 */
export function loadAverage(): number {
  return Deno.loadavg()[0];
}

/** The least, middle and greatest of some measurements. */
export interface Spread {
  min: number;
  median: number;
  max: number;
}

/** The {@linkcode Spread} of `values`; NaN in each field for no values. */
export function spread(values: readonly number[]): Spread {
  return {
    min: percentile(values, 0),
    median: percentile(values, 50),
    max: percentile(values, 100),
  };
}

// --- tables --------------------------------------------------------------------------------------

/** A column of {@linkcode formatTable}: its header, and whether its cells are numbers. */
export interface Column {
  header: string;
  /** Numbers are aligned right; text (the default) left. */
  numeric?: boolean;
}

/**
 * A markdown table with its columns padded to one width, as `deno fmt` lays tables out, so that
 * it reads as well on a terminal as in the rendered page.
 */
export function formatTable(columns: readonly Column[], rows: readonly string[][]): string {
  for (const row of rows) {
    if (row.length !== columns.length) {
      throw new Error(`a row has ${row.length} cells for ${columns.length} columns: ${row}`);
    }
  }
  const length = (text: string) => [...text].length;
  const widths = columns.map((column, i) =>
    Math.max(3, length(column.header), ...rows.map((row) => length(row[i])))
  );
  const pad = (text: string, i: number) => {
    const fill = " ".repeat(widths[i] - length(text));
    return columns[i].numeric ? fill + text : text + fill;
  };
  const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
  return [
    line(columns.map((column, i) => pad(column.header, i))),
    line(
      widths.map((width, i) =>
        columns[i].numeric ? `${"-".repeat(width - 1)}:` : "-".repeat(width)
      ),
    ),
    ...rows.map((row) => line(row.map(pad))),
  ].join("\n");
}

/** A server's row in {@linkcode formatComparisonTable}. */
export interface ComparedServer extends WrkFigures {
  name: string;
  /** The largest VmRSS sampled during the measured run, in MiB. */
  peakRssMb: number;
}

/** The service measured beside its baseline, as `bench/verify.ts` and `bench/relay.ts` report it. */
export interface Comparison {
  bare: ComparedServer;
  service: ComparedServer;
  /** service req/s divided by baseline req/s. */
  rpsRatio: number;
  /** service p99 divided by baseline p99. */
  p99Ratio: number;
}

/** Options of {@linkcode formatComparisonTable}. */
export interface ComparisonTableOptions {
  /** Decimals of the req/s ratio column; 2 by default. */
  rpsRatioDigits?: number;
}

const COMPARISON_COLUMNS: Column[] = [
  { header: "server" },
  { header: "req/s", numeric: true },
  { header: "p50 ms", numeric: true },
  { header: "p99 ms", numeric: true },
  { header: "peak RSS MB", numeric: true },
  { header: "req/s vs baseline", numeric: true },
  { header: "p99 vs baseline", numeric: true },
];

/** The markdown table of the baseline and the service, with the service's ratios to it. */
export function formatComparisonTable(
  comparison: Comparison,
  options: ComparisonTableOptions = {},
): string {
  const digits = options.rpsRatioDigits ?? 2;
  const row = (target: ComparedServer, rps: string, p99: string) => [
    target.name,
    target.requestsPerSecond.toFixed(0),
    target.p50Ms.toFixed(2),
    target.p99Ms.toFixed(2),
    target.peakRssMb.toFixed(1),
    rps,
    p99,
  ];
  return formatTable(COMPARISON_COLUMNS, [
    row(comparison.bare, (1).toFixed(digits), "1.00"),
    row(comparison.service, comparison.rpsRatio.toFixed(digits), comparison.p99Ratio.toFixed(2)),
  ]);
}
