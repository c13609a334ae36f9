/** The HTTP pipeline and the verify routes' admission checks, through a real service. */
import assert from "node:assert/strict";
import {
  createTenantWithKey,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  writeServiceAccountFile,
  writeStoreaKeyFile,
} from "./helpers/fixtures.ts";
import { rawExchange } from "./helpers/raw_http.ts";
import { BODY_TIMEOUT_MS } from "../src/http/body.ts";

import { createRequestHandler, InFlight } from "../src/http/server.ts";
import { Router } from "../src/http/router.ts";
import { Logger } from "../src/observability/log.ts";

const REQ_ID = /^req_[0-9A-HJKMNP-TV-Z]{26}$/;

function post(service: RunningService, path: string, init: {
  key?: string;
  body?: BodyInit | null;
  contentType?: string | null;
  headers?: Record<string, string>;
}): Promise<Response> {
  const headers: Record<string, string> = { ...init.headers };
  if (init.key) headers.authorization = `Bearer ${init.key}`;
  if (init.contentType !== null) headers["content-type"] = init.contentType ?? "application/json";
  return fetch(`${service.url}${path}`, { method: "POST", headers, body: init.body ?? null });
}

async function expectEnvelope(response: Response, status: number, code: string) {
  const text = await response.text();
  assert.equal(
    response.status,
    status,
    `expected ${status} ${code}, got ${response.status} ${text}`,
  );
  assert.equal(response.headers.get("content-type"), "application/json; charset=utf-8");
  assert.match(response.headers.get("x-request-id") ?? "", REQ_ID);
  assert.equal(response.headers.get("x-service-version"), "dev");
  const body = JSON.parse(text);
  assert.equal(body.valid, false);
  assert.equal(body.error, code);
  assert.equal(typeof body.message, "string");
  assert.ok(body.message.length > 0);
  return body;
}

Deno.test("http: envelope, headers and one http_request line per request", async (t) => {
  const service = await startService();
  try {
    await t.step("unknown route is 404 NOT_FOUND", async () => {
      await expectEnvelope(await fetch(`${service.url}/nope`), 404, "NOT_FOUND");
      await expectEnvelope(await fetch(`${service.url}/v1/storea/verify/x`), 404, "NOT_FOUND");
    });
    await t.step("wrong method is 405 with Allow", async () => {
      const response = await fetch(`${service.url}/health`, { method: "POST" });
      assert.equal(response.headers.get("allow"), "GET");
      await expectEnvelope(response, 405, "METHOD_NOT_ALLOWED");
      const get = await fetch(`${service.url}/v1/storeb/verify`);
      assert.equal(get.headers.get("allow"), "POST");
      await expectEnvelope(get, 405, "METHOD_NOT_ALLOWED");
    });
    await t.step("health carries both headers and a fresh request id each time", async () => {
      const a = await fetch(`${service.url}/health`);
      const b = await fetch(`${service.url}/health`);
      await a.body?.cancel();
      await b.body?.cancel();
      assert.match(a.headers.get("x-request-id")!, REQ_ID);
      assert.notEqual(a.headers.get("x-request-id"), b.headers.get("x-request-id"));
      assert.equal(a.headers.get("x-service-version"), "dev");
      assert.equal(a.headers.get("content-type"), "application/json; charset=utf-8");
    });
    await t.step("http_request has exactly the documented fields", async () => {
      const response = await fetch(`${service.url}/health?probe=1`);
      await response.body?.cancel();
      const reqId = response.headers.get("x-request-id");
      const line = await service.waitForLog((l) => l.msg === "http_request" && l.reqId === reqId);
      assert.deepEqual(Object.keys(line).sort(), [
        "latencyMs",
        "level",
        "method",
        "msg",
        "path",
        "reqId",
        "status",
        "tenantId",
        "ts",
      ]);
      assert.equal(line.level, "info");
      assert.equal(line.method, "GET");
      assert.equal(line.path, "/health");
      assert.equal(line.status, 200);
      assert.equal(line.tenantId, null);
      assert.equal(typeof line.latencyMs, "number");
      assert.ok(!Number.isNaN(Date.parse(line.ts)));
    });
    await t.step("every stdout line is JSON with ts, level and msg", async () => {
      await new Promise((r) => setTimeout(r, 50));
      for (const line of service.rawStdout().trim().split("\n")) {
        const parsed = JSON.parse(line);
        assert.equal(typeof parsed.ts, "string");
        assert.equal(typeof parsed.level, "string");
        assert.equal(typeof parsed.msg, "string");
      }
    });
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("verify routes: order of checks and body validation", async (t) => {
  const service = await startService({ env: { RATE_LIMIT_BURST: "1000" } });
  try {
    const { key, tenantId } = await createTenantWithKey(service);
    const A = "/v1/storea/verify";
    const B = "/v1/storeb/verify";
    const validB = {
      packageName: "com.example.app",
      productId: "premium",
      purchaseToken: "token",
      type: "subscription",
    };

    await t.step("without a key: 401 before the body is looked at", async () => {
      for (const path of [A, B]) {
        await expectEnvelope(
          await post(service, path, { body: "not json" }),
          401,
          "UNAUTHENTICATED",
        );
      }
    });

    await t.step("tenantId is logged once the key is known", async () => {
      const response = await post(service, A, { key, body: "{}" });
      await response.body?.cancel();
      const reqId = response.headers.get("x-request-id");
      const line = await service.waitForLog((l) => l.msg === "http_request" && l.reqId === reqId);
      assert.equal(line.tenantId, tenantId);
      assert.equal(line.status, 400);
    });

    const badBodies: [string, BodyInit | null, string | null][] = [
      ["no content type", '{"transactionId":"1"}', null],
      ["text/plain", '{"transactionId":"1"}', "text/plain"],
      ["application/jsonx", '{"transactionId":"1"}', "application/jsonx"],
      ["empty body", null, "application/json"],
      ["invalid JSON", "{", "application/json"],
      ["invalid UTF-8", new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]), "application/json"],
      ["JSON array", "[]", "application/json"],
      ["JSON null", "null", "application/json"],
      ["JSON string", '"x"', "application/json"],
      ["deep JSON", "[".repeat(8000) + "]".repeat(8000), "application/json"],
      ["deep JSON object", '{"a":'.repeat(2000) + "1" + "}".repeat(2000), "application/json"],
    ];
    for (const [name, body, contentType] of badBodies) {
      await t.step(`400 INVALID_REQUEST: ${name}`, async () => {
        for (const path of [A, B]) {
          await expectEnvelope(
            await post(service, path, { key, body, contentType }),
            400,
            "INVALID_REQUEST",
          );
        }
      });
    }

    await t.step("JSON nested deeper than 64 levels is refused for its depth", async () => {
      // Deeper documents parse, but serializing them again can overflow the stack.
      const nested = (levels: number) =>
        `{"transactionId":"1","x":${"[".repeat(levels - 1)}${"]".repeat(levels - 1)}}`;
      const deep = await expectEnvelope(
        await post(service, A, { key, body: nested(65) }),
        400,
        "INVALID_REQUEST",
      );
      assert.match(deep.message, /nests deeper than 64 levels/);
      assert.deepEqual(deep.details, { maxDepth: 64 });
      // At the limit the body is read, and refused for its unknown field.
      const within = await expectEnvelope(
        await post(service, A, { key, body: nested(64) }),
        400,
        "INVALID_REQUEST",
      );
      assert.doesNotMatch(within.message, /deeper/);
    });

    await t.step("content type with charset is accepted", async () => {
      const response = await post(service, A, {
        key,
        body: '{"transactionId":"1"}',
        contentType: "Application/JSON; charset=utf-8",
      });
      await expectEnvelope(response, 400, "CREDENTIALS_MISSING");
    });

    await t.step("store A fields: types, lengths, enum, unknown fields", async () => {
      const cases: [unknown, string][] = [
        [{}, "missing transactionId"],
        [{ transactionId: "" }, "empty"],
        [{ transactionId: "x".repeat(129) }, "too long"],
        [{ transactionId: 123 }, "number"],
        [{ transactionId: null }, "null"],
        [{ transactionId: ["1"] }, "array"],
        [{ transactionId: "1", environment: "staging" }, "bad environment"],
        [{ transactionId: "1", environment: "Production" }, "case of environment"],
        [{ transactionId: "1", extra: true }, "unknown field"],
      ];
      for (const [body, label] of cases) {
        const envelope = await expectEnvelope(
          await post(service, A, { key, body: JSON.stringify(body) }),
          400,
          "INVALID_REQUEST",
        );
        assert.ok(Array.isArray(envelope.details?.issues), label);
      }
      for (
        const body of [
          { transactionId: "x".repeat(128) },
          { transactionId: "1", environment: "production" },
          { transactionId: "1", environment: "sandbox" },
        ]
      ) {
        await expectEnvelope(
          await post(service, A, { key, body: JSON.stringify(body) }),
          400,
          "CREDENTIALS_MISSING",
        );
      }
    });

    await t.step("store B fields: types, lengths, enum, unknown fields", async () => {
      const cases: Record<string, unknown>[] = [
        { ...validB, type: "bundle" },
        { ...validB, type: undefined },
        { ...validB, packageName: "" },
        { ...validB, packageName: "p".repeat(201) },
        { ...validB, productId: "p".repeat(201) },
        { ...validB, productId: 5 },
        { ...validB, purchaseToken: "t".repeat(4097) },
        { ...validB, purchaseToken: "" },
        { ...validB, extra: 1 },
      ];
      for (const body of cases) {
        await expectEnvelope(
          await post(service, B, { key, body: JSON.stringify(body) }),
          400,
          "INVALID_REQUEST",
        );
      }
      for (
        const body of [
          { ...validB, packageName: "p".repeat(200), productId: "q".repeat(200) },
          { ...validB, purchaseToken: "t".repeat(4096), type: "product" },
        ]
      ) {
        await expectEnvelope(
          await post(service, B, { key, body: JSON.stringify(body) }),
          400,
          "CREDENTIALS_MISSING",
        );
      }
    });

    await t.step("bodies over 16 KB are refused, whatever Content-Length says", async () => {
      const big = JSON.stringify({ transactionId: "1", pad: "x".repeat(17 * 1024) });
      await expectEnvelope(await post(service, A, { key, body: big }), 400, "INVALID_REQUEST");
      // Streamed without Content-Length (chunked): the limit is counted on bytes read.
      const chunks = [
        new TextEncoder().encode('{"transactionId":"'),
        new Uint8Array(20000).fill(0x61),
      ];
      const stream = new ReadableStream({
        pull(controller) {
          const next = chunks.shift();
          if (next) controller.enqueue(next);
          else controller.close();
        },
      });
      const envelope = await expectEnvelope(
        await post(service, A, { key, body: stream }),
        400,
        "INVALID_REQUEST",
      );
      assert.match(envelope.message, /16384/);
      // A Content-Length within the limit frames exactly that many bytes: what follows is not
      // read as part of the body.
      const long = `{"transactionId":"${"a".repeat(20000)}"}`;
      const cut = await rawExchange(
        service.port,
        `POST ${A} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
          "Content-Type: application/json\r\nContent-Length: 16384\r\nConnection: close\r\n\r\n" +
          long,
      );
      assert.ok(cut, "the connection closed without an answer");
      assert.equal(cut.status, 400, cut.text);
      assert.match(cut.text, /not valid JSON/);
      // A Content-Length beside Transfer-Encoding (a request smuggling pattern) is refused, so a
      // small declared length cannot let a large chunked body through.
      const chunk = `{"transactionId":"${"a".repeat(20000)}"}`;
      const raw = await rawExchange(
        service.port,
        `POST ${A} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
          "Content-Type: application/json\r\nContent-Length: 22\r\n" +
          "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
          `${chunk.length.toString(16)}\r\n${chunk}\r\n0\r\n\r\n`,
      );
      assert.ok(raw, "the connection closed without an answer");
      assert.equal(raw.status, 400, raw.text);
      // Exactly at the limit is fine as far as size goes.
      const padded = JSON.stringify({ transactionId: "1" }).padEnd(16 * 1024, " ");
      await expectEnvelope(
        await post(service, A, { key, body: padded }),
        400,
        "CREDENTIALS_MISSING",
      );
    });

    await t.step("a body that stops arriving is a 400, not a 500", async () => {
      // Anyone may start a notification and stall: the store A receiver reads the body before it
      // looks the tenant up. The request's own deadline answered 500 and logged an error.
      const started = Date.now();
      const stalled = await rawExchange(
        service.port,
        "POST /v1/webhooks/storea/tenant_none HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
          'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"signedPayload":',
        { boundMs: BODY_TIMEOUT_MS + 4_000, untilAnswer: true },
      );
      assert.ok(stalled, "the connection closed without an answer");
      assert.equal(stalled.status, 400, stalled.text);
      const envelope = JSON.parse(stalled.text);
      assert.equal(envelope.error, "INVALID_REQUEST");
      assert.match(envelope.message, /did not arrive within 5 s/);
      assert.ok(Date.now() - started >= BODY_TIMEOUT_MS - 50);
      const line = await service.waitForLog((l) =>
        l.msg === "http_request" && l.reqId === stalled.headers.get("x-request-id")
      );
      assert.equal(line.status, 400);
      assert.equal(service.logs.filter((l) => l.level === "error").length, 0);
    });

    await t.step("credentials: each store answers for its own", async () => {
      const dir = await Deno.makeTempDir();
      try {
        const keyFile = await writeStoreaKeyFile(dir);
        const set = await service.cli(...storeaCredentialArgs(tenantId, keyFile));
        assert.equal(set.code, 0, set.stderr);
        // Credential changes are picked up within a second.
        await new Promise((r) => setTimeout(r, 1100));
        const a = await post(service, A, { key, body: '{"transactionId":"1"}' });
        assert.notEqual(a.status, 400, "store A credentials are set");
        await a.body?.cancel();
        await expectEnvelope(
          await post(service, B, { key, body: JSON.stringify(validB) }),
          400,
          "CREDENTIALS_MISSING",
        );
        const account = await writeServiceAccountFile(dir);
        const setB = await service.cli(...storebCredentialArgs(tenantId, account.path));
        assert.equal(setB.code, 0, setB.stderr);
        await new Promise((r) => setTimeout(r, 1100));
        const b = await post(service, B, { key, body: JSON.stringify(validB) });
        assert.notEqual(b.status, 400);
        await b.body?.cancel();
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    });

    await t.step("nothing secret reaches the logs", async () => {
      await new Promise((r) => setTimeout(r, 50));
      const raw = service.rawStdout();
      assert.ok(!raw.includes(key), "API key in logs");
      assert.ok(!raw.includes(key.slice(-43)), "API key body in logs");
      assert.ok(!raw.includes("PRIVATE KEY"), "key material in logs");
    });
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("pipeline: a handler that never answers gets a 500 envelope at the deadline", async () => {
  const lines: string[] = [];
  const handler = createRequestHandler({
    router: new Router([
      { method: "POST", pattern: "/stuck", handler: () => new Promise<Response>(() => {}) },
      { method: "GET", pattern: "/fast", handler: () => Promise.resolve(new Response("{}")) },
    ]),
    version: "dev",
    log: new Logger({ write: (bytes) => lines.push(new TextDecoder().decode(bytes)) }),
    deadlineMs: 200,
  });
  const started = performance.now();
  const response = await handler(new Request("http://local/stuck", { method: "POST" }));
  const elapsed = performance.now() - started;
  assert.ok(elapsed >= 190 && elapsed < 2_000, `answered after ${elapsed} ms`);
  await expectEnvelope(response, 500, "INTERNAL_ERROR");
  assert.equal((await handler(new Request("http://local/fast"))).status, 200);
  await new Promise((resolve) => setTimeout(resolve, 10)); // the logger writes after the task
  const failed = lines.join("").split("\n").filter(Boolean).map((l) => JSON.parse(l))
    .find((l) => l.msg === "request_failed");
  assert.equal(failed?.code, "INTERNAL_ERROR");
  assert.match(failed?.errorMessage ?? "", /no answer within 200 ms/);
});

Deno.test("pipeline: a synchronous route is answered synchronously, with the same headers and log", async () => {
  const lines: string[] = [];
  const inFlight = new InFlight();
  const handler = createRequestHandler({
    router: new Router([
      { method: "GET", pattern: "/sync", handler: () => new Response("{}") },
      {
        method: "GET",
        pattern: "/throws",
        handler: () => {
          throw new Error("boom");
        },
      },
      { method: "GET", pattern: "/async", handler: () => Promise.resolve(new Response("{}")) },
    ]),
    version: "dev",
    log: new Logger({ write: (bytes) => lines.push(new TextDecoder().decode(bytes)) }),
    inFlight,
    deadlineMs: 1_000,
  });
  const sync = handler(new Request("http://local/sync"));
  assert.ok(sync instanceof Response, "a synchronous route must not become a promise");
  assert.equal(sync.status, 200);
  assert.match(sync.headers.get("x-request-id") ?? "", /^req_[0-9A-HJKMNP-TV-Z]{26}$/);
  assert.equal(sync.headers.get("x-service-version"), "dev");

  const thrown = handler(new Request("http://local/throws"));
  assert.ok(thrown instanceof Response);
  await expectEnvelope(thrown, 500, "INTERNAL_ERROR");
  const missing = handler(new Request("http://local/nowhere"));
  assert.ok(missing instanceof Response);
  await expectEnvelope(missing, 404, "NOT_FOUND");

  const pending = handler(new Request("http://local/async"));
  assert.ok(pending instanceof Promise);
  assert.equal((await pending).headers.get("x-service-version"), "dev");
  // Every request left the in-flight count: draining resolves at once.
  await inFlight.drain();

  await new Promise((resolve) => setTimeout(resolve, 10)); // the logger writes after the task
  const requests = lines.join("").split("\n").filter(Boolean).map((l) => JSON.parse(l))
    .filter((l) => l.msg === "http_request");
  assert.deepEqual(requests.map((l) => [l.path, l.status]), [
    ["/sync", 200],
    ["/throws", 500],
    ["/nowhere", 404],
    ["/async", 200],
  ]);
});
