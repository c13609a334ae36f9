/**
 * The baseline for `bench/health.ts`: a bare `Deno.serve` that answers every request with the same
 * body and content type as the service's `GET /health`. It takes its port from `PORT` and logs
 * nothing, so the gap between the two is what the service's pipeline costs.
 */
import { baselineAddress, HEALTH_BODY, JSON_HEADERS } from "./baseline.ts";

const { port, hostname } = baselineAddress(8080);

Deno.serve(
  { port, hostname, onListen: () => {} },
  () => new Response(HEALTH_BODY, { headers: JSON_HEADERS }),
);
