/**
 * One delivery attempt (src/delivery/sender.ts) against a real callback receiver on loopback:
 * the send-time target check (decisions.md 9), headers and signature, redirects, timeouts,
 * `Retry-After` and the 4 KB body record.
 */
import assert from "node:assert/strict";
import { retryAfterMs, sendDelivery, type SenderOptions } from "../src/delivery/sender.ts";
import { startCallbackReceiver } from "../src/simulators/callback_receiver.ts";

const SECRET = "whsec_test_secret_of_at_least_32_characters";
const request = (callbackUrl: string) => ({
  callbackUrl,
  payload: JSON.stringify({ event: "test", eventId: "evt_X" }),
  event: "test",
  eventId: "evt_X",
  secrets: [SECRET],
});
const insecure: SenderOptions = { version: "v1.2.3", timeoutMs: 1000, allowInsecure: true };
const strict = (addresses: string[]): SenderOptions => ({
  version: "v1.2.3",
  timeoutMs: 1000,
  allowInsecure: false,
  resolve: () => Promise.resolve(addresses),
});

Deno.test("sender: the target is checked at send time, its resolved addresses included", async (t) => {
  const refused = async (url: string, options: SenderOptions, pattern: RegExp) => {
    const result = await sendDelivery(request(url), options);
    assert.equal(result.responseCode, null);
    assert.match(result.error ?? "", pattern);
  };
  await t.step("http is refused unless insecure callbacks are allowed", async () => {
    await refused("http://hooks.example.com/x", strict(["93.184.216.34"]), /must use https/);
  });
  await t.step(
    "a name resolving to a private, loopback or metadata address is refused",
    async () => {
      for (const address of ["10.1.2.3", "127.0.0.1", "169.254.169.254", "192.168.0.9", "::1"]) {
        await refused(
          "https://hooks.example.com/x",
          strict(["93.184.216.34", address]),
          /resolves to/,
        );
      }
    },
  );
  await t.step(
    "literal private addresses and localhost are refused without resolving",
    async () => {
      const never: SenderOptions = {
        ...strict([]),
        resolve: () => Promise.reject(new Error("must not resolve")),
      };
      await refused("https://127.0.0.1/x", never, /private, loopback/);
      await refused("https://[::1]/x", never, /private, loopback/);
      await refused("https://localhost/x", never, /localhost/);
    },
  );
  await t.step("a name that does not resolve is refused", async () => {
    await refused("https://nowhere.example/x", strict([]), /does not resolve/);
    await refused("https://nowhere.example/x", {
      ...strict([]),
      resolve: () => Promise.reject(new Error("NXDOMAIN")),
    }, /does not resolve \(.*NXDOMAIN/);
  });
  await t.step("a resolver that never answers ends the attempt within its timeout", async () => {
    let signalled: AbortSignal | undefined;
    const started = performance.now();
    const result = await sendDelivery(request("https://hanging-dns.example/x"), {
      ...strict([]),
      timeoutMs: 300,
      resolve: (_host, signal) => {
        signalled = signal;
        return new Promise(() => {}); // ignores the signal too
      },
    });
    const elapsed = performance.now() - started;
    assert.match(result.error ?? "", /did not resolve within 300 ms/);
    assert.ok(elapsed < 2_000, `the attempt took ${Math.round(elapsed)} ms`);
    assert.ok(signalled?.aborted, "the lookup's signal was not aborted");
  });
  await t.step("a tenant without a secret is not sent to", async () => {
    const result = await sendDelivery(
      { ...request("http://127.0.0.1:9/x"), secrets: [] },
      insecure,
    );
    assert.match(result.error ?? "", /no webhook secret/);
  });
});

Deno.test("sender: one signed POST, and what came back", async (t) => {
  const receiver = await startCallbackReceiver({ secrets: [SECRET] });
  try {
    await t.step("headers and signature", async () => {
      const result = await sendDelivery(request(receiver.url), insecure);
      assert.equal(result.responseCode, 200);
      assert.equal(result.error, null);
      const [got] = receiver.deliveries;
      assert.equal(got.signatureValid, true);
      assert.equal(got.headers["user-agent"], "purchase-relay/v1.2.3");
      assert.equal(got.headers["x-service-version"], "v1.2.3");
      assert.equal(got.headers["x-service-event"], "test");
      assert.equal(got.headers["x-service-event-id"], "evt_X");
      assert.equal(got.headers["content-type"], "application/json");
      assert.equal(got.body, request(receiver.url).payload);
    });
    await t.step("a 3xx is returned as is, never followed", async () => {
      receiver.deliveries.length = 0;
      receiver.script({ status: 307, headers: { Location: `${receiver.url}?followed=1` } });
      const result = await sendDelivery(request(receiver.url), insecure);
      assert.equal(result.responseCode, 307);
      assert.equal(receiver.deliveries.length, 1);
    });
    await t.step("a slow answer times out", async () => {
      receiver.script({ delayMs: 3000 });
      const result = await sendDelivery(request(receiver.url), { ...insecure, timeoutMs: 300 });
      assert.equal(result.responseCode, null);
      assert.equal(result.error, "no answer within 300 ms");
      assert.ok(result.durationMs >= 280 && result.durationMs < 2000);
    });
    await t.step("Retry-After is read from 429 and 503 only", async () => {
      receiver.script({ status: 429, headers: { "Retry-After": "7" } });
      assert.equal((await sendDelivery(request(receiver.url), insecure)).retryAfterMs, 7000);
      receiver.script({ status: 500, headers: { "Retry-After": "7" } });
      assert.equal((await sendDelivery(request(receiver.url), insecure)).retryAfterMs, null);
    });
    await t.step("only the first 4 KB of the body is kept", async () => {
      receiver.script({ status: 500, bodyBytes: 50_000 });
      const result = await sendDelivery(request(receiver.url), insecure);
      assert.equal(result.responseBody?.length, 4096);
    });
  } finally {
    await receiver.close();
  }
});

Deno.test("sender: Retry-After as seconds or an HTTP date", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(retryAfterMs("120", now), 120_000);
  assert.equal(retryAfterMs(" 5 ", now), 5000);
  assert.equal(retryAfterMs("Thu, 01 Jan 2026 00:01:00 GMT", now), 60_000);
  assert.equal(retryAfterMs("Wed, 31 Dec 2025 23:00:00 GMT", now), 0);
  assert.equal(retryAfterMs("soon", now), null);
  assert.equal(retryAfterMs(null, now), null);
});
