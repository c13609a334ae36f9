/**
 * The floor for `bench/health.ts`: the bare server plus only what every response must have
 * (docs/integration.md, "Common headers"; docs/observability.md, "Logs"): the `X-Request-Id` and
 * `X-Service-Version` headers, and one `http_request` JSON line per request on stdout, written by
 * the service's own logger (src/observability/log.ts, which batches its writes). No routing, no error handling,
 * no shutdown.
 *
 * It is the cheapest way we know to do that work: the gap between this and the bare server is
 * what the required per-request work costs on the machine, and the gap between this and the service
 * is what the service's pipeline adds to it.
 */
import { newId } from "../src/lib/ids.ts";
import { Logger } from "../src/observability/log.ts";
import { baselineAddress, HEALTH_BODY, JSON_HEADERS } from "./baseline.ts";

const { port, hostname } = baselineAddress(8080);
const log = new Logger({ level: "info", production: true });

Deno.serve(
  { port, hostname, onListen: () => {} },
  (request) => {
    const started = performance.now();
    const reqId = newId("req");
    // Set one by one: a headers object with several entries costs more to build in Deno.
    const response = new Response(HEALTH_BODY, { headers: JSON_HEADERS });
    response.headers.set("x-request-id", reqId);
    response.headers.set("x-service-version", "dev");
    log.info("http_request", {
      reqId,
      method: request.method,
      path: "/health",
      status: 200,
      latencyMs: Math.round((performance.now() - started) * 100) / 100,
      tenantId: null,
    });
    return response;
  },
);
