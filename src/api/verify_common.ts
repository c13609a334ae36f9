/**
 * The steps every verify endpoint takes before its store is asked, in this order
 * (docs/integration.md, "Errors"): API key (401) -> rate limit (429) -> body (400) -> credentials
 * (400).
 */
import { sha256Hex } from "../lib/sha256.ts";
import { z } from "zod";
import { ServiceError } from "../errors.ts";
import { readValidatedBody, VERIFY_BODY_LIMIT } from "../http/body.ts";
import { jsonResponse } from "../http/server.ts";
import type { RequestContext } from "../http/router.ts";
import type { Authenticator } from "../auth/authenticator.ts";
import type { RateLimiter } from "../auth/rate_limit.ts";
import type { TenantCredentials } from "../db/credentials.ts";
import type { SingleFlight } from "../lib/single_flight.ts";
import type { ValidationAudit } from "../audit/validation_audit.ts";
import type { Span } from "@opentelemetry/api";
import { ATTR, recordVerifyOutcome, withSpan } from "../observability/telemetry.ts";
import type { Logger } from "../observability/log.ts";

/**
 * A request field that becomes a path segment of the store's URL: `min` to `max` characters of
 * well-formed Unicode, and neither `.` nor `..`. JSON can carry an unpaired surrogate
 * (`"\ud800"`), which no URL can: percent-encoding it throws, which would answer 500.
 * URL parsers resolve `.` and `..` away, so the request would ask another path of the store's API
 * and its 404 would read as "not found". The store clients rely on this and only percent-encode.
 */
export function pathSegmentField(min: number, max: number): z.ZodString {
  return z.string().min(min).max(max)
    .refine((value) => value.isWellFormed(), {
      message: "must be well-formed Unicode (no unpaired surrogate)",
    })
    .refine((value) => value !== "." && value !== "..", {
      message: 'must not be "." or "..", which a URL resolves to another path',
    });
}

/** What the verify endpoints, and the store gateway's endpoints beside them, share. */
export interface VerifyDeps {
  version: string;
  log: Logger;
  authenticator: Authenticator;
  rateLimiter: RateLimiter;
  /** The tenant's store credentials (cached briefly by the caller). */
  credentialsOf: (tenantId: string) => Promise<TenantCredentials>;
  /** Shares one upstream call among identical requests in flight together. */
  flights: SingleFlight;
  /** Where outcomes are recorded, or null when the audit is off. */
  audit: ValidationAudit | null;
}

/** What every store's outcome says, for the audit. */
export interface VerifyOutcomeSummary {
  valid: boolean;
  error?: string;
  upstreamStatus: number | null;
}

/** Identifies one verification: who asked, in which store, about what. */
export interface VerificationKey {
  tenantId: string;
  store: Store;
  /** The transaction id or purchase token. */
  subject: string;
  /** Everything else that changes the answer (environment, product, type). */
  variant: string;
}

/** A store the verify endpoints serve. */
export type Store = keyof TenantCredentials;

/** An authenticated, rate-limited, validated verify request with its store's credentials. */
export interface AdmittedRequest<T, S extends Store> {
  /** The request's id, for its log lines. */
  reqId: string;
  tenantId: string;
  /** The id of the API key that authenticated it (for the logs of store actions). */
  keyId: string;
  body: T;
  credentials: NonNullable<TenantCredentials[S]>;
}

/** What a verify endpoint admits: its store and its body schema. */
export interface AdmitOptions<T, S extends Store> {
  deps: VerifyDeps;
  store: S;
  schema: z.ZodType<T>;
}

/** Runs the common checks, in order, and returns the typed body and the store's credentials. */
export async function admitVerifyRequest<T, S extends Store>(
  request: Request,
  context: RequestContext,
  options: AdmitOptions<T, S>,
): Promise<AdmittedRequest<T, S>> {
  const { deps, store, schema } = options;
  const owner = await deps.authenticator.authenticate(request.headers.get("authorization"));
  context.tenantId = owner.tenantId;
  deps.rateLimiter.take(owner.tenantId);
  const body = await readValidatedBody(request, schema, VERIFY_BODY_LIMIT);
  const credentials = (await deps.credentialsOf(owner.tenantId))[store];
  if (credentials === null) throw credentialsMissing(store);
  return {
    reqId: context.reqId,
    tenantId: owner.tenantId,
    keyId: owner.keyId,
    body,
    credentials: credentials as NonNullable<TenantCredentials[S]>,
  };
}

/** 400 `CREDENTIALS_MISSING` for a store the tenant has not configured. */
function credentialsMissing(store: Store): ServiceError {
  return new ServiceError(
    "CREDENTIALS_MISSING",
    `this tenant has no ${store} credentials; an operator sets them with ` +
      `\`purchase-relay ${store} set-credentials\``,
  );
}

/**
 * Runs `verify`, shared with identical requests already in flight (one store call for all), and
 * records the outcome in the validation audit, failures included.
 */
export function runVerification<T extends VerifyOutcomeSummary>(
  deps: VerifyDeps,
  key: VerificationKey,
  verify: () => Promise<T>,
): Promise<T> {
  const flightKey = `${key.store}\0${key.tenantId}\0${key.variant}\0${key.subject}`;
  return withSpan("purchase_relay.verify", {
    [ATTR.tenant]: key.tenantId,
    [ATTR.store]: key.store,
  }, (span) => verifyAndRecord(deps, key, flightKey, verify, span));
}

async function verifyAndRecord<T extends VerifyOutcomeSummary>(
  deps: VerifyDeps,
  key: VerificationKey,
  flightKey: string,
  verify: () => Promise<T>,
  span: Span | null,
): Promise<T> {
  const started = performance.now();
  try {
    const outcome = await deps.flights.run(flightKey, verify);
    const code = outcome.valid ? "valid" : outcome.error ?? "invalid";
    span?.setAttribute(ATTR.outcome, code);
    recordVerifyOutcome(key.store, code);
    deps.audit?.record({
      tenantId: key.tenantId,
      store: key.store,
      subject: key.subject,
      outcome: code,
      upstreamStatus: outcome.upstreamStatus,
      latencyMs: performance.now() - started,
    });
    return outcome;
  } catch (error) {
    const status = error instanceof ServiceError
      ? error.upstreamStatus ?? error.details?.status
      : null;
    const code = error instanceof ServiceError ? error.code : "INTERNAL_ERROR";
    span?.setAttribute(ATTR.outcome, code);
    recordVerifyOutcome(key.store, code);
    deps.audit?.record({
      tenantId: key.tenantId,
      store: key.store,
      subject: key.subject,
      outcome: code,
      upstreamStatus: typeof status === "number" ? status : null,
      latencyMs: performance.now() - started,
    });
    throw error;
  }
}

/** One change made at a store on a tenant's behalf (acknowledge, consume, consumption info). */
export interface StoreAction {
  /** The request that asked for it. */
  reqId?: string;
  tenantId: string;
  keyId: string;
  store: Store;
  /** What was done, e.g. `acknowledge`. */
  action: string;
  productId?: string;
  transactionId?: string;
  /** Only a short digest of it is logged: purchase tokens are never logged whole. */
  purchaseToken?: string;
  /** What came of it, e.g. `acknowledged`, `already_acknowledged`, or an error code. */
  outcome: string;
}

/**
 * Logs a store action at `info` as `store_action` (docs/log_reference.md, "Log messages"): who
 * asked (tenant and API key id), what, about which product or transaction, and what came of it;
 * a purchase token only as the first 12 hex digits of its SHA-256.
 */
export function logStoreAction(log: Logger, action: StoreAction): void {
  const { purchaseToken, ...fields } = action;
  log.info("store_action", {
    ...fields,
    ...(purchaseToken === undefined ? {} : { purchaseTokenSha256: shortDigest(purchaseToken) }),
  });
}

/** The first 12 hex digits of the SHA-256 of `text`: enough to tell tokens apart in a log. */
function shortDigest(text: string): string {
  return sha256Hex(text).slice(0, 12);
}

/** The HTTP 200 answer of a domain failure (docs/integration.md, "Domain failure (HTTP 200)"). */
export function domainFailureResponse(
  version: string,
  outcome: { error: string; message: string },
): Response {
  return jsonResponse(200, {
    valid: false,
    version,
    error: outcome.error,
    message: outcome.message,
  });
}
