/**
 * The open-loop load generator of the verify benchmark (`bench/open_loop.mjs`, run under Node as
 * the benchmark runs it) against servers on loopback: it sends the requests it is asked for at
 * their rate, checks every answer, and counts a server's stall against every request that fell
 * due during it (latency from the scheduled time, not from the send), which a closed-loop
 * generator does not.
 */
import assert from "node:assert/strict";

const GENERATOR = new URL("../bench/open_loop.mjs", import.meta.url).pathname;

interface OpenLoopResult {
  requests: number;
  good: number;
  bad: number;
  firstWrong: string | null;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  maxInFlight: number;
}

/** Serves `handler` on a loopback port for the duration of `body`. */
async function withServer(
  handler: (request: Request) => Response | Promise<Response>,
  body: (url: string) => Promise<void>,
): Promise<void> {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
  try {
    await body(`http://127.0.0.1:${server.addr.port}`);
  } finally {
    await server.shutdown();
  }
}

/** Runs the generator at `rate` for 1 s (after 0.5 s of warm-up) against `url`, with `connections`. */
async function generate(url: string, rate: number, connections = 20): Promise<OpenLoopResult> {
  const config = {
    url: `${url}/v1/storeb/verify`,
    headers: { authorization: "Bearer test" },
    bodyPrefix: '{"purchaseToken":"',
    bodySuffix: '"}',
    idPrefix: "token",
    idSuffix: "",
    idStart: 0,
    idCount: 1000,
    marker: '"valid":true',
    rate,
    warmupSeconds: 0.5,
    seconds: 1,
    connections,
  };
  const output = await new Deno.Command("node", {
    args: [GENERATOR, JSON.stringify(config)],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(output.stdout);
  assert.ok(output.success, `${text}${new TextDecoder().decode(output.stderr)}`);
  return JSON.parse(text);
}

Deno.test("open loop: every request due in the window is sent and checked", async () => {
  const seen = new Set<string>();
  await withServer(async (request) => {
    const body = await request.json();
    seen.add(body.purchaseToken);
    assert.equal(request.headers.get("authorization"), "Bearer test");
    return Response.json({ valid: true });
  }, async (url) => {
    const result = await generate(url, 200);
    assert.equal(result.requests, 200);
    assert.equal(result.good, 200);
    assert.equal(result.bad, 0);
    assert.equal(result.firstWrong, null);
    assert.ok(result.p50Ms > 0 && result.p50Ms <= result.p99Ms);
  });
  // Warm-up and measured requests together, each with its own id.
  assert.equal(seen.size, 300);
});

Deno.test("open loop: a wrong answer is counted and shown", async () => {
  let answered = 0;
  await withServer(() => {
    answered++;
    return answered % 10 === 0
      ? Response.json({ valid: false }, { status: 502 })
      : Response.json({ valid: true });
  }, async (url) => {
    const result = await generate(url, 200);
    assert.equal(result.good + result.bad, result.requests);
    assert.ok(result.bad >= 15 && result.bad <= 25, `bad ${result.bad}`);
    assert.match(result.firstWrong ?? "", /^502 /);
  });
});

Deno.test("open loop: a stall counts against every request due during it", async () => {
  // One stall of 300 ms, at the 160th request: well inside the measured window, which starts
  // with the 101st (0.5 s of warm-up at 200 per second).
  let received = 0;
  let stalled = false;
  await withServer(() => {
    if (++received === 160) {
      stalled = true;
      // Blocks the whole server, as a long garbage collection would.
      const until = performance.now() + 300;
      while (performance.now() < until) { /* busy */ }
    }
    return Response.json({ valid: true });
  }, async (url) => {
    // Five connections: most requests that fall due during the stall wait in the generator.
    const result = await generate(url, 200, 5);
    assert.ok(stalled);
    assert.equal(result.good, 200);
    // About 60 requests fell due during the 300 ms. Measured from when each was due, the slowest
    // waited out nearly all of it and a tenth of the window's 200 waited over 100 ms. Measured
    // from when each was sent (a closed loop, or a generator that omits its own queue), only the
    // five on the wire would have: the stall would hide below the 90th percentile.
    assert.ok(result.maxMs >= 250, `max ${result.maxMs} ms`);
    assert.ok(result.p90Ms >= 100, `p90 ${result.p90Ms} ms`);
    assert.ok(result.maxInFlight >= 40, `at most ${result.maxInFlight} in flight`);
  });
});
