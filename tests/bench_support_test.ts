/**
 * The pure helpers of bench/support.ts, bench/report.ts and bench/gateway.ts with plain inputs,
 * and scanStdout on a real file.
 */
import assert from "node:assert/strict";
import {
  formatComparisonTable,
  formatTable,
  loadOptionsFromFlags,
  loadSettings,
  parseCheckedAnswers,
  parseWrk,
  pct,
  percentile,
  scanStdout,
  spread,
  WRK_CHECKED_ANSWERS_LUA,
} from "../bench/support.ts";
import {
  formatDate,
  formatRunCaption,
  MarkerError,
  markers,
  replaceSection,
  replaceSections,
} from "../bench/report.ts";
import { commandLine, parseOnly } from "../bench/all.ts";
import {
  countsDelta,
  type GatewayEndpointResult,
  judgeAgainstVerify,
  unexpectedCalls,
  verdictsOf,
} from "../bench/gateway.ts";

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
  assert.equal(
    formatComparisonTable(comparison),
    [
      "| server  | req/s | p50 ms | p99 ms | peak RSS MB | req/s vs baseline | p99 vs baseline |",
      "| ------- | ----: | -----: | -----: | ----------: | ----------------: | --------------: |",
      "| bare    |  1000 |   1.00 |   2.00 |        50.0 |              1.00 |            1.00 |",
      "| service |    12 |   3.46 |   5.00 |        80.3 |              0.01 |            2.50 |",
    ].join("\n"),
  );
  assert.deepEqual(
    formatComparisonTable(comparison, { rpsRatioDigits: 3 }).split("\n").slice(2).map((row) =>
      row.split("|").at(-3)!.trim()
    ),
    ["1.000", "0.012"],
  );
});

Deno.test("formatTable pads every column to its widest cell, numbers to the right", () => {
  assert.equal(
    formatTable([{ header: "a" }, { header: "mean µs", numeric: true }], [["long name", "7"]]),
    [
      "| a         | mean µs |",
      "| --------- | ------: |",
      "| long name |       7 |",
    ].join("\n"),
  );
  assert.throws(() => formatTable([{ header: "a" }], [["1", "2"]]), /2 cells for 1 columns/);
});

Deno.test("percentile interpolates between ranks; spread gives min, median and max", () => {
  assert.equal(percentile([5, 1, 3], 50), 3);
  assert.equal(percentile([4, 1, 3, 2], 50), 2.5);
  assert.equal(percentile([10, 20], 99), 19.9);
  assert.equal(percentile([7], 99), 7);
  assert.ok(Number.isNaN(percentile([], 50)));
  assert.throws(() => percentile([1], 101), RangeError);
  assert.deepEqual(spread([30, 10, 20, 40]), { min: 10, median: 25, max: 40 });
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

const PAGE = [
  "# Benchmarks",
  "",
  "Prose that stays.",
  "",
  "<!-- bench:health:begin -->",
  "",
  "| old | table |",
  "",
  "<!-- bench:health:end -->",
  "",
  "More prose, with <!-- a comment --> kept.",
  "<!-- bench:cold-start:begin -->",
  "<!-- bench:cold-start:end -->",
  "",
].join("\n");

Deno.test("replaceSection replaces what is between one marker pair and nothing else", () => {
  const rewritten = replaceSection(PAGE, "health", "\n| new | table |\n| --- | ----- |\n");
  assert.equal(
    rewritten,
    PAGE.replace("| old | table |", "| new | table |\n| --- | ----- |"),
  );
  // Every character outside the pair is as it was.
  const { begin, end } = markers("health");
  const outside = (page: string) =>
    page.slice(0, page.indexOf(begin)) + page.slice(page.indexOf(end));
  assert.equal(outside(rewritten), outside(PAGE));
  // Doing it again with the same content changes nothing.
  assert.equal(replaceSection(rewritten, "health", "| new | table |\n| --- | ----- |"), rewritten);
});

Deno.test("replaceSection fills an empty pair and empties a full one", () => {
  const filled = replaceSection(PAGE, "cold-start", "text");
  assert.ok(
    filled.includes("<!-- bench:cold-start:begin -->\n\ntext\n\n<!-- bench:cold-start:end -->"),
  );
  assert.equal(replaceSection(filled, "cold-start", "  \n"), PAGE);
});

Deno.test("replaceSection fails clearly on a missing, repeated or reversed marker", () => {
  assert.throws(
    () => replaceSection(PAGE, "relay", "x"),
    (error: unknown) =>
      error instanceof MarkerError && error.code === "BENCH_MARKER" &&
      error.message.includes("the page has no <!-- bench:relay:begin -->"),
  );
  assert.throws(
    () => replaceSection(PAGE.replace("<!-- bench:health:end -->", ""), "health", "x"),
    /the page has no <!-- bench:health:end -->/,
  );
  assert.throws(
    () => replaceSection(`${PAGE}<!-- bench:health:begin -->\n`, "health", "x"),
    /<!-- bench:health:begin --> more than once/,
  );
  const reversed = "<!-- bench:jws:end -->\n<!-- bench:jws:begin -->\n";
  assert.throws(() => replaceSection(reversed, "jws", "x"), /comes before/);
  assert.throws(() => markers("Health table"), MarkerError);
});

Deno.test("replaceSections rewrites several pairs, or none when one is missing", () => {
  const rewritten = replaceSections(PAGE, { health: "A", "cold-start": "B" });
  assert.ok(rewritten.includes("begin -->\n\nA\n\n<!--"));
  assert.ok(rewritten.includes("begin -->\n\nB\n\n<!--"));
  assert.throws(() => replaceSections(PAGE, { health: "A", relay: "B" }), MarkerError);
});

Deno.test("formatRunCaption says when, at what commit, by what command and where", () => {
  assert.equal(formatDate("2026-11-21T09:09:59.123Z"), "2026-11-21 09:09 UTC");
  assert.throws(() => formatDate("yesterday"), RangeError);
  assert.equal(
    formatRunCaption({
      startedAt: "2026-11-21T09:09:00Z",
      command: "deno task bench --only health",
      commit: "454b900",
      machine: "2 cores, linux 6.18.0 x86_64, Deno 2.9.6",
      busyBefore: { serverCore: 0.031, loadCore: 0.004 },
    }),
    "Last run: 2026-11-21 09:09 UTC, commit 454b900, `deno task bench --only health`, on 2 " +
      "cores, linux 6.18.0 x86_64, Deno 2.9.6. Cores 0 and 1 were 3% and 0% busy in the second " +
      "before it began.",
  );
});

Deno.test("commandLine names the run's flags but not the page's path", () => {
  assert.equal(commandLine([]), "deno task bench");
  assert.equal(
    commandLine(["--only", "relay", "--doc", "/home/someone/checkout/docs/benchmarks.md"]),
    "deno task bench --only relay",
  );
  assert.equal(
    commandLine(["--doc=/tmp/page.md", "--duration", "2"]),
    "deno task bench --duration 2",
  );
});

Deno.test("parseOnly keeps the run order and refuses unknown names", () => {
  assert.deepEqual(parseOnly(undefined), [
    "health",
    "verify",
    "gateway",
    "jws",
    "forged",
    "relay",
    "relay-embedded",
    "cold-start",
  ]);
  assert.deepEqual(parseOnly("cold-start, health,health"), ["health", "cold-start"]);
  assert.throws(() => parseOnly("health,verfy"), /--only takes .*got "health,verfy"/);
  assert.throws(() => parseOnly(","), /--only/);
});

Deno.test("bench support: the checked-answers Lua prints what parseCheckedAnswers reads", () => {
  // The format string and the parser must stay in step: both live in bench/support.ts.
  assert.match(WRK_CHECKED_ANSWERS_LUA, /"checked: good %d bad %d wrapped %d next %d\\n"/);
  const text = "Requests/sec: 1.00\nchecked: good 97 bad 3 wrapped 0 next 4096\n" +
    'first wrong: 500 {"valid":false}\n';
  assert.deepEqual(parseCheckedAnswers(text), {
    checkedGood: 97,
    checkedBad: 3,
    wrapped: 0,
    nextBase: 4096,
    firstWrong: '500 {"valid":false}',
  });
  assert.equal(parseCheckedAnswers("checked: good 1 bad 0 wrapped 2 next 3\n").firstWrong, null);
  assert.throws(() => parseCheckedAnswers("checked: good 1 bad 0\n"), /no check counts/);
});

Deno.test("judgeAgainstVerify: within 10% of verify's ratios meets the goal, beyond does not", () => {
  const verify = { endpoint: "POST /v1/storeb/verify", rpsRatio: 0.5, p99Ratio: 2 };
  const judge = (rpsRatio: number, p99Ratio: number) =>
    judgeAgainstVerify({ endpoint: "POST /v1/storeb/consume", rpsRatio, p99Ratio }, verify);
  const close = judge(0.46, 2.18);
  assert.deepEqual([close.rpsMet, close.p99Met], [true, true]);
  assert.ok(Math.abs(close.minRpsRatio - 0.45) < 1e-9);
  assert.ok(Math.abs(close.maxP99Ratio - 2.2) < 1e-9);
  const far = judge(0.44, 2.3);
  assert.deepEqual([far.rpsMet, far.p99Met], [false, false]);
  // Doing better than verify (more req/s, a lower p99) always meets it.
  const better = judge(0.9, 1.1);
  assert.deepEqual([better.rpsMet, better.p99Met], [true, true]);
  assert.equal(better.verify, "POST /v1/storeb/verify");
});

Deno.test("verdictsOf judges each new endpoint against its own store's verify", () => {
  const result = (
    endpoint: string,
    store: "storea" | "storeb",
    rps: number,
    p99: number,
  ) =>
    ({
      endpoint,
      store,
      isVerify: endpoint.endsWith("/verify"),
      rpsRatio: { rounds: [rps], median: rps },
      p99Ratio: { rounds: [p99], median: p99 },
    }) as unknown as GatewayEndpointResult;
  const verdicts = verdictsOf([
    result("POST /v1/storea/verify", "storea", 0.3, 5),
    result("POST /v1/storea/history", "storea", 0.28, 5.4),
    result("POST /v1/storeb/verify", "storeb", 0.6, 2),
    result("POST /v1/storeb/acknowledge", "storeb", 0.5, 2),
  ]);
  assert.deepEqual(
    verdicts.map((v) => [v.endpoint, v.verify, v.rpsMet, v.p99Met]),
    [
      ["POST /v1/storea/history", "POST /v1/storea/verify", true, true],
      ["POST /v1/storeb/acknowledge", "POST /v1/storeb/verify", false, true],
    ],
  );
  assert.throws(
    () => verdictsOf([result("POST /v1/storea/history", "storea", 0.3, 5)]),
    /no verify of storea/,
  );
});

Deno.test("verdictsOf judges the floor ratios too, where the endpoint and its verify have them", () => {
  const result = (endpoint: string, rps: number, floorRps: number | null) =>
    ({
      endpoint,
      store: "storea",
      isVerify: endpoint.endsWith("/verify"),
      rpsRatio: { rounds: [rps], median: rps },
      p99Ratio: { rounds: [5], median: 5 },
      floorRpsRatio: floorRps === null ? null : { rounds: [floorRps], median: floorRps },
      floorP99Ratio: floorRps === null ? null : { rounds: [2], median: 2 },
    }) as unknown as GatewayEndpointResult;
  const [history, consumption] = verdictsOf([
    result("POST /v1/storea/verify", 0.3, 0.5),
    // Five JWS: far from verify beside the bare proxy, as near as verify beside its floor.
    result("POST /v1/storea/history", 0.2, 0.48),
    result("POST /v1/storea/consumption", 0.3, null),
  ]);
  assert.equal(history.rpsMet, false);
  assert.deepEqual(
    [history.floor?.rpsRatio, history.floor?.verifyRpsRatio, history.floor?.rpsMet],
    [0.48, 0.5, true],
  );
  assert.equal(history.floor?.p99Met, true);
  assert.equal(consumption.floor, undefined);
});

Deno.test("unexpectedCalls wants each call once per answered request, no other call", () => {
  const calls = ["product_read", "product_consume"];
  const check = (upstreamCalls: Record<string, number>) =>
    unexpectedCalls({ answered: 1000, upstreamCalls }, calls, 100);
  assert.deepEqual(check({ product_read: 1000, product_consume: 1000 }), []);
  // Requests in flight when each of the two wrk runs stopped reached the upstream unanswered.
  assert.deepEqual(check({ product_read: 1200, product_consume: 1150 }), []);
  // A write skipped (the purchase read as consumed already) is not the case measured.
  assert.deepEqual(check({ product_read: 1000, product_consume: 999 }), [
    "999 product_consume calls for 1000 answered requests (expected 1000 to 1200)",
  ]);
  assert.deepEqual(check({ product_read: 2000, product_consume: 1000 }), [
    "2000 product_read calls for 1000 answered requests (expected 1000 to 1200)",
  ]);
  assert.deepEqual(check({ product_read: 1000, product_consume: 1000, subscription_read: 2 }), [
    "2 unexpected subscription_read calls",
  ]);
});

Deno.test("countsDelta keeps the counts that changed between two readings", () => {
  assert.deepEqual(
    countsDelta({ history: 10, transaction: 5 }, { history: 30, transaction: 5, consumption: 4 }),
    { history: 20, consumption: 4 },
  );
  assert.deepEqual(countsDelta({}, {}), {});
});
