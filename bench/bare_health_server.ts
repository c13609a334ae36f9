/**
 * The baseline for `bench/health.ts`: a bare `Deno.serve` that answers every request with the same
 * body and content type as the service's `GET /health`. It takes its port from `PORT` and logs
 * nothing, so the gap between the two is what the service's pipeline costs.
 */

const BODY = JSON.stringify({ status: "ok", version: "dev" });
const HEADERS = { "content-type": "application/json; charset=utf-8" };

const port = Number(Deno.env.get("PORT") ?? "8080");
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  throw new Error(`PORT must be a port number, got ${Deno.env.get("PORT")}`);
}

Deno.serve(
  { port, hostname: Deno.env.get("HOST") ?? "127.0.0.1", onListen: () => {} },
  () => new Response(BODY, { headers: HEADERS }),
);
