/** `GET /health` (spec 4.5) and `GET /ready` (spec 4.6). */
import { jsonResponse } from "../http/server.ts";
import type { Route } from "../http/router.ts";

/** The readiness checks: `ok`, or a string starting with `fail`. */
export interface ReadinessChecks {
  db: string;
  encryption: string;
}

/** What the health endpoints need. */
export interface HealthDeps {
  version: string;
  checkReadiness: () => Promise<ReadinessChecks>;
}

/** The health routes. `/health` never touches the database. */
export function healthRoutes(deps: HealthDeps): Route[] {
  const healthBody = JSON.stringify({ status: "ok", version: deps.version });
  return [
    {
      method: "GET",
      pattern: "/health",
      handler: () =>
        new Response(healthBody, {
          headers: { "content-type": "application/json; charset=utf-8" },
        }),
    },
    {
      method: "GET",
      pattern: "/ready",
      handler: async () => {
        const checks = await deps.checkReadiness();
        const ok = checks.db === "ok" && checks.encryption === "ok";
        return jsonResponse(ok ? 200 : 503, {
          status: ok ? "ok" : "degraded",
          version: deps.version,
          checks,
        });
      },
    },
  ];
}
