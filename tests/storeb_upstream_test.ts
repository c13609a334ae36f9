/** HTTP helpers of the store B clients: deadlines, failures without URLs, Retry-After. */
import assert from "node:assert/strict";
import { requestUpstream, UpstreamUnreachable } from "../src/storeb/upstream.ts";

/** A loopback port nothing listens on. */
function closedPort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  listener.close();
  return port;
}

Deno.test("storeb upstream: a failed connection is described without its URL", async () => {
  const secret = "purchase-token-that-must-not-leak";
  const url = `http://127.0.0.1:${closedPort()}/tokens/${secret}`;
  await assert.rejects(
    requestUpstream(url, {}, AbortSignal.timeout(5_000)),
    (error) => {
      assert.ok(error instanceof UpstreamUnreachable);
      assert.equal(error.timedOut, false);
      assert.match(error.message, /refused/i, "the reason is kept");
      assert.ok(!error.message.includes(secret), error.message);
      assert.ok(!error.message.includes("127.0.0.1"), error.message);
      return true;
    },
  );
});

Deno.test("storeb upstream: the deadline covers the body, and redirects are not followed", async () => {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    if (new URL(request.url).pathname === "/moved") {
      return new Response(null, { status: 301, headers: { location: "/elsewhere" } });
    }
    let timer: ReturnType<typeof setTimeout>;
    // Headers at once, then a body that takes too long.
    const body = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode("{"));
        timer = setTimeout(() => controller.close(), 1_000);
      },
      cancel() {
        clearTimeout(timer);
      },
    });
    return new Response(body);
  });
  try {
    const base = `http://127.0.0.1:${server.addr.port}`;
    const moved = await requestUpstream(`${base}/moved`, {}, AbortSignal.timeout(5_000));
    assert.equal(moved.status, 301);
    const started = performance.now();
    await assert.rejects(
      requestUpstream(`${base}/slow`, {}, AbortSignal.timeout(200)),
      (error) => error instanceof UpstreamUnreachable && error.timedOut,
    );
    assert.ok(performance.now() - started < 900);
  } finally {
    await server.shutdown();
  }
});
