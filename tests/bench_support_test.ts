/** The pure helpers of support.ts with plain inputs, and scanStdout on a real file. */
import assert from "node:assert/strict";
import {
  formatComparisonTable,
  loadOptionsFromFlags,
  loadSettings,
  parseWrk,
  pct,
  scanStdout,
} from "../bench/support.ts";

const WRK_REPORT = `Running 10s test @ http://127.0.0.1:8080/health
  2 threads and 100 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20ms  310.00us   9.80ms   90.00%
    Req/Sec    41.00k     2.00k   45.00k    70.00%
  Latency Distribution
     50%    1.10ms
     75%    1.30ms
     90%    1.50ms
     99%    2.50s
  816000 requests in 10.00s, 120.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:  81600.00
Transfer/sec:     12.00MB
`;

Deno.test("parseWrk reads req/s, percentiles in ms and the error counts", () => {
  assert.deepEqual(parseWrk(WRK_REPORT), {
    requestsPerSecond: 81600,
    p50Ms: 1.1,
    p99Ms: 2500,
    requests: 816000,
    non2xx: 7,
    socketErrors: 5,
  });
});

Deno.test("parseWrk without --latency leaves the percentiles NaN", () => {
  const report = WRK_REPORT.replace(/ {2}Latency Distribution[\s\S]*?99%.*\n/, "");
  const figures = parseWrk(report, false);
  assert.deepEqual([figures.p50Ms, figures.p99Ms], [NaN, NaN]);
  assert.throws(() => parseWrk(report), /no p50/);
});

Deno.test("loadSettings fills in the defaults and keeps what is given", () => {
  assert.deepEqual(loadSettings({ durationSeconds: 2, keepTemp: true }), {
    durationSeconds: 2,
    warmupSeconds: 3,
    connections: 100,
    threads: 2,
    serverCore: 0,
    loadCore: 1,
  });
});

Deno.test("loadOptionsFromFlags reads the numbers and leaves what is not given undefined", () => {
  assert.deepEqual(loadOptionsFromFlags({ duration: "2", "keep-temp": true }), {
    durationSeconds: 2,
    warmupSeconds: undefined,
    keepTemp: true,
  });
});

Deno.test("formatComparisonTable sets the service beside its baseline", () => {
  const figures = { requests: 1, non2xx: 0, socketErrors: 0 };
  const comparison = {
    bare: { ...figures, name: "bare", requestsPerSecond: 1000, p50Ms: 1, p99Ms: 2, peakRssMb: 50 },
    service: {
      ...figures,
      name: "service",
      requestsPerSecond: 12.4,
      p50Ms: 3.456,
      p99Ms: 5,
      peakRssMb: 80.26,
    },
    rpsRatio: 0.0124,
    p99Ratio: 2.5,
  };
  const header = [
    "| server | req/s | p50 ms | p99 ms | peak RSS MB | req/s vs baseline | p99 vs baseline |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  assert.equal(
    formatComparisonTable(comparison),
    [
      ...header,
      "| bare | 1000 | 1.00 | 2.00 | 50.0 | 1.00 | 1.00 |",
      "| service | 12 | 3.46 | 5.00 | 80.3 | 0.01 | 2.50 |",
    ].join("\n"),
  );
  assert.equal(
    formatComparisonTable(comparison, { rpsRatioDigits: 3 }).split("\n").slice(2).join("\n"),
    [
      "| bare | 1000 | 1.00 | 2.00 | 50.0 | 1.000 | 1.00 |",
      "| service | 12 | 3.46 | 5.00 | 80.3 | 0.012 | 2.50 |",
    ].join("\n"),
  );
});

Deno.test("pct rounds a share to a whole percentage", () => {
  assert.deepEqual([pct(0), pct(0.426), pct(1)], ["0%", "43%", "100%"]);
});

Deno.test("scanStdout counts bytes and http_request lines", async () => {
  const path = await Deno.makeTempFile();
  try {
    const line = '{"level":"info","msg":"http_request","status":200}\n';
    await Deno.writeTextFile(path, `{"msg":"listening","port":1}\n${line.repeat(3)}`);
    assert.deepEqual(await scanStdout(path), {
      bytes: 29 + 3 * line.length,
      httpRequestLines: 3,
    });
  } finally {
    await Deno.remove(path);
  }
});
