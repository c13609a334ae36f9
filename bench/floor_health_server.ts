/**
 * The floor for `bench/health.ts`: the bare server plus only what the spec asks of every response,
 * done as cheaply as this file knows how: the `X-Request-Id` and `X-Service-Version` headers, and
 * one `http_request` JSON line per request on stdout, buffered and written once per macrotask as
 * the service writes its lines. No routing, no error handling, no shutdown.
 *
 * It is the cheapest way we know to do that work: the gap between this and the bare server is
 * what the spec's per-request work costs on the machine, before any of the service's own.
 */
import { newId } from "../src/ids.ts";
import { baselineAddress, HEALTH_BODY, JSON_HEADERS } from "./baseline.ts";
const encoder = new TextEncoder();

const { port, hostname } = baselineAddress(8080);

let pending = "";
let scheduled = false;
let stampMs = -1;
let stamp = "";

function flush(): void {
  scheduled = false;
  const bytes = encoder.encode(pending);
  pending = "";
  for (let offset = 0; offset < bytes.length;) {
    offset += Deno.stdout.writeSync(bytes.subarray(offset));
  }
}

Deno.serve(
  { port, hostname, onListen: () => {} },
  (request) => {
    const started = performance.now();
    const reqId = newId("req");
    // Set one by one: a headers object with several entries costs more to build in Deno.
    const response = new Response(HEALTH_BODY, { headers: JSON_HEADERS });
    response.headers.set("x-request-id", reqId);
    response.headers.set("x-service-version", "dev");
    const now = Date.now();
    if (now !== stampMs) {
      stampMs = now;
      stamp = new Date(now).toISOString();
    }
    const latencyMs = Math.round((performance.now() - started) * 100) / 100;
    pending += `{"ts":"${stamp}","level":"info","msg":"http_request","reqId":"${reqId}",` +
      `"method":"${request.method}","path":"/health","status":200,"latencyMs":${latencyMs},` +
      `"tenantId":null}\n`;
    if (pending.length >= 64 * 1024) {
      flush();
    } else if (!scheduled) {
      scheduled = true;
      setTimeout(flush, 0);
    }
    return response;
  },
);
