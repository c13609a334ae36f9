/**
 * An open-loop load generator in the manner of wrk2 (which Debian does not package; `wrk` itself
 * is closed loop): requests are due at fixed times, `rate` per second, whether or not earlier ones
 * have been answered, and each latency is measured from the request's due time, not from when it
 * was sent. A server that stalls pays for every request that fell due during the stall (no
 * coordinated omission); so does any lateness of the generator itself, which it reports
 * (`sendLag*`) and which weighs the same on every server it measures.
 *
 * Like wrk2 it keeps a fixed pool of keep-alive HTTP/1.1 connections, opened before the first
 * request: a request that falls due waits for an idle connection, and that wait is part of its
 * latency. It speaks HTTP over `node:net` rather than through an HTTP client, which keeps its own
 * cost per request to a few microseconds: Deno's `fetch` could not keep 5,000 requests per second
 * on a core of the development machine. Answers must carry `Content-Length` (the service and the
 * baselines answer so); each is checked as the wrk scripts check them: status 200 and `marker` in
 * the body.
 *
 * It runs under Node.js as its own process (`bench/verify.ts` pins it to the load core), reads one
 * JSON configuration from its first argument and prints one JSON line of results on stdout:
 *
 *     node bench/open_loop.mjs '{"url":"http://127.0.0.1:8080/v1/storea/verify","rate":2000,...}'
 *
 * Configuration: `url`; `headers` (besides `content-type: application/json`); request `i`'s body
 * is `bodyPrefix + idPrefix + pad9((idStart + i) mod idCount) + idSuffix + bodySuffix`, or, with
 * `bodiesFile` (one body per line, for bodies that cannot be templated, such as signed
 * notifications), line `i mod lines` of that file; `marker`;
 * `rate` (requests per second); `warmupSeconds` (sent at the rate, not measured), `seconds` (the
 * measured window, right after); `connections` (100 by default).
 *
 * Results: `requests` due in the measured window, `good` and `bad` answers among them,
 * `firstWrong`, latency percentiles `p50Ms`, `p90Ms`, `p99Ms`, `p999Ms`, `maxMs`, the
 * generator's lateness `sendLagP99Ms` and `sendLagMaxMs`, the most requests `maxInFlight` at once,
 * and `cpuSeconds`, the generator's own CPU time.
 * @module
 */
import { readFileSync } from "node:fs";
import net from "node:net";
import { performance } from "node:perf_hooks";

/** How long to wait for the last answers after the last request fell due. */
const DRAIN_MS = 30_000;
const HEADER_END = Buffer.from("\r\n\r\n");

/** Runs one open-loop load; resolves with the results described in the module's doc. */
export async function runOpenLoop(config) {
  const url = new URL(config.url);
  const interval = 1000 / config.rate;
  const warmup = Math.round(config.rate * config.warmupSeconds);
  const measured = Math.round(config.rate * config.seconds);
  const total = warmup + measured;
  const latencies = new Float64Array(measured).fill(NaN);
  const lags = new Float64Array(measured);
  const headerLines = Object.entries({
    ...config.headers,
    "content-type": "application/json",
    host: url.host,
  }).map(([name, value]) => `${name}: ${value}\r\n`).join("");
  const bodies = config.bodiesFile === undefined
    ? null
    : readFileSync(config.bodiesFile, "utf8").split("\n").filter((line) => line !== "");
  const requestBytes = (i) => {
    if (bodies !== null) {
      const body = Buffer.from(bodies[i % bodies.length]);
      return Buffer.concat([
        Buffer.from(
          `POST ${url.pathname} HTTP/1.1\r\n${headerLines}content-length: ${body.length}\r\n\r\n`,
        ),
        body,
      ]);
    }
    const id = config.idPrefix +
      String((config.idStart + i) % config.idCount).padStart(9, "0") + config.idSuffix;
    const body = Buffer.from(config.bodyPrefix + id + config.bodySuffix);
    return Buffer.concat([
      Buffer.from(
        `POST ${url.pathname} HTTP/1.1\r\n${headerLines}content-length: ${body.length}\r\n\r\n`,
      ),
      body,
    ]);
  };
  const marker = Buffer.from(config.marker);

  let good = 0;
  let bad = 0;
  let answered = 0;
  let firstWrong = null;
  let inFlight = 0;
  let maxInFlight = 0;
  const queue = []; // indexes of due requests waiting for a connection
  const idle = [];
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));

  const record = (i, ok, what) => {
    const kept = i - warmup;
    inFlight--;
    answered++;
    if (kept >= 0) {
      latencies[kept] = performance.now() - due(i);
      if (ok) good++;
      else {
        bad++;
        firstWrong ??= String(what).slice(0, 300);
      }
    }
    if (answered === total) finish();
  };
  const due = (i) => start + i * interval;

  /** One keep-alive connection: sends a request, reads its answer, takes the next. */
  const open = () =>
    new Promise((resolve, reject) => {
      const socket = net.connect({ host: url.hostname, port: Number(url.port) });
      socket.setNoDelay(true);
      let current = -1;
      let chunks = [];
      let length = 0;
      const connection = {
        socket,
        send(i) {
          current = i;
          socket.write(requestBytes(i));
        },
      };
      socket.on("connect", () => resolve(connection));
      socket.on("error", (error) => {
        if (current === -1) reject(error);
        else {
          const i = current;
          current = -1;
          record(i, false, error);
        }
      });
      socket.on("data", (chunk) => {
        chunks.push(chunk);
        length += chunk.length;
        const buffer = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, length);
        chunks = [buffer];
        const headerEnd = buffer.indexOf(HEADER_END);
        if (headerEnd === -1) return;
        const head = buffer.subarray(0, headerEnd).toString("latin1");
        const declared = /\r\ncontent-length:\s*(\d+)/i.exec(head);
        if (declared === null) {
          const i = current;
          current = -1;
          record(i, false, `an answer without content-length: ${head}`);
          socket.destroy();
          return;
        }
        const end = headerEnd + 4 + Number(declared[1]);
        if (buffer.length < end) return;
        const status = Number(head.slice(9, 12));
        const body = buffer.subarray(headerEnd + 4, end);
        const i = current;
        current = -1;
        chunks = buffer.length > end ? [buffer.subarray(end)] : [];
        length = buffer.length - end;
        record(
          i,
          status === 200 && body.includes(marker),
          `${status} ${body.toString("utf8")}`,
        );
        const next = queue.shift();
        if (next === undefined) idle.push(connection);
        else connection.send(next);
      });
    });

  const connections = await Promise.all(
    Array.from({ length: config.connections ?? 100 }, open),
  );
  idle.push(...connections);

  const cpuBefore = process.cpuUsage();
  const start = performance.now();
  let next = 0;
  const tick = () => {
    const now = performance.now();
    // Everything due by now leaves now; its latency still counts from its own due time.
    while (next < total && due(next) <= now) {
      const kept = next - warmup;
      if (kept >= 0) lags[kept] = now - due(next);
      inFlight++;
      if (inFlight > maxInFlight) maxInFlight = inFlight;
      const connection = idle.pop();
      if (connection === undefined) queue.push(next);
      else connection.send(next);
      next++;
    }
    if (next < total) setTimeout(tick, Math.max(0, due(next) - performance.now()));
  };
  tick();
  let timer;
  await Promise.race([
    finished,
    new Promise((resolve) => (timer = setTimeout(resolve, total * interval + DRAIN_MS))),
  ]);
  clearTimeout(timer);
  const cpu = process.cpuUsage(cpuBefore);
  for (const connection of connections) connection.socket.destroy();

  const times = [...latencies].filter((latency) => !Number.isNaN(latency));
  const unanswered = measured - times.length;
  if (unanswered > 0) {
    bad += unanswered;
    firstWrong ??= `${unanswered} requests unanswered ${DRAIN_MS} ms after the last fell due`;
  }
  return {
    rate: config.rate,
    requests: measured,
    good,
    bad,
    firstWrong,
    p50Ms: percentile(times, 50),
    p90Ms: percentile(times, 90),
    p99Ms: percentile(times, 99),
    p999Ms: percentile(times, 99.9),
    maxMs: percentile(times, 100),
    sendLagP99Ms: percentile([...lags], 99),
    sendLagMaxMs: percentile([...lags], 100),
    maxInFlight,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
  };
}

/** The `p`-th percentile of `values`, interpolated as `percentile` of bench/support.ts does. */
function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const rank = (p / 100) * (sorted.length - 1);
  const below = Math.floor(rank);
  const above = Math.ceil(rank);
  return sorted[below] + (sorted[above] - sorted[below]) * (rank - below);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const result = await runOpenLoop(JSON.parse(process.argv[2]));
  console.log(JSON.stringify(result));
  process.exit(0);
}
