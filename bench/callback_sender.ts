/**
 * One delivery attempt: the sender of this version (src/delivery/sender.ts: its own HTTP/1.1 client
 * over the runtime's sockets, pinned to the checked addresses where a name is checked, with the
 * dispatcher's kept connections) against a `fetch`-based sender (bench/fetch_sender.ts), to the
 * same callback sink in the same run. The body is the size of a store A delivery (16.6 KB).
 *
 * Scenarios, on one sink: a callback at an address (`http://127.0.0.1:PORT/hooks`: neither sender
 * looks anything up); a name where private networks are allowed (`http://localhost:PORT/hooks`
 * and the https one: nothing is checked, both let their HTTP client resolve it); and the same
 * names as production checks them (fetch: a lookup for the check, then `fetch`, which resolves
 * again for a new connection; the service's: the same lookup, then a connection to its answer;
 * in the last scenario, as the dispatcher does, the answer kept for 30 s). TLS uses a throwaway CA
 * trusted through `DENO_CERT`. Each is measured one attempt at a time (the median latency) and 32
 * at a time (attempts per second, and the sender process's CPU time per attempt).
 *
 * Processes and cores: the sink (this module run as `callback_sender.ts sink`) on core 1, the
 * senders (`callback_sender.ts measure`) on core 0, pinned with `taskset`. Every round runs both
 * senders on a callback in ten alternating slices (which goes first alternates too), so that
 * noise from other processes falls on both; each ratio to fetch is taken per round, and the
 * median of the rounds is reported. Every attempt must be answered 200, or the run fails.
 *
 * Run it from the repository root:
 *
 *     deno run --allow-run --allow-net --allow-env --allow-read --allow-write --allow-sys bench/callback_sender.ts [--rounds 3] [--attempts 2000] [--json]
 *
 * @module
 */
import { parseArgs } from "node:util";
import process from "node:process";
import { join } from "node:path";
import { sendDelivery, type SenderOptions } from "../src/delivery/sender.ts";
import { CallbackConnections } from "../src/delivery/callback_client.ts";
import { CheckedAddresses, resolveHost } from "../src/delivery/callback_target.ts";
import { createTlsTestCertificates } from "../simulators/tls_certificates.ts";
import { sendWithFetch } from "./fetch_sender.ts";
import { formatTable, spawnPinned, stop, writeProgress } from "./support.ts";

const SECRET = "whsec_bench_secret_of_at_least_32_characters";
const CONCURRENCY = 32;
/** Slices of a round, alternating the two senders. */
const SLICES = 10;

/** What one sender did on one callback in one round. */
interface Measure {
  /** Median milliseconds of one attempt made alone. */
  sequentialMedianMs: number;
  /** Attempts per second, 32 at a time. */
  concurrentPerSecond: number;
  /** The sender process's CPU time per attempt, 32 at a time, in µs. */
  cpuMicrosPerAttempt: number;
}

/** The figures of one scenario, over the rounds. */
interface ScenarioResult {
  scenario: string;
  rounds: { before: Measure; now: Measure }[];
  /** Medians over the rounds of now/before: latency and CPU (lower is better), throughput. */
  latencyRatio: number;
  throughputRatio: number;
  cpuRatio: number;
}

type AttemptFn = (url: string) => Promise<number | null>;

interface Scenario {
  name: string;
  url: string;
  before: AttemptFn;
  now: AttemptFn;
}

async function measure(settings: { rounds: number; attempts: number }, ports: {
  http: number;
  https: number;
}): Promise<ScenarioResult[]> {
  // A store A delivery's size: its notification's payload is in it twice, as `data` and `raw`.
  const payload = JSON.stringify({ event: "renewed", data: "x".repeat(16_600) });
  const request = (url: string) => ({
    callbackUrl: url,
    payload,
    event: "renewed",
    eventId: "evt_bench",
    secrets: [SECRET],
  });
  const connections = new CallbackConnections();
  const base = { version: "dev", timeoutMs: 10_000 };
  const privateAllowed: SenderOptions = {
    ...base,
    policy: { allowHttp: true, allowPrivateNetworks: true },
    connections,
  };
  // As production checks a name: the lookup of the check, then a connection to its answer.
  // (The check itself would refuse the loopback sink; it costs microseconds.)
  const checked: SenderOptions = { ...privateAllowed, resolve: resolveHost };
  // As the dispatcher checks a name: its answer kept for 30 s.
  const checkedAndKept: SenderOptions = { ...checked, checkedAddresses: new CheckedAddresses() };
  const fetchWithout = async (url: string) =>
    (await sendWithFetch(request(url), { ...base, lookUp: false })).responseCode;
  const fetchWithLookup = async (url: string) =>
    (await sendWithFetch(request(url), { ...base, lookUp: true })).responseCode;
  const sender = (options: SenderOptions) => async (url: string) =>
    (await sendDelivery(request(url), options)).responseCode;
  const http = `http://localhost:${ports.http}/hooks`;
  const https = `https://localhost:${ports.https}/hooks`;
  const scenarios: Scenario[] = [
    {
      name: "http, address",
      url: `http://127.0.0.1:${ports.http}/hooks`,
      before: fetchWithout,
      now: sender(privateAllowed),
    },
    { name: "http, name, unchecked", url: http, before: fetchWithout, now: sender(privateAllowed) },
    {
      name: "https, name, unchecked",
      url: https,
      before: fetchWithout,
      now: sender(privateAllowed),
    },
    { name: "http, name, checked", url: http, before: fetchWithLookup, now: sender(checked) },
    { name: "https, name, checked", url: https, before: fetchWithLookup, now: sender(checked) },
    {
      name: "https, name, checked, answer kept",
      url: https,
      before: fetchWithLookup,
      now: sender(checkedAndKept),
    },
  ];
  const perSlice = Math.ceil(settings.attempts / SLICES);
  const results: ScenarioResult[] = [];
  try {
    for (const scenario of scenarios) {
      for (const send of [scenario.before, scenario.now]) {
        await run(send, scenario.url, 200, CONCURRENCY);
      }
      const rounds: ScenarioResult["rounds"] = [];
      for (let round = 0; round < settings.rounds; round++) {
        // Within a round the two alternate in slices, so that a burst of other work on the
        // machine falls on both.
        const latencies = { before: [] as number[], now: [] as number[] };
        const seconds = { before: 0, now: 0 };
        const cpuMicros = { before: 0, now: 0 };
        for (let slice = 0; slice < SLICES; slice++) {
          const order = (round + slice) % 2 === 0
            ? ["before", "now"] as const
            : ["now", "before"] as const;
          for (const which of order) {
            const send = scenario[which];
            const alone = Math.ceil(Math.min(500, settings.attempts) / SLICES);
            latencies[which].push(...await run(send, scenario.url, alone, 1));
            const started = performance.now();
            const cpu = process.cpuUsage();
            await run(send, scenario.url, perSlice, CONCURRENCY);
            const used = process.cpuUsage(cpu);
            seconds[which] += (performance.now() - started) / 1000;
            cpuMicros[which] += used.user + used.system;
          }
        }
        const figures = {
          before: {
            sequentialMedianMs: median(latencies.before),
            concurrentPerSecond: (perSlice * SLICES) / seconds.before,
            cpuMicrosPerAttempt: cpuMicros.before / (perSlice * SLICES),
          },
          now: {
            sequentialMedianMs: median(latencies.now),
            concurrentPerSecond: (perSlice * SLICES) / seconds.now,
            cpuMicrosPerAttempt: cpuMicros.now / (perSlice * SLICES),
          },
        };
        rounds.push({ before: figures.before!, now: figures.now! });
        writeProgress(
          `${scenario.name} round ${round + 1}: before ${
            figures.before!.concurrentPerSecond.toFixed(0)
          }/s, now ${figures.now!.concurrentPerSecond.toFixed(0)}/s`,
        );
      }
      results.push({
        scenario: scenario.name,
        rounds,
        latencyRatio: median(
          rounds.map((r) => r.now.sequentialMedianMs / r.before.sequentialMedianMs),
        ),
        throughputRatio: median(
          rounds.map((r) => r.now.concurrentPerSecond / r.before.concurrentPerSecond),
        ),
        cpuRatio: median(
          rounds.map((r) => r.now.cpuMicrosPerAttempt / r.before.cpuMicrosPerAttempt),
        ),
      });
    }
  } finally {
    connections.close();
  }
  return results;
}

/** Makes `count` attempts, `concurrency` at a time; returns each one's milliseconds. */
async function run(send: AttemptFn, url: string, count: number, concurrency: number) {
  const latencies: number[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < count) {
      next++;
      const started = performance.now();
      const status = await send(url);
      latencies.push(performance.now() - started);
      if (status !== 200) throw new Error(`${url} answered ${status}`);
    }
  }));
  return latencies;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/** The sink: http and https on loopback, 200 to every POST once its body is read. */
async function sink(certPath: string, keyPath: string): Promise<void> {
  const handler = async (request: Request) => {
    await request.arrayBuffer();
    return new Response('{"ok":true}', { headers: { "content-type": "application/json" } });
  };
  const http = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
  const https = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    cert: await Deno.readTextFile(certPath),
    key: await Deno.readTextFile(keyPath),
    onListen: () => {},
  }, handler);
  console.log(JSON.stringify({ http: http.addr.port, https: https.addr.port }));
  await Promise.all([http.finished, https.finished]);
}

/** The markdown table of the results. */
export function formatCallbackSenderTable(results: ScenarioResult[]): string {
  const rows = results.flatMap((result) => {
    const middle = (which: "before" | "now", key: keyof Measure) =>
      median(result.rounds.map((round) => round[which][key]));
    const figures = (which: "before" | "now") => [
      middle(which, "sequentialMedianMs").toFixed(3),
      middle(which, "concurrentPerSecond").toFixed(0),
      middle(which, "cpuMicrosPerAttempt").toFixed(0),
    ];
    return [
      [result.scenario, "fetch", ...figures("before"), "", "", ""],
      [
        "",
        "the service's client",
        ...figures("now"),
        result.latencyRatio.toFixed(2),
        result.throughputRatio.toFixed(2),
        result.cpuRatio.toFixed(2),
      ],
    ];
  });
  return formatTable([
    { header: "callback" },
    { header: "sender" },
    { header: "alone, median ms", numeric: true },
    { header: "32 at a time, /s", numeric: true },
    { header: "CPU µs per attempt", numeric: true },
    { header: "latency vs fetch", numeric: true },
    { header: "throughput vs fetch", numeric: true },
    { header: "CPU vs fetch", numeric: true },
  ], rows);
}

async function main(args: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      rounds: { type: "string" },
      attempts: { type: "string" },
      json: { type: "boolean" },
      cert: { type: "string" },
      key: { type: "string" },
      "http-port": { type: "string" },
      "https-port": { type: "string" },
    },
  });
  const settings = {
    rounds: Number(values.rounds ?? 3),
    attempts: Number(values.attempts ?? 2000),
  };
  if (positionals[0] === "sink") return await sink(values.cert!, values.key!);
  if (positionals[0] === "measure") {
    const ports = { http: Number(values["http-port"]), https: Number(values["https-port"]) };
    console.log(JSON.stringify(await measure(settings, ports)));
    return;
  }

  const dir = await Deno.makeTempDir({ prefix: "bench-callback-" });
  try {
    const certificates = await createTlsTestCertificates(["localhost"]);
    const paths = {
      ca: join(dir, "ca.pem"),
      cert: join(dir, "cert.pem"),
      key: join(dir, "key.pem"),
    };
    await Deno.writeTextFile(paths.ca, certificates.caPem);
    await Deno.writeTextFile(paths.cert, certificates.certPem);
    await Deno.writeTextFile(paths.key, certificates.keyPem);
    const self = new URL(import.meta.url).pathname;
    const server = spawnPinned({
      core: 1,
      args: [
        "run",
        "--allow-net",
        "--allow-read",
        self,
        "sink",
        "--cert",
        paths.cert,
        "--key",
        paths.key,
      ],
      env: {},
      stdoutPath: join(dir, "sink.out"),
      stderrPath: join(dir, "sink.err"),
    });
    try {
      let ports: { http: number; https: number } | undefined;
      for (let i = 0; i < 600 && ports === undefined; i++) {
        const text = await Deno.readTextFile(server.stdoutPath).catch(() => "");
        if (text.includes("\n")) ports = JSON.parse(text.split("\n")[0]);
        else await new Promise((resolve) => setTimeout(resolve, 100));
      }
      if (ports === undefined) throw new Error("the sink did not start");
      const measurer = spawnPinned({
        core: 0,
        args: [
          "run",
          "--allow-net",
          "--allow-read",
          "--allow-env",
          self,
          "measure",
          "--rounds",
          String(settings.rounds),
          "--attempts",
          String(settings.attempts),
          "--http-port",
          String(ports.http),
          "--https-port",
          String(ports.https),
        ],
        env: { DENO_CERT: paths.ca },
        stdoutPath: join(dir, "measure.out"),
        stderrPath: join(dir, "measure.err"),
      });
      const status = await measurer.status;
      const stderr = await Deno.readTextFile(measurer.stderrPath);
      Deno.stderr.writeSync(new TextEncoder().encode(stderr));
      if (!status.success) throw new Error(`the measurement failed (exit ${status.code})`);
      const results: ScenarioResult[] = JSON.parse(await Deno.readTextFile(measurer.stdoutPath));
      console.log(formatCallbackSenderTable(results));
      if (values.json) console.log(JSON.stringify(results, null, 2));
    } finally {
      await stop(server);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) await main(Deno.args);
