/**
 * The steps every verify endpoint takes before its store is asked, in the order of
 * decisions.md 6: API key (401) -> rate limit (429) -> body (400) -> credentials (400).
 */
import type { z } from "zod";
import { invalidRequest, ServiceError } from "../errors.ts";
import { readJsonBody, VERIFY_BODY_LIMIT } from "../http/body.ts";
import type { RequestContext } from "../http/router.ts";
import type { Authenticator } from "../auth/authenticator.ts";
import type { RateLimiter } from "../auth/rate_limit.ts";
import type { TenantCredentials } from "../db/credentials.ts";

/** What the verify endpoints share. */
export interface VerifyDeps {
  version: string;
  authenticator: Authenticator;
  rateLimiter: RateLimiter;
  /** The tenant's store credentials (cached briefly by the caller). */
  credentialsOf: (tenantId: string) => Promise<TenantCredentials>;
}

/** An authenticated, rate-limited, validated verify request. */
export interface AdmittedRequest<T> {
  tenantId: string;
  body: T;
  credentials: TenantCredentials;
}

/** Runs the common checks and returns the typed body. */
export async function admitVerifyRequest<T>(
  request: Request,
  context: RequestContext,
  deps: VerifyDeps,
  schema: z.ZodType<T>,
): Promise<AdmittedRequest<T>> {
  const owner = await deps.authenticator.authenticate(request.headers.get("authorization"));
  context.tenantId = owner.tenantId;
  deps.rateLimiter.take(owner.tenantId);
  const json = await readJsonBody(request, VERIFY_BODY_LIMIT);
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((issue) => ({
      path: issue.path.join("."),
      message: issue.message,
    }));
    throw invalidRequest(
      `invalid request body: ${issues.map((i) => `${i.path || "body"}: ${i.message}`).join("; ")}`,
      { issues },
    );
  }
  const credentials = await deps.credentialsOf(owner.tenantId);
  return { tenantId: owner.tenantId, body: parsed.data, credentials };
}

/** 400 `CREDENTIALS_MISSING` for a store the tenant has not configured. */
export function credentialsMissing(store: "storea" | "storeb"): ServiceError {
  return new ServiceError(
    "CREDENTIALS_MISSING",
    `this tenant has no ${store} credentials; an operator sets them with ` +
      `\`purchase-relay ${store} set-credentials\``,
  );
}
