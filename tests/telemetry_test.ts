/**
 * OpenTelemetry end to end (docs/observability.md, "Telemetry"): a real service process with
 * `OTEL_DENO=true` exports OTLP/HTTP (JSON) to a receiver this test runs on loopback; the test
 * decodes what arrives and checks the spans, their attributes and parents, the metrics, the log
 * lines' trace ids, and that no secret is anywhere in the bytes received.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  databaseOf,
  type LogLine,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  writeStoreaKeyFile,
} from "./helpers/fixtures.ts";
import {
  cliOk,
  createTenantWithCallback,
  deliveryReaches,
  eventually,
  postJson,
} from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { createServiceAccount } from "../simulators/service_account.ts";
import { sampleSubscriptionPurchase, startStorebSimulator } from "../simulators/storeb_play.ts";

const BUNDLE_ID = "com.example.app";
const PACKAGE = "com.example.app"; // the package storebCredentialArgs configures
const APP_ID = 1234567890;
const ORIGINAL_TRANSACTION_ID = "1000000000000042";

/** One OTLP export request as received. */
interface Export {
  path: string;
  text: string;
  // deno-lint-ignore no-explicit-any
  json: any;
}

/** An OTLP/HTTP receiver on loopback that keeps every export. */
function startOtlpReceiver() {
  const exports: Export[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const text = await req.text();
    const path = new URL(req.url).pathname;
    assert.match(req.headers.get("content-type") ?? "", /json/);
    exports.push({ path, text, json: JSON.parse(text) });
    return new Response("{}", { headers: { "content-type": "application/json" } });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    exports,
    close: () => server.shutdown(),
  };
}

interface Attr {
  key: string;
  // deno-lint-ignore no-explicit-any
  value: any;
}

/** An attribute list as a plain object (strings, numbers, booleans). */
function attributes(list: Attr[] | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const { key, value } of list ?? []) {
    out[key] = value.stringValue ??
      (value.intValue !== undefined ? Number(value.intValue) : null) ??
      value.boolValue ?? value.doubleValue;
  }
  return out;
}

interface FlatSpan {
  name: string;
  scope: string;
  traceId: string;
  spanId: string;
  parentSpanId: string;
  attrs: Record<string, unknown>;
}

function spansOf(exports: Export[]): FlatSpan[] {
  return exports.filter((e) => e.path === "/v1/traces").flatMap((e) =>
    // deno-lint-ignore no-explicit-any
    e.json.resourceSpans.flatMap((r: any) =>
      // deno-lint-ignore no-explicit-any
      r.scopeSpans.flatMap((s: any) =>
        // deno-lint-ignore no-explicit-any
        s.spans.map((span: any) => ({
          name: span.name,
          scope: s.scope?.name,
          traceId: span.traceId,
          spanId: span.spanId,
          parentSpanId: span.parentSpanId ?? "",
          attrs: attributes(span.attributes),
        }))
      )
    )
  );
}

interface Point {
  metric: string;
  attrs: Record<string, unknown>;
  value: number;
}

/** Every data point of every metric (sums and gauges: the value; histograms: the count). */
function pointsOf(exports: Export[]): Point[] {
  return exports.filter((e) => e.path === "/v1/metrics").flatMap((e) =>
    // deno-lint-ignore no-explicit-any
    e.json.resourceMetrics.flatMap((r: any) =>
      // deno-lint-ignore no-explicit-any
      r.scopeMetrics.flatMap((s: any) =>
        // deno-lint-ignore no-explicit-any
        s.metrics.flatMap((m: any) => {
          const data = m.sum ?? m.gauge ?? m.histogram;
          // deno-lint-ignore no-explicit-any
          return (data?.dataPoints ?? []).map((p: any) => ({
            metric: m.name,
            attrs: attributes(p.attributes),
            value: Number(p.asInt ?? p.asDouble ?? p.count ?? 0),
          }));
        })
      )
    )
  );
}

function findSpan(spans: FlatSpan[], name: string, attrs: Record<string, unknown> = {}) {
  return spans.find((s) =>
    s.name === name && Object.entries(attrs).every(([k, v]) => s.attrs[k] === v)
  );
}

function hasPoint(points: Point[], metric: string, attrs: Record<string, unknown>): boolean {
  return points.some((p) =>
    p.metric === metric && p.value > 0 &&
    Object.entries(attrs).every(([k, v]) => p.attrs[k] === v)
  );
}

Deno.test("telemetry: spans, metrics and log ids reach an OTLP receiver, secrets do not", async () => {
  const otlp = startOtlpReceiver();
  const dir = await Deno.makeTempDir({ prefix: "pr-otel-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID, environment: "Production" });
  // A secret in the callback's path and query: neither may reach telemetry.
  const callbackSecret = `cbsecret-${crypto.randomUUID()}`;
  const receiver = await startCallbackReceiver({ path: `/hooks/${callbackSecret}` });
  const play = await startStorebSimulator();
  let service: RunningService | undefined;
  try {
    service = await startService({
      env: {
        ...play.serviceEnv,
        STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
        OTEL_DENO: "true",
        OTEL_SERVICE_NAME: "purchase-relay-test",
        OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
        OTEL_METRIC_EXPORT_INTERVAL: "500",
        OTEL_BSP_SCHEDULE_DELAY: "200",
        OTEL_BLRP_SCHEDULE_DELAY: "200",
      },
    });
    const { tenantId, secret: webhookSecret } = await createTenantWithCallback(
      service,
      `${receiver.url}?token=${callbackSecret}`,
    );
    const { key } = await cliOk(service, "key", "create", tenantId, "--env", "test");
    await cliOk(
      service,
      ...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)),
      "--app-id",
      String(APP_ID),
    );
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const accountFile = join(dir, "account.json");
    await Deno.writeTextFile(accountFile, account.json);
    await cliOk(service, ...storebCredentialArgs(tenantId, accountFile));

    // A store B verify: its upstream URL holds the purchase token.
    const purchaseToken = `ptok-${crypto.randomUUID()}`;
    play.addSubscription({
      packageName: PACKAGE,
      purchaseToken,
      purchase: sampleSubscriptionPurchase({}),
    });
    const verified = await postJson(`${service.url}/v1/storeb/verify`, {
      packageName: PACKAGE,
      productId: "monthly",
      purchaseToken,
      type: "subscription",
    }, { authorization: `Bearer ${key}` });
    assert.equal(verified.status, 200, JSON.stringify(verified.json));
    assert.equal(verified.json.valid, true);

    // A store A notification, delivered to the callback.
    const payload = await signer.notificationPayload({
      appAppleId: APP_ID,
      notificationType: "DID_RENEW",
      transaction: signer.sampleTransaction({ originalTransactionId: ORIGINAL_TRANSACTION_ID }),
      renewalInfo: signer.sampleRenewalInfo({}),
    });
    const signedPayload = await signer.signNotification(payload);
    const received = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
      signedPayload,
    });
    assert.equal(received.status, 200, JSON.stringify(received.json));
    const eventId = received.json.eventId;
    await receiver.waitFor(1);
    await deliveryReaches(databaseOf(service), eventId, "delivered");

    // Everything has arrived once the delivery's span and its counted attempt have.
    await eventually(
      () => {
        const spans = spansOf(otlp.exports);
        const points = pointsOf(otlp.exports);
        return findSpan(spans, "purchase_relay.delivery.attempt", {
            "purchase_relay.outcome": "delivered",
          }) &&
            hasPoint(points, "purchase_relay.delivery.attempts", {
              "purchase_relay.outcome": "delivered",
            }) &&
            hasPoint(points, "purchase_relay.delivery.lag", {})
          ? true
          : undefined;
      },
      20_000,
      "the delivery's span and metrics at the OTLP receiver",
    );
    const spans = spansOf(otlp.exports);
    const points = pointsOf(otlp.exports);

    // The verify: the request's span named after its route, the verify span, the store call.
    const request = findSpan(spans, "POST /v1/storeb/verify");
    assert.ok(request, `no request span: ${spans.map((s) => s.name).join(", ")}`);
    assert.equal(request.attrs["http.route"], "/v1/storeb/verify");
    assert.equal(request.attrs["purchase_relay.route"], "storeb-verify");
    assert.equal(request.attrs["purchase_relay.tenant_id"], tenantId);
    const verify = findSpan(spans, "purchase_relay.verify", {
      "purchase_relay.tenant_id": tenantId,
      "purchase_relay.store": "storeb",
      "purchase_relay.outcome": "valid",
    });
    assert.ok(verify);
    assert.equal(verify.parentSpanId, request.spanId);
    const storeCall = findSpan(spans, "purchase_relay.storeb.get_purchase", {
      "purchase_relay.store": "storeb",
      "purchase_relay.outcome": "200",
    });
    assert.ok(storeCall);
    assert.equal(storeCall.parentSpanId, verify.spanId);
    // Deno's own span of the store call: a child, its URL without the token.
    const upstream = spans.find((s) => s.parentSpanId === storeCall.spanId && s.scope === "deno");
    assert.ok(upstream, "no fetch span under the store call");
    assert.equal(upstream.attrs["url.path"], "/[redacted]");
    assert.equal(upstream.attrs["url.query"], undefined);

    // The notification: its request, the ingest statement, the delivery attempt.
    const webhook = findSpan(spans, "POST /v1/webhooks/storea/:tenantId", {
      "purchase_relay.tenant_id": tenantId,
    });
    assert.ok(webhook);
    assert.equal(webhook.attrs["url.path"], `/v1/webhooks/storea/${tenantId}`);
    const ingest = findSpan(spans, "purchase_relay.ingest", {
      "purchase_relay.tenant_id": tenantId,
      "purchase_relay.store": "storea",
      "purchase_relay.event": "subscription.renewed",
      "purchase_relay.outcome": "accepted",
      "purchase_relay.event_id": eventId,
    });
    assert.ok(ingest);
    assert.equal(ingest.traceId, webhook.traceId);
    const attempt = findSpan(spans, "purchase_relay.delivery.attempt", {
      "purchase_relay.tenant_id": tenantId,
      "purchase_relay.event": "subscription.renewed",
      "purchase_relay.event_id": eventId,
      "purchase_relay.attempt": 1,
      "purchase_relay.outcome": "delivered",
    });
    assert.ok(attempt);
    assert.equal(attempt.attrs["http.response.status_code"], 200);
    assert.ok(findSpan(spans, "purchase_relay.delivery.claim"));
    const record = findSpan(spans, "purchase_relay.delivery.record", {
      "purchase_relay.delivery_id": attempt.attrs["purchase_relay.delivery_id"],
    });
    assert.ok(record);
    assert.equal(record.parentSpanId, attempt.spanId);
    // The callback request under the attempt: its URL keeps neither the secret path nor query,
    // and the callback was sent the trace to continue, with this span as the parent.
    const callback = spans.find((s) => s.parentSpanId === attempt.spanId && s.name === "POST");
    assert.ok(callback, "no client span under the attempt");
    assert.match(String(callback.attrs["url.full"]), /^http:\/\/127\.0\.0\.1:\d+\/\[redacted\]$/);
    assert.equal(callback.attrs["http.response.status_code"], 200);
    assert.equal(callback.traceId, attempt.traceId);
    assert.match(
      receiver.deliveries[0].headers.traceparent ?? "",
      new RegExp(`^00-${attempt.traceId}-${callback.spanId}-0[01]$`),
    );

    // Metrics.
    assert.ok(hasPoint(points, "purchase_relay.http.requests", {
      "purchase_relay.route": "storeb-verify",
      "http.response.status_code": 200,
    }));
    assert.ok(hasPoint(points, "purchase_relay.verify.outcomes", {
      "purchase_relay.store": "storeb",
      "purchase_relay.outcome": "valid",
    }));
    assert.ok(hasPoint(points, "purchase_relay.notifications", {
      "purchase_relay.tenant_id": tenantId,
      "purchase_relay.store": "storea",
      "purchase_relay.outcome": "accepted",
    }));
    assert.ok(hasPoint(points, "purchase_relay.cache.lookups", {
      "purchase_relay.cache": "api_keys",
      result: "miss",
    }));
    for (const cache of ["tenants", "storea_chains"]) {
      assert.ok(
        hasPoint(points, "purchase_relay.cache.lookups", {
          "purchase_relay.cache": cache,
          result: "miss",
        }),
        cache,
      );
    }
    const backlog = points.filter((p) => p.metric === "purchase_relay.delivery.backlog");
    assert.deepEqual(
      [...new Set(backlog.map((p) => p.attrs["purchase_relay.state"]))].sort(),
      ["due", "pending"],
    );

    // Log lines carry the ids of the span they were written in.
    const logLine = (predicate: (line: LogLine) => boolean) => service!.logs.find(predicate);
    const verifyLine = logLine((l) => l.msg === "http_request" && l.path === "/v1/storeb/verify");
    assert.ok(verifyLine);
    assert.equal(verifyLine.trace_id, request.traceId);
    assert.equal(verifyLine.span_id, request.spanId);
    const attemptLine = logLine((l) => l.msg === "delivery_attempt" && l.eventId === eventId);
    assert.ok(attemptLine);
    assert.equal(attemptLine.trace_id, attempt.traceId);
    assert.equal(attemptLine.span_id, attempt.spanId);

    // The same lines as OTLP log records, with the ids of their span.
    const logRecords = () =>
      otlp.exports.filter((e) => e.path === "/v1/logs").flatMap((e) =>
        // deno-lint-ignore no-explicit-any
        e.json.resourceLogs.flatMap((r: any) =>
          // deno-lint-ignore no-explicit-any
          r.scopeLogs.flatMap((s: any) => s.logRecords)
        )
      );
    const verifyRecord = await eventually(
      () =>
        logRecords().find((r) => {
          const body = String(r.body?.stringValue ?? "");
          return body.includes('"msg":"http_request"') &&
            body.includes('"path":"/v1/storeb/verify"');
        }),
      10_000,
      "the verify's http_request log record",
    );
    assert.equal(verifyRecord.traceId, request.traceId);
    assert.equal(verifyRecord.spanId, request.spanId);

    // No secret anywhere in what was exported.
    const everything = otlp.exports.map((e) => e.text).join("\n");
    for (
      const secret of [
        purchaseToken,
        encodeURIComponent(purchaseToken),
        key,
        webhookSecret!,
        callbackSecret,
        ORIGINAL_TRANSACTION_ID,
        signedPayload.slice(0, 40),
      ]
    ) {
      assert.ok(!everything.includes(secret), `a secret reached telemetry: ${secret.slice(0, 12)}`);
    }
  } finally {
    if (service) await stopAndDrop(service);
    await receiver.close();
    await play.close();
    await otlp.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("telemetry: off by default, nothing is exported and log lines carry no ids", async () => {
  const otlp = startOtlpReceiver();
  // The endpoint alone does not turn it on.
  const service = await startService({
    env: { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_METRIC_EXPORT_INTERVAL: "200" },
  });
  try {
    assert.equal((await fetch(`${service.url}/health`).then((r) => r.text())).length > 0, true);
    const line = await service.waitForLog((l) => l.msg === "http_request");
    assert.equal(line.trace_id, undefined);
    await new Promise((resolve) => setTimeout(resolve, 700));
    assert.equal(otlp.exports.length, 0);
  } finally {
    await stopAndDrop(service);
    await otlp.close();
  }
});
