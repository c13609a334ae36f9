/**
 * The HTTP pipeline's own cost per request, measured in-process with `deno bench`: no sockets, no
 * load generator, so the figures are steadier than a loopback run on a shared machine.
 *
 * The `health` group compares a bare handler building the same response with the service's
 * pipeline (request id, routing, the two common headers, the `http_request` line) around the real
 * `/health` route; the `not found` group times a 404 with its error envelope; the `body` group
 * reads a verify request's JSON body as the service does (content type, size limit counted on the
 * bytes, strict UTF-8, nesting depth, the 5 s deadline) against `request.bytes()` and
 * `JSON.parse` alone. Log lines go to a sink that drops them: writing them out is part of
 * `bench/health.ts`, not of this file.
 *
 *     deno task bench:pipeline        # = deno bench bench/pipeline_bench.ts
 * @module
 */
import { type ApiDeps, ENDPOINTS } from "../src/api/mod.ts";
import { Router } from "../src/http/router.ts";
import { createRequestHandler, InFlight } from "../src/http/server.ts";
import { Logger } from "../src/observability/log.ts";
import { readJsonBody, VERIFY_BODY_LIMIT } from "../src/http/body.ts";
import { HEALTH_BODY, JSON_HEADERS } from "./baseline.ts";

const log = new Logger({ level: "info", production: true, write: () => {} });
// The service's route table, with its real `/health` handler: the table's shape matters to
// routing. The other routes answer 204 here; only their patterns are matched.
const deps = { version: "dev" } as ApiDeps;
const routes = ENDPOINTS.map(({ name, method, pattern, handler }) => ({
  method,
  pattern,
  handler: name === "health" ? handler(deps) : () => new Response(null, { status: 204 }),
}));
const handle = createRequestHandler({
  router: new Router(routes),
  version: "dev",
  log,
  inFlight: new InFlight(),
});

const health = new Request("http://127.0.0.1:8080/health");
const unknown = new Request("http://127.0.0.1:8080/v1/nothing-here");

Deno.bench("bare handler: GET /health", { group: "health", baseline: true }, () => {
  new Response(HEALTH_BODY, { headers: JSON_HEADERS });
});

Deno.bench("pipeline: GET /health", { group: "health" }, () => {
  handle(health);
});

Deno.bench("pipeline: unknown route, 404 envelope", { group: "not found" }, () => {
  handle(unknown);
});

const verifyBody = JSON.stringify({ transactionId: "2000000123456789", environment: "production" });
const verifyRequest = () =>
  new Request("http://127.0.0.1:8080/v1/storea/verify", {
    method: "POST",
    body: verifyBody,
    headers: { "content-type": "application/json", "content-length": String(verifyBody.length) },
  });

Deno.bench("bare: request.bytes() and JSON.parse", { group: "body", baseline: true }, async () => {
  JSON.parse(new TextDecoder().decode(await verifyRequest().bytes()));
});

Deno.bench(
  "readJsonBody: a verify body, checked, within its deadline",
  { group: "body" },
  async () => {
    await readJsonBody(verifyRequest(), VERIFY_BODY_LIMIT);
  },
);
