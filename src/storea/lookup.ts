/**
 * What every store A lookup and action shares (docs/verify.md, "POST /v1/storea/verify"):
 * which environments to ask and in what order, the deadline over all of them, and the rule that
 * a JWS read from the App Store is trusted only once it verifies.
 */
import { ServiceError } from "../errors.ts";
import { timeoutSignal } from "../lib/abort.ts";
import type { StoreaCredentials, StoreaEnvironment } from "./credentials.ts";
import type { StoreaAnswer, StoreaApiClient, StoreaEnvironmentName } from "./api_client.ts";
import { JwsInvalidError, type StoreaJwsVerifier } from "./jws.ts";

/** What a store A lookup or action needs. */
export interface StoreaContext {
  client: StoreaApiClient;
  jws: StoreaJwsVerifier;
  /** The whole operation's deadline, both environments and retries included. */
  timeoutMs: number;
}

/** An answer found in one environment. */
export type Found = Extract<StoreaAnswer, { kind: "ok" | "bad_request" }>;

/** Where an operation found its answer, or that no environment knew the transaction. */
export type EnvironmentOutcome =
  | { found: true; environment: StoreaEnvironmentName; answer: Found }
  | { found: false; environments: StoreaEnvironmentName[] };

/** The environments to ask, in order: automatic mode asks production first, then sandbox. */
export function environmentsFor(
  mode: StoreaEnvironment | StoreaEnvironmentName,
): StoreaEnvironmentName[] {
  return mode === "auto" ? ["production", "sandbox"] : [mode];
}

/**
 * Sends one call to each environment of the tenant's setting (or of the per-call `override`) in
 * turn, within one deadline, and returns the first answer that is not a 404. Production's 401
 * in automatic mode moves on to sandbox too: Apple answers it for an app never released.
 * @throws {ServiceError} 502 `APPLE_API_ERROR` for a 401 anywhere else (the tenant's key is
 * wrong), and whatever the client throws.
 */
export async function askEnvironments(
  context: StoreaContext,
  credentials: StoreaCredentials,
  override: StoreaEnvironmentName | undefined,
  ask: (environment: StoreaEnvironmentName, signal: AbortSignal) => Promise<StoreaAnswer>,
): Promise<EnvironmentOutcome> {
  const environments = environmentsFor(override ?? credentials.environment);
  const { signal, clear } = timeoutSignal(context.timeoutMs);
  try {
    for (const [index, environment] of environments.entries()) {
      const answer = await ask(environment, signal);
      const isLast = index === environments.length - 1;
      if (answer.kind === "unauthorized") {
        if (!isLast && environment === "production") continue;
        throw keyRefused(environment);
      }
      if (answer.kind === "not_found") continue;
      return { found: true, environment, answer };
    }
    return { found: false, environments };
  } finally {
    clear();
  }
}

/**
 * The payload of a JWS the App Store returned, once it verified: read from Apple over TLS with
 * the tenant's key, so no budget for a new chain applies.
 * @throws {ServiceError} 502 `APPLE_API_ERROR` when it does not verify: data the App Store
 * returns is trusted only once it does.
 */
export async function verifiedFromStore(
  jws: StoreaJwsVerifier,
  token: string,
  what: string,
): Promise<Record<string, unknown>> {
  try {
    return await jws.verify(token, { from: "store" });
  } catch (error) {
    if (!(error instanceof JwsInvalidError)) throw error;
    throw new ServiceError(
      "APPLE_API_ERROR",
      `the App Store's ${what} did not verify: ${error.message}`,
      { details: { status: 200, upstreamCode: null }, cause: error },
    );
  }
}

/**
 * 400 `INVALID_REQUEST` for Apple's 400 to a request made of the tenant's own values (a revision,
 * consumption information), with Apple's `errorCode` in `details.upstreamCode`.
 */
export function refusedByApple(
  answer: { upstreamCode: number | null; errorMessage: string | null },
  what: string,
): ServiceError {
  return new ServiceError(
    "INVALID_REQUEST",
    `the App Store refused the ${what}${
      answer.errorMessage === null ? "" : `: ${answer.errorMessage}`
    }`,
    { details: { upstreamCode: answer.upstreamCode }, upstreamStatus: 400 },
  );
}

/** The App Store's 401 for the tenant's API key in `environment`: 502 `APPLE_API_ERROR`. */
export function keyRefused(environment: StoreaEnvironmentName): ServiceError {
  return new ServiceError(
    "APPLE_API_ERROR",
    `the App Store refused the tenant's API key in ${environment} (401); check its key id, ` +
      "issuer id, bundle id and private key",
    { details: { status: 401, upstreamCode: null } },
  );
}

/** 502 for a 2xx answer that lacks what the call returns. */
export function malformedAnswer(what: string): ServiceError {
  return new ServiceError("APPLE_API_ERROR", `the App Store answered ${what}`, {
    details: { status: 200, upstreamCode: null },
  });
}

/** The domain failure of a transaction found nowhere. */
export function transactionNotFound(environments: StoreaEnvironmentName[]): {
  valid: false;
  error: "TRANSACTION_NOT_FOUND";
  message: string;
  upstreamStatus: number;
} {
  return {
    valid: false,
    error: "TRANSACTION_NOT_FOUND",
    message: `no transaction with this id in ${environments.join(" or ")}`,
    upstreamStatus: 404,
  };
}

/** The domain failure of a transaction of another app. */
export function bundleMismatch(bundleId: unknown, credentials: StoreaCredentials): {
  valid: false;
  error: "BUNDLE_ID_MISMATCH";
  message: string;
  upstreamStatus: number;
} {
  return {
    valid: false,
    error: "BUNDLE_ID_MISMATCH",
    message: `the transaction belongs to bundle ${
      JSON.stringify(bundleId)
    }, not this tenant's ${credentials.bundleId}`,
    upstreamStatus: 200,
  };
}
