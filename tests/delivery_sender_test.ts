/**
 * One delivery attempt (src/delivery/sender.ts) against a real callback receiver on loopback:
 * the send-time target check, the connection to the checked address only, headers and
 * signature, redirects, timeouts, `Retry-After`, the 4 KB body record, kept connections, and
 * errors without the URL's secrets.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { sendDelivery, type SenderOptions } from "../src/delivery/sender.ts";
import { CallbackConnections } from "../src/delivery/callback_client.ts";
import { CHECKED_ADDRESSES_TTL_MS, CheckedAddresses } from "../src/delivery/callback_target.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { scriptedCallback, text } from "./helpers/scripted_callback.ts";
import { createTlsTestCertificates } from "../simulators/tls_certificates.ts";

const SECRET = "whsec_test_secret_of_at_least_32_characters";
const SEND_CHILD = new URL("./helpers/send_delivery_child.ts", import.meta.url).pathname;
const request = (callbackUrl: string) => ({
  callbackUrl,
  payload: JSON.stringify({ event: "test", eventId: "evt_X" }),
  event: "test",
  eventId: "evt_X",
  secrets: [SECRET],
});
const open: SenderOptions = {
  version: "v1.2.3",
  timeoutMs: 1000,
  policy: { allowHttp: true, allowPrivateNetworks: true },
};
const strict = (addresses: string[]): SenderOptions => ({
  version: "v1.2.3",
  timeoutMs: 1000,
  policy: { allowHttp: false, allowPrivateNetworks: false },
  resolve: () => Promise.resolve(addresses),
});

Deno.test("sender: the target is checked at send time, its resolved addresses included", async (t) => {
  const refused = async (url: string, options: SenderOptions, pattern: RegExp) => {
    const result = await sendDelivery(request(url), options);
    assert.equal(result.responseCode, null);
    assert.match(result.error ?? "", pattern);
  };
  await t.step("http is refused unless http callbacks are allowed", async () => {
    await refused("http://hooks.example.com/x", strict(["93.184.216.34"]), /must use https/);
  });
  await t.step("a name resolving to any address that is not public is refused", async () => {
    for (
      const address of [
        "10.1.2.3",
        "127.0.0.1",
        "169.254.169.254",
        "192.168.0.9",
        "198.18.0.1",
        "100.64.0.1",
        "::1",
        "fd00::1",
        "::ffff:a9fe:a9fe",
        "::a9fe:a9fe",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        // Spellings a resolver hook could hand back are not guessed at.
        "0251.0376.0251.0376",
        "2852039166",
      ]
    ) {
      await refused(
        "https://hooks.example.com/x",
        strict(["93.184.216.34", address]),
        /hooks\.example\.com resolves to an address that is not public/,
      );
    }
  });
  await t.step(
    "literal special-purpose addresses and localhost are refused without resolving",
    async () => {
      const never: SenderOptions = {
        ...strict([]),
        resolve: () => Promise.reject(new Error("must not resolve")),
      };
      await refused("https://127.0.0.1/x", never, /not public: 127\.0\.0\.1 is in 127\.0\.0\.0\/8/);
      await refused("https://[::1]/x", never, /not public/);
      await refused("https://[64:ff9b::a9fe:a9fe]/x", never, /carries 169\.254\.169\.254/);
      await refused("https://2852039166/x", never, /169\.254\.169\.254 is in/);
      await refused("https://localhost/x", never, /localhost/);
    },
  );
  await t.step("a port of another protocol is refused, as fetch refused it", async () => {
    for (const port of [25, 6667, 10080]) {
      await refused(`http://127.0.0.1:${port}/x`, open, /port \d+ belongs to another protocol/);
    }
  });
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
      { ...request("http://127.0.0.1:8/x"), secrets: [] },
      open,
    );
    assert.match(result.error ?? "", /no webhook secret/);
  });
});

Deno.test("sender: the connection goes to the checked address, named by its host", async () => {
  const receiver = await startCallbackReceiver({ secrets: [SECRET] });
  try {
    const port = new URL(receiver.url).port;
    // No resolver of this machine knows hooks.example.test: only the hook's answer can lead
    // to the receiver, and it is asked once per attempt.
    const lookups: string[] = [];
    const options: SenderOptions = {
      ...open,
      resolve: (host) => {
        lookups.push(host);
        return Promise.resolve(["127.0.0.1"]);
      },
    };
    const result = await sendDelivery(
      request(`http://hooks.example.test:${port}/hooks?token=t`),
      options,
    );
    assert.equal(result.error, null);
    assert.equal(result.responseCode, 200);
    assert.deepEqual(lookups, ["hooks.example.test"]);
    const [got] = receiver.deliveries;
    assert.equal(got.headers.host, `hooks.example.test:${port}`);
    assert.equal(got.path, "/hooks?token=t");
    assert.equal(got.signatureValid, true);
  } finally {
    await receiver.close();
  }
});

Deno.test("sender: over TLS the checked address is named by its host for SNI and the certificate", async () => {
  const dir = await Deno.makeTempDir();
  const certificates = await createTlsTestCertificates(["hooks.example.test"]);
  const caPath = join(dir, "ca.pem");
  await Deno.writeTextFile(caPath, certificates.caPem);
  const received: (string | null)[] = [];
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    cert: certificates.certPem,
    key: certificates.keyPem,
    onListen: () => {},
    onError: () => new Response(null, { status: 500 }),
  }, (request) => {
    received.push(request.headers.get("host"));
    return new Response('{"ok":true}');
  });
  // The attempt runs in a process of its own that trusts the test CA (DENO_CERT).
  const attempt = async (url: string) => {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-net",
        "--allow-read",
        SEND_CHILD,
        JSON.stringify({ url, addresses: ["127.0.0.1"] }),
      ],
      env: {
        PATH: Deno.env.get("PATH") ?? "",
        HOME: Deno.env.get("HOME") ?? "/tmp",
        DENO_DIR: Deno.env.get("DENO_DIR") ?? join(Deno.env.get("HOME") ?? "/tmp", ".cache/deno"),
        NO_COLOR: "1",
        DENO_CERT: caPath,
      },
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    return JSON.parse(new TextDecoder().decode(output.stdout));
  };
  try {
    const port = server.addr.port;
    const delivered = await attempt(`https://hooks.example.test:${port}/hooks`);
    assert.equal(delivered.error, null);
    assert.equal(delivered.responseCode, 200);
    assert.deepEqual(received, [`hooks.example.test:${port}`]);
    // The same server reached through another name: its certificate does not name it.
    const impostor = await attempt(`https://impostor.example.test:${port}/hooks`);
    assert.equal(impostor.responseCode, null);
    assert.match(impostor.error, /impostor\.example\.test/);
    assert.equal(received.length, 1);
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("sender: a host's checked addresses are reused for a while, a refusal never", async () => {
  const receiver = await startCallbackReceiver({ secrets: [SECRET] });
  try {
    const port = new URL(receiver.url).port;
    let clock = 0;
    let answer = ["127.0.0.1"];
    const lookups: string[] = [];
    const options: SenderOptions = {
      ...open,
      checkedAddresses: new CheckedAddresses({ now: () => clock }),
      resolve: (host) => {
        lookups.push(host);
        return Promise.resolve(answer);
      },
    };
    const url = `http://hooks.example.test:${port}/hooks`;
    const codes = async (n: number) => {
      const results = [];
      for (let i = 0; i < n; i++) {
        results.push((await sendDelivery(request(url), options)).responseCode);
      }
      return results;
    };
    assert.deepEqual(await codes(3), [200, 200, 200]);
    assert.equal(lookups.length, 1, "three attempts, one lookup");
    // Past the period the name is resolved, and checked, again: here to an address that fails.
    clock += CHECKED_ADDRESSES_TTL_MS + 1;
    answer = ["10.0.0.1"];
    const strictOptions = { ...options, policy: { allowHttp: true, allowPrivateNetworks: false } };
    const refused = await sendDelivery(request(url), strictOptions);
    assert.match(refused.error ?? "", /not public: 10\.0\.0\.1/);
    // A refusal is not kept: the next attempt asks again.
    await sendDelivery(request(url), strictOptions);
    assert.equal(lookups.length, 3);
  } finally {
    await receiver.close();
  }
});

Deno.test("sender: a kept answer none of whose addresses answered is asked again", async () => {
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (closed.addr as Deno.NetAddr).port;
  closed.close();
  const lookups: string[] = [];
  const options: SenderOptions = {
    ...open,
    checkedAddresses: new CheckedAddresses(),
    resolve: (host) => {
      lookups.push(host);
      return Promise.resolve(["127.0.0.1"]);
    },
  };
  for (let i = 0; i < 2; i++) {
    const result = await sendDelivery(request(`http://moved.example.test:${port}/hooks`), options);
    assert.equal(result.responseCode, null);
  }
  assert.equal(lookups.length, 2, "each attempt after one without an answer resolves again");
});

Deno.test("sender: kept connections are reused only for the same checked addresses", async () => {
  const sockets: string[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  server.on("connection", (socket) => sockets.push(socket.localAddress ?? ""));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  const connections = new CallbackConnections();
  try {
    let answer = ["127.0.0.1"];
    const options: SenderOptions = {
      ...open,
      connections,
      resolve: () => Promise.resolve(answer),
    };
    const url = `http://hooks.example.test:${port}/hooks`;
    for (let i = 0; i < 3; i++) {
      assert.equal((await sendDelivery(request(url), options)).responseCode, 200);
    }
    assert.equal(sockets.length, 1, "three attempts, one connection");
    // Another set of checked addresses: another connection, never the kept one.
    answer = ["127.0.0.1", "::1"];
    assert.equal((await sendDelivery(request(url), options)).responseCode, 200);
    assert.equal(sockets.length, 2);
    // Without kept connections each attempt has its own.
    await sendDelivery(request(url), { ...options, connections: undefined });
    assert.equal(sockets.length, 3);
  } finally {
    connections.close();
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }
});

Deno.test("sender: a kept connection the callback dropped does not fail the attempt", async () => {
  // A callback that keeps its first connection open after answering, then drops it on the next
  // request without a byte of answer, as a server whose idle timeout just ran out does: the
  // HTTP client sends the request again on a new connection (to the same checked address).
  const callback = scriptedCallback((request, connection) =>
    connection === 0 && request === 1
      ? new Uint8Array(0)
      : text("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
  );
  const connections = new CallbackConnections();
  try {
    const options = { ...open, connections };
    assert.equal((await sendDelivery(request(callback.url), options)).responseCode, 200);
    const second = await sendDelivery(request(callback.url), options);
    assert.equal(second.error, null);
    assert.equal(second.responseCode, 200);
    assert.deepEqual(callback.requests, [2, 1]);
  } finally {
    connections.close();
    await callback.close();
  }
});

Deno.test("sender: a network error is stored without the URL's query or credentials", async () => {
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (closed.addr as Deno.NetAddr).port;
  closed.close();
  for (
    const url of [
      `http://127.0.0.1:${port}/hooks?token=s3cret-token`, // refused
      "http://callback.invalid/hooks?token=s3cret-token", // does not resolve
    ]
  ) {
    const result = await sendDelivery(request(url), open);
    assert.equal(result.responseCode, null);
    assert.ok(result.error !== null && result.error.length > 0, url);
    assert.ok(!result.error.includes("s3cret-token"), result.error);
  }
});

Deno.test("sender: one signed POST, and what came back", async (t) => {
  const receiver = await startCallbackReceiver({ secrets: [SECRET] });
  try {
    await t.step("headers and signature", async () => {
      const result = await sendDelivery(request(receiver.url), open);
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
    await t.step("where nothing is checked, the HTTP client resolves the name", async () => {
      receiver.deliveries.length = 0;
      const url = receiver.url.replace("127.0.0.1", "localhost");
      const result = await sendDelivery(request(url), open);
      assert.equal(result.error, null);
      assert.equal(result.responseCode, 200);
      assert.equal(receiver.deliveries[0].headers.host, new URL(url).host);
    });
    await t.step("a 3xx is returned as is, never followed", async () => {
      receiver.deliveries.length = 0;
      receiver.script({ status: 307, headers: { Location: `${receiver.url}?followed=1` } });
      const result = await sendDelivery(request(receiver.url), open);
      assert.equal(result.responseCode, 307);
      assert.equal(receiver.deliveries.length, 1);
    });
    await t.step("a slow answer times out", async () => {
      receiver.script({ delayMs: 3000 });
      const result = await sendDelivery(request(receiver.url), { ...open, timeoutMs: 300 });
      assert.equal(result.responseCode, null);
      assert.equal(result.error, "no answer within 300 ms");
      assert.ok(result.durationMs >= 280 && result.durationMs < 2000);
    });
    await t.step("Retry-After is read from 429 and 503 only", async () => {
      receiver.script({ status: 429, headers: { "Retry-After": "7" } });
      assert.equal((await sendDelivery(request(receiver.url), open)).retryAfterMs, 7000);
      receiver.script({ status: 500, headers: { "Retry-After": "7" } });
      assert.equal((await sendDelivery(request(receiver.url), open)).retryAfterMs, null);
      // Not a date in the past (which would mean "retry now"): no hint at all.
      receiver.script({ status: 503, headers: { "Retry-After": "-5" } });
      assert.equal((await sendDelivery(request(receiver.url), open)).retryAfterMs, null);
    });
    await t.step("only the first 4 KB of the body is kept", async () => {
      receiver.script({ status: 500, bodyBytes: 50_000 });
      const result = await sendDelivery(request(receiver.url), open);
      assert.equal(result.responseBody?.length, 4096);
    });
  } finally {
    await receiver.close();
  }
});
