/**
 * `GET /health` and `GET /ready` (docs/deploy.md, "Health checks"). `/health` never touches
 * the database: it says the process answers. `/ready` says whether this process should get
 * traffic: the database answers, the encryption key opens its secrets, and it is not draining.
 */
import { jsonResponse } from "../http/server.ts";
import type { Handler } from "../http/router.ts";

/** The readiness checks: `ok`, or a string starting with `fail`. */
export interface ReadinessChecks {
  db: string;
  encryption: string;
}

/** The variable of a master key. */
export type EncryptionKeyName = "ENCRYPTION_KEY" | "ENCRYPTION_KEY_PREVIOUS";

/** What `/ready` reports. */
export interface ReadinessReport {
  checks: ReadinessChecks;
  /** Whether the process has begun to shut down; it then answers 503 whatever the checks say. */
  draining: boolean;
  /**
   * While `ENCRYPTION_KEY_PREVIOUS` is set: the key that opens the canary, which tells whether
   * `encryption rotate-key` has run (docs/maintenance.md, "Rotating `ENCRYPTION_KEY`").
   */
  encryptionKey?: EncryptionKeyName;
}

/** What the health endpoints need. */
export interface HealthDeps {
  version: string;
  checkReadiness: () => Promise<ReadinessReport>;
}

/** Answers `GET /health`. */
export function healthHandler(deps: HealthDeps): Handler {
  const body = JSON.stringify({ status: "ok", version: deps.version });
  return () =>
    new Response(body, { headers: { "content-type": "application/json; charset=utf-8" } });
}

/** Answers `GET /ready`: 200 when every check is `ok` and the process is not draining. */
export function readyHandler(deps: HealthDeps): Handler {
  return async () => {
    const { checks, draining, encryptionKey } = await deps.checkReadiness();
    const ok = !draining && checks.db === "ok" && checks.encryption === "ok";
    return jsonResponse(ok ? 200 : 503, {
      status: ok ? "ok" : "degraded",
      version: deps.version,
      checks,
      ...(encryptionKey ? { encryptionKey } : {}),
      ...(draining ? { draining } : {}),
    });
  };
}
