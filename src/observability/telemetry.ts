/**
 * OpenTelemetry: the service's own spans and instruments, on top of what Deno exports by itself
 * when `OTEL_DENO=true` (docs/observability.md, "Telemetry"). Domain modules make one call per
 * instrument point; everything else lives here.
 *
 * Off by default. Without `OTEL_DENO=true` Deno registers no provider, `npm:@opentelemetry/api`
 * hands out its no-op tracer and meter, and {@linkcode withSpan} calls its function directly: the
 * cost is a branch and a no-op call per instrument point.
 *
 * Nothing secret reaches telemetry: attributes are ids (tenant, event, delivery), store names,
 * event names, outcome codes and HTTP statuses, never a token, a key, a purchase token, a
 * transaction id or a callback URL. Deno's own spans of `fetch` and `Deno.serve` record the
 * request's URL, which for the store B API holds the purchase token: {@linkcode redactRuntimeUrls}
 * rewrites those attributes, and the callback client's own span ({@linkcode withClientSpan})
 * records a callback's URL redacted the same way, since its path or query may hold a secret.
 * @module
 */
import {
  type Attributes,
  type Counter,
  type Histogram,
  metrics,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from "@opentelemetry/api";

const SCOPE = "purchase-relay";
const PREFIX = "purchase_relay";

/** Whether Deno registered its providers (`OTEL_DENO=true`): the API's global registration. */
export const telemetryEnabled: boolean =
  (globalThis as Record<symbol, { trace?: unknown } | undefined>)[
    Symbol.for("opentelemetry.js.api.1")
  ]?.trace !== undefined;

const tracer = trace.getTracer(SCOPE);
const meter = metrics.getMeter(SCOPE);

/** Attribute names, for the docs and the tests. */
export const ATTR = {
  tenant: `${PREFIX}.tenant_id`,
  store: `${PREFIX}.store`,
  event: `${PREFIX}.event`,
  outcome: `${PREFIX}.outcome`,
  route: `${PREFIX}.route`,
  deliveryId: `${PREFIX}.delivery_id`,
  eventId: `${PREFIX}.event_id`,
  attempt: `${PREFIX}.attempt`,
  cache: `${PREFIX}.cache`,
  state: `${PREFIX}.state`,
} as const;

const requests: Counter = meter.createCounter(`${PREFIX}.http.requests`, {
  description: "HTTP requests answered, by route name, method and status.",
});
const verifyOutcomes: Counter = meter.createCounter(`${PREFIX}.verify.outcomes`, {
  description: "Verify requests by store and outcome code (valid, a domain code or an error code).",
});
const notifications: Counter = meter.createCounter(`${PREFIX}.notifications`, {
  description:
    "Store notifications stored, by tenant, store, event and outcome (accepted, duplicate).",
});
const deliveryAttempts: Counter = meter.createCounter(`${PREFIX}.delivery.attempts`, {
  description: "Delivery attempts by tenant, event and outcome (delivered, retry, failed, ...).",
});
const deliveryLag: Histogram = meter.createHistogram(`${PREFIX}.delivery.lag`, {
  description: "Time from a notification's receipt to its delivery's 2xx answer.",
  unit: "s",
  advice: { explicitBucketBoundaries: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600] },
});
const cacheLookups: Counter = meter.createCounter(`${PREFIX}.cache.lookups`, {
  description: "Cache lookups by cache and result (hit, miss).",
});
const storeSendFailures: Counter = meter.createCounter(`${PREFIX}.store.send_failures`, {
  description:
    "Attempts of the App Store to post a notification to the service that failed, as its notification history reports them, by tenant, environment and result (TIMED_OUT, TLS_ISSUE, ...).",
});

/** One answered request: the route's name from src/api/mod.ts, or `none` when no route matched. */
export function recordRequest(route: string, method: string, status: number): void {
  if (!telemetryEnabled) return;
  requests.add(1, {
    [ATTR.route]: route,
    "http.request.method": method,
    "http.response.status_code": status,
  });
}

/**
 * Names Deno's span of the current request after its route (`POST /v1/webhooks/storea/:tenantId`)
 * and tags it with the route and, once known, the tenant.
 */
export function tagRequestSpan(route: string, method: string, pattern: string): void {
  if (!telemetryEnabled) return;
  const span = trace.getActiveSpan();
  if (span === undefined) return;
  span.updateName(`${method} ${pattern}`);
  span.setAttribute("http.route", pattern);
  span.setAttribute(ATTR.route, route);
}

/** Tags the current request's span with its tenant. */
export function tagRequestTenant(tenantId: string | null): void {
  if (!telemetryEnabled || tenantId === null) return;
  trace.getActiveSpan()?.setAttribute(ATTR.tenant, tenantId);
}

/** One verify request's outcome: `valid`, the domain failure code, or the error code. */
export function recordVerifyOutcome(store: string, outcome: string): void {
  if (!telemetryEnabled) return;
  verifyOutcomes.add(1, { [ATTR.store]: store, [ATTR.outcome]: outcome });
}

/** One stored notification: a new one (`accepted`) or a `duplicate`. */
export function recordNotification(
  tenantId: string,
  store: string,
  event: string,
  isNew: boolean,
): void {
  if (!telemetryEnabled) return;
  notifications.add(1, {
    [ATTR.tenant]: tenantId,
    [ATTR.store]: store,
    [ATTR.event]: event,
    [ATTR.outcome]: isNew ? "accepted" : "duplicate",
  });
}

/** One delivery attempt, and the lag from receipt to delivery when it delivered. */
export function recordDeliveryAttempt(
  tenantId: string,
  event: string,
  outcome: string,
  receivedAt: Date,
): void {
  if (!telemetryEnabled) return;
  deliveryAttempts.add(1, {
    [ATTR.tenant]: tenantId,
    [ATTR.event]: event,
    [ATTR.outcome]: outcome,
  });
  if (outcome === "delivered") {
    deliveryLag.record(Math.max(0, Date.now() - receivedAt.getTime()) / 1000, {
      [ATTR.event]: event,
    });
  }
}

/** A cache of the service: `hit` when answered from memory, `miss` when it had to load. */
export function recordCacheLookup(cache: string, hit: boolean): void {
  if (!telemetryEnabled) return;
  cacheLookups.add(1, { [ATTR.cache]: cache, result: hit ? "hit" : "miss" });
}

/**
 * Failed attempts of a store to post notifications to the service, `count` of them with one
 * `result` (store A's `sendAttemptResult`), each counted once (src/recovery/job.ts).
 */
export function recordStoreSendFailures(
  tenantId: string,
  environment: string,
  result: string,
  count: number,
): void {
  if (!telemetryEnabled) return;
  storeSendFailures.add(count, {
    [ATTR.tenant]: tenantId,
    [ATTR.store]: "storea",
    "purchase_relay.environment": environment,
    [ATTR.outcome]: result,
  });
}

/** The backlog the gauge reports. */
export interface Backlog {
  pending: number;
  due: number;
}

/**
 * Reports the delivery backlog (`pending` and `due` now) as an observable gauge. `read` runs a
 * query, so its answer is reused for `maxAgeMs`: however often the exporter collects, the
 * database sees at most one query per period per process. Returns what stops the reporting.
 */
export function observeBacklog(read: () => Promise<Backlog>, maxAgeMs: number): () => void {
  if (!telemetryEnabled) return () => {};
  let last: Backlog | null = null;
  let readAt = -Infinity;
  let reading = false;
  const refresh = () => {
    if (reading || performance.now() - readAt < maxAgeMs) return;
    reading = true;
    read().then((backlog) => {
      last = backlog;
      readAt = performance.now();
    }, () => {
      // The database may be down: keep the last value and try again next collection.
    }).finally(() => reading = false);
  };
  const gauge = meter.createObservableGauge(`${PREFIX}.delivery.backlog`, {
    description: "Deliveries waiting: pending (all) and due (pending whose time has come).",
  });
  const callback = (result: { observe(value: number, attributes?: Attributes): void }) => {
    refresh();
    if (last === null) return;
    result.observe(last.pending, { [ATTR.state]: "pending" });
    result.observe(last.due, { [ATTR.state]: "due" });
  };
  gauge.addCallback(callback);
  refresh();
  return () => gauge.removeCallback(callback);
}

/**
 * Runs `fn` in a span named `name` (made active, so Deno's spans of the calls it makes are its
 * children). `fn` may add attributes; a thrown error marks the span as failed and is rethrown.
 * With telemetry off, `fn` runs with no span at all.
 */
export function withSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span | null) => Promise<T>,
): Promise<T> {
  if (!telemetryEnabled) return fn(null);
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (error) {
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: error instanceof Error ? error.constructor.name : typeof error,
      });
      span.setAttribute("error.type", error instanceof Error ? error.constructor.name : "thrown");
      throw error;
    } finally {
      span.end();
    }
  });
}

/**
 * A client span for an HTTP request the service sends over its own client (the callbacks'), as
 * Deno makes one for each `fetch`: named after the method, its URL redacted as Deno's are, with the
 * answer's status; and the W3C `traceparent` header that continues the trace at the server, which
 * `fn` sends. `fn` is called directly, with no header, when telemetry is off.
 */
export function withClientSpan<T extends { status: number }>(
  method: string,
  url: URL,
  fn: (traceHeaders: Record<string, string>) => Promise<T>,
): Promise<T> {
  if (!telemetryEnabled) return fn({});
  return tracer.startActiveSpan(method, {
    kind: SpanKind.CLIENT,
    attributes: {
      "http.request.method": method,
      "url.full": redactedUrl(url.href),
      "server.address": url.hostname,
      "server.port": Number(url.port || (url.protocol === "https:" ? 443 : 80)),
    },
  }, async (span) => {
    const { traceId, spanId, traceFlags } = span.spanContext();
    const traceparent = `00-${traceId}-${spanId}-${traceFlags.toString(16).padStart(2, "0")}`;
    try {
      const answer = await fn({ traceparent });
      span.setAttribute("http.response.status_code", answer.status);
      if (answer.status >= 500) {
        span.setStatus({ code: SpanStatusCode.ERROR });
        span.setAttribute("error.type", String(answer.status));
      }
      return answer;
    } catch (error) {
      span.setStatus({ code: SpanStatusCode.ERROR });
      span.setAttribute("error.type", error instanceof Error ? error.constructor.name : "thrown");
      throw error;
    } finally {
      span.end();
    }
  });
}

/** The ids to put on a log line, when a span is active. */
export function traceFields(): { trace_id: string; span_id: string } | null {
  if (!telemetryEnabled) return null;
  const span = trace.getActiveSpan();
  if (span === undefined) return null;
  const { traceId, spanId } = span.spanContext();
  return { trace_id: traceId, span_id: spanId };
}

/** The paths that the service's own routes answer, whose URL attributes are kept. */
let ownPath: (path: string) => boolean = () => false;

/**
 * Rewrites the URL attributes that Deno's instrumentation of `fetch` and `Deno.serve` sets: `url.query` is dropped, and a path is kept only when it is one of the
 * service's own routes (`isOwnPath`); any other (a store API's, a tenant's callback) becomes
 * `/[redacted]`. Deno offers no hook for its spans' attributes, so this wraps `setAttribute` of
 * its span class, which its instrumentation calls.
 */
export function redactRuntimeUrls(isOwnPath: (path: string) => boolean): void {
  ownPath = isOwnPath;
  if (!telemetryEnabled || patched) return;
  const probe = tracer.startSpan("probe");
  const prototype = Object.getPrototypeOf(probe) as {
    setAttribute(this: Span, key: string, value: unknown): Span;
  };
  const original = prototype.setAttribute;
  prototype.setAttribute = function (this: Span, key: string, value: unknown): Span {
    if (typeof value === "string" && key.startsWith("url.")) {
      if (key === "url.query") return this;
      if (key === "url.path") return original.call(this, key, redactedPath(value));
      if (key === "url.full") return original.call(this, key, redactedUrl(value));
    }
    return original.call(this, key, value);
  };
  patched = true;
}
let patched = false;

function redactedPath(path: string): string {
  return ownPath(path) ? path : "/[redacted]";
}

function redactedUrl(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.protocol}//${parsed.host}${redactedPath(parsed.pathname)}`;
  } catch {
    return "[redacted]";
  }
}
