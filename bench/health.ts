/**
 * `GET /health` of the real service against a bare `Deno.serve` answering the same body.
 *
 * Each server runs as its own `deno` process pinned to one core (`taskset -c 0`); `wrk` runs pinned
 * to another (`taskset -c 1`), first for a warm-up, then for the measured run with `--latency`.
 * The service runs as in production (`NODE_ENV=production`, `LOG_LEVEL=info`, embedded database in
 * a fresh temporary directory) and its stdout, one `http_request` JSON line per request, is
 * written to a real file in that directory, so the cost of logging is part of what is measured.
 * The peak RSS is read from `/proc/<pid>/status` of the deno process itself at the end of the run.
 *
 * Run it:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/health.ts
 *
 * It needs `wrk` (`apt-get install wrk`) and `taskset` (util-linux). Imported, it exports
 * {@linkcode runHealthBenchmark}, which returns the figures, and {@linkcode formatHealthTable}.
 * @module
 */

/** Options of {@linkcode runHealthBenchmark}. */
export interface HealthBenchmarkOptions {
  /** Length of the measured wrk run; 10 s by default. */
  durationSeconds?: number;
  /** Length of the unmeasured wrk run before it; 3 s by default. */
  warmupSeconds?: number;
  /** Open connections; 100 by default. */
  connections?: number;
  /** wrk threads (all pinned to `loadCore`); 2 by default. */
  threads?: number;
  /** The core the server runs on; 0 by default. */
  serverCore?: number;
  /** The core wrk runs on; 1 by default. */
  loadCore?: number;
  /** Keep the temporary directories (service data and stdout log) instead of removing them. */
  keepTemp?: boolean;
  /** Where progress lines go; standard error by default. */
  progress?: (line: string) => void;
}

/** The figures of one server. */
export interface TargetResult {
  name: string;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  /** Peak resident set (VmHWM) of the deno server process, in MiB. */
  rssMb: number;
  /** Resident set (VmRSS) at the end of the run, in MiB. */
  rssEndMb: number;
  /** Requests wrk completed in the measured run. */
  requests: number;
  /** Responses with a status outside 2xx and 3xx. */
  non2xx: number;
  /** wrk's connect, read, write and timeout errors, added up. */
  socketErrors: number;
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
  machine: {
    cpus: number;
    os: string;
    deno: string;
    wrk: string;
    /**
     * How busy the server's and wrk's cores were over one second before the run began (0 to 1):
     * above a few percent, other processes were competing and the figures are noisy.
     */
    busyBefore: { serverCore: number; loadCore: number };
  };
  settings: Required<Omit<HealthBenchmarkOptions, "keepTemp" | "progress">>;
  bare: TargetResult;
  service: TargetResult;
  /** service req/s divided by bare req/s. */
  ratio: number;
  goal: {
    minRatio: number;
    maxRssMb: number;
    ratioMet: boolean;
    rssMet: boolean;
    met: boolean;
  };
}

/** The goal: at least this share of bare req/s, with the log line written per request. */
export const MIN_RATIO = 0.7;
/** The goal: the service's peak RSS stays under this many MiB. */
export const MAX_RSS_MB = 100;

/** Thrown when a tool the benchmark needs is not installed. */
export class MissingToolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "MissingToolError";
  }
}

const ROOT = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const HEALTH_BODY = JSON.stringify({ status: "ok", version: "dev" });
const HEALTH_TYPE = "application/json; charset=utf-8";
const decoder = new TextDecoder();

/** Runs the benchmark: the bare server first, then the service, each on a fresh process. */
export async function runHealthBenchmark(
  options: HealthBenchmarkOptions = {},
): Promise<HealthBenchmarkResult> {
  const settings = {
    durationSeconds: options.durationSeconds ?? 10,
    warmupSeconds: options.warmupSeconds ?? 3,
    connections: options.connections ?? 100,
    threads: options.threads ?? 2,
    serverCore: options.serverCore ?? 0,
    loadCore: options.loadCore ?? 1,
  };
  const progress = options.progress ??
    ((line: string) => Deno.stderr.writeSync(new TextEncoder().encode(`${line}\n`)));
  const wrkVersion = await checkTools();
  const startedAt = new Date().toISOString();
  const idleStart = await coreTicks();
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const idleEnd = await coreTicks();
  const busyBefore = {
    serverCore: busyShare(idleStart, idleEnd, settings.serverCore),
    loadCore: busyShare(idleStart, idleEnd, settings.loadCore),
  };
  if (busyBefore.serverCore > 0.1 || busyBefore.loadCore > 0.1) {
    progress(
      `other processes keep the cores busy (core ${settings.serverCore} ${
        pct(busyBefore.serverCore)
      }, core ${settings.loadCore} ${pct(busyBefore.loadCore)}): expect noisy figures`,
    );
  }

  const bare = await measure("bare Deno.serve", settings, progress, options.keepTemp, startBare);
  const service = await measure(
    "purchase-relay /health",
    settings,
    progress,
    options.keepTemp,
    startService,
  );
  if (service.httpRequestLogLines < service.requests) {
    throw new Error(
      `the service wrote ${service.httpRequestLogLines} http_request lines for ` +
        `${service.requests} measured requests: its logging is not what is being measured`,
    );
  }
  const ratio = service.requestsPerSecond / bare.requestsPerSecond;
  const ratioMet = ratio >= MIN_RATIO;
  const rssMet = service.rssMb < MAX_RSS_MB;
  return {
    endpoint: "GET /health",
    startedAt,
    machine: {
      cpus: navigator.hardwareConcurrency,
      os: `${Deno.build.os} ${Deno.osRelease()} ${Deno.build.arch}`,
      deno: Deno.version.deno,
      wrk: wrkVersion,
      busyBefore,
    },
    settings,
    bare,
    service,
    ratio,
    goal: {
      minRatio: MIN_RATIO,
      maxRssMb: MAX_RSS_MB,
      ratioMet,
      rssMet,
      met: ratioMet && rssMet,
    },
  };
}

/** The markdown table of a result. */
export function formatHealthTable(result: HealthBenchmarkResult): string {
  const row = (target: TargetResult, ratio: string) =>
    `| ${target.name} | ${target.requestsPerSecond.toFixed(0)} | ${target.p50Ms.toFixed(2)} | ${
      target.p99Ms.toFixed(2)
    } | ${target.rssMb.toFixed(1)} | ${ratio} |`;
  return [
    "| server | req/s | p50 ms | p99 ms | RSS MB | req/s vs bare |",
    "| --- | ---: | ---: | ---: | ---: | ---: |",
    row(result.bare, "1.00"),
    row(result.service, result.ratio.toFixed(2)),
  ].join("\n");
}

/** One line per goal, saying whether it is met. */
export function formatHealthGoal(result: HealthBenchmarkResult): string {
  const { goal, ratio, service } = result;
  const mark = (met: boolean) => (met ? "met" : "NOT met");
  return [
    `- req/s at least ${(goal.minRatio * 100).toFixed(0)}% of bare: ${(ratio * 100).toFixed(0)}%, ${
      mark(goal.ratioMet)
    }`,
    `- peak RSS under ${goal.maxRssMb} MB: ${service.rssMb.toFixed(1)} MB, ${mark(goal.rssMet)}`,
  ].join("\n");
}

// --- servers -------------------------------------------------------------------------------------

interface Server {
  /** The pid of the deno process itself. */
  pid: number;
  url: string;
  stdoutPath: string;
  stderrPath: string;
  status: Promise<Deno.CommandStatus>;
  kill(signal: Deno.Signal): void;
}

type Settings = HealthBenchmarkResult["settings"];
type Starter = (tmp: string, settings: Settings) => Promise<Server>;

async function measure(
  name: string,
  settings: Settings,
  progress: (line: string) => void,
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
    await runWrk(server.url, settings, settings.warmupSeconds, false);
    progress(`${name}: measuring ${settings.durationSeconds} s`);
    const cpuBefore = await cpuSeconds(server.pid);
    const coresBefore = await coreTicks();
    const wrk = await runWrk(server.url, settings, settings.durationSeconds, true);
    const coresAfter = await coreTicks();
    const cpuUsed = await cpuSeconds(server.pid) - cpuBefore;
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
      serverCoreBusy: busyShare(coresBefore, coresAfter, settings.serverCore),
      loadCoreBusy: busyShare(coresBefore, coresAfter, settings.loadCore),
      httpRequestLogLines: stdout.httpRequestLines,
      stdoutBytes: stdout.bytes,
    };
    progress(
      `${name}: ${
        result.requestsPerSecond.toFixed(0)
      } req/s, p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms, peak RSS ${
        result.rssMb.toFixed(1)
      } MB, server CPU ${result.serverCpuCores.toFixed(2)} cores (core ${settings.serverCore} ${
        (result.serverCoreBusy * 100).toFixed(0)
      }% busy, core ${settings.loadCore} ${
        (result.loadCoreBusy * 100).toFixed(0)
      }% busy), ${result.httpRequestLogLines} http_request lines (${
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

const startBare: Starter = async (tmp, settings) => {
  const port = freePort();
  const server = spawnPinned({
    core: settings.serverCore,
    args: ["run", "--allow-net=127.0.0.1", "--allow-env", `${ROOT}/bench/bare_health_server.ts`],
    env: { PORT: String(port), HOST: "127.0.0.1" },
    stdoutPath: `${tmp}/bare.out`,
    stderrPath: `${tmp}/bare.err`,
    url: `http://127.0.0.1:${port}`,
  });
  await waitUntil(server, async () => {
    try {
      const response = await fetch(`${server.url}/health`);
      await response.body?.cancel();
      return response.ok;
    } catch {
      return false;
    }
  });
  return server;
};

const startService: Starter = async (tmp, settings) => {
  const dataDir = `${tmp}/data`;
  await Deno.mkdir(dataDir);
  const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(32))));
  const stdoutPath = `${tmp}/service.out`;
  const server = spawnPinned({
    core: settings.serverCore,
    args: [
      "run",
      "--allow-net",
      "--allow-env",
      "--allow-read",
      `--allow-write=${dataDir}`,
      "--allow-sys=hostname,osRelease",
      `${ROOT}/main.ts`,
      "serve",
    ],
    env: {
      PORT: "0",
      HOST: "127.0.0.1",
      DATA_DIR: dataDir,
      NODE_ENV: "production",
      ENCRYPTION_KEY: key,
      LOG_LEVEL: "info",
    },
    stdoutPath,
    stderrPath: `${tmp}/service.err`,
    url: "",
  });
  let port = 0;
  await waitUntil(server, async () => {
    const text = await Deno.readTextFile(stdoutPath).catch(() => "");
    for (const line of text.split("\n")) {
      if (!line.startsWith("{")) continue;
      const record = JSON.parse(line);
      if (record.level === "fatal") throw new Error(`the service did not start: ${line}`);
      if (record.msg === "listening" && typeof record.port === "number") {
        port = record.port;
        return true;
      }
    }
    return false;
  });
  server.url = `http://127.0.0.1:${port}`;
  return server;
};

/**
 * Starts `deno ARGS` pinned to `core`, with stdout and stderr going to files. `sh` redirects and
 * `exec`s taskset, which `exec`s deno, so the pid of the child is the pid of deno itself.
 */
function spawnPinned(spec: {
  core: number;
  args: string[];
  env: Record<string, string>;
  stdoutPath: string;
  stderrPath: string;
  url: string;
}): Server {
  const env: Record<string, string> = {};
  for (
    const name of ["PATH", "HOME", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR", "NPM_CONFIG_REGISTRY"]
  ) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  const child = new Deno.Command("sh", {
    args: [
      "-c",
      'out="$1"; err="$2"; shift 2; exec "$@" >"$out" 2>"$err"',
      "sh",
      spec.stdoutPath,
      spec.stderrPath,
      "taskset",
      "-c",
      String(spec.core),
      Deno.execPath(),
      ...spec.args,
    ],
    cwd: ROOT,
    env: { ...env, ...spec.env },
    clearEnv: true,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  return {
    pid: child.pid,
    url: spec.url,
    stdoutPath: spec.stdoutPath,
    stderrPath: spec.stderrPath,
    status: child.status,
    kill: (signal) => child.kill(signal),
  };
}

/**
 * Polls `ready` until it holds; fails if the process exits or 120 s go by, and then stops the
 * process so that no server outlives a failed start.
 */
async function waitUntil(server: Server, ready: () => Promise<boolean>): Promise<void> {
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
        throw new Error(`the server exited with ${exited.code}: ${stderr.slice(-2000)}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error("the server did not come up within 120 s");
  } catch (error) {
    if (!exited) await stop(server);
    throw error;
  }
}

async function checkIsDeno(pid: number): Promise<void> {
  const exe = (await run("readlink", [`/proc/${pid}/exe`])).trim();
  const deno = await Deno.realPath(Deno.execPath());
  if (exe !== deno) throw new Error(`pid ${pid} is ${exe}, not deno (${deno})`);
}

async function checkHealthResponse(url: string): Promise<void> {
  const response = await fetch(`${url}/health`);
  const body = await response.text();
  const type = response.headers.get("content-type");
  if (response.status !== 200 || body !== HEALTH_BODY || type !== HEALTH_TYPE) {
    throw new Error(`${url}/health answered ${response.status} ${type} ${body}`);
  }
}

async function stop(server: Server): Promise<void> {
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

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

// --- /proc -----------------------------------------------------------------------------------------
// Deno refuses to read /proc/<pid>/ without --allow-all, so these go through `cat` and `readlink`.

async function run(command: string, args: string[]): Promise<string> {
  const output = await new Deno.Command(command, { args, stdout: "piped", stderr: "piped" })
    .output();
  if (!output.success) {
    throw new Error(`${command} ${args.join(" ")}: ${decoder.decode(output.stderr)}`);
  }
  return decoder.decode(output.stdout);
}

async function readMemory(pid: number): Promise<{ hwmKb: number; rssKb: number }> {
  const status = await run("cat", [`/proc/${pid}/status`]);
  const field = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status);
    if (!match) throw new Error(`no ${name} in /proc/${pid}/status`);
    return Number(match[1]);
  };
  return { hwmKb: field("VmHWM"), rssKb: field("VmRSS") };
}

/** User and system CPU time of `pid`, in seconds (clock ticks of 1/100 s on Linux). */
async function cpuSeconds(pid: number): Promise<number> {
  const stat = await run("cat", [`/proc/${pid}/stat`]);
  // Fields after the command name, which is in parentheses and may hold spaces.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

type CoreTicks = Map<number, { total: number; idle: number }>;

/** The share of time `core` was busy between two readings of /proc/stat. */
function busyShare(before: CoreTicks, after: CoreTicks, core: number): number {
  const a = before.get(core);
  const b = after.get(core);
  if (!a || !b) return NaN;
  const total = b.total - a.total;
  return total > 0 ? 1 - (b.idle - a.idle) / total : NaN;
}

function pct(share: number): string {
  return `${(share * 100).toFixed(0)}%`;
}

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

async function scanStdout(path: string): Promise<{ bytes: number; httpRequestLines: number }> {
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

async function checkTools(): Promise<string> {
  for (const [tool, install] of [["wrk", "wrk"], ["taskset", "util-linux"]]) {
    try {
      const output = await new Deno.Command(tool, {
        args: tool === "wrk" ? ["-v"] : ["-V"],
        stdout: "piped",
        stderr: "piped",
      }).output();
      if (tool === "wrk") {
        const text = decoder.decode(output.stdout) + decoder.decode(output.stderr);
        return /wrk\s+(\S+)/.exec(text)?.[1] ?? "unknown";
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
  return "unknown";
}

interface WrkFigures {
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  non2xx: number;
  socketErrors: number;
}

async function runWrk(
  url: string,
  settings: Settings,
  seconds: number,
  latency: boolean,
): Promise<WrkFigures> {
  const args = [
    "-c",
    String(settings.loadCore),
    "wrk",
    `-t${settings.threads}`,
    `-c${settings.connections}`,
    `-d${seconds}s`,
    ...(latency ? ["--latency"] : []),
    `${url}/health`,
  ];
  const output = await new Deno.Command("taskset", { args, stdout: "piped", stderr: "piped" })
    .output();
  const text = decoder.decode(output.stdout);
  if (!output.success) {
    throw new Error(`wrk failed (${output.code}): ${text}${decoder.decode(output.stderr)}`);
  }
  return parseWrk(text, latency);
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

// --- main ----------------------------------------------------------------------------------------

if (import.meta.main) {
  try {
    const result = await runHealthBenchmark();
    console.log(`## GET /health\n`);
    console.log(formatHealthTable(result));
    console.log();
    console.log(formatHealthGoal(result));
    if (Deno.args.includes("--json")) console.log(`\n${JSON.stringify(result, null, 2)}`);
  } catch (error) {
    console.error(error instanceof MissingToolError ? error.message : error);
    Deno.exit(1);
  }
}
