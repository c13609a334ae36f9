/**
 * Store A notifications (App Store Server Notifications V2): the signed payload and its nested
 * transaction and renewal info are verified with the same JWS checks as verify responses, and the
 * notification must belong to the tenant's app (docs/relay.md, "How a notification is
 * received").
 */
import { invalidRequest, rateLimited, ServiceError } from "../errors.ts";
import type { StoreaCredentials } from "./credentials.ts";
import { MAX_JSON_DEPTH, nestsDeeperThan, objectOrEmpty } from "../lib/json.ts";
import {
  JwsInvalidError,
  type JwsVerifyOptions,
  type StoreaJwsVerifier,
  UnseenChainBudgetError,
} from "./jws.ts";

/**
 * How a notification reached the service, which decides what it must prove besides its
 * signatures (docs/security.md, "Old notifications").
 */
export type StoreaNotificationOrigin =
  /**
   * Posted to the receiver, by Apple or by anyone: a chain never seen spends the budget of such
   * chains, and it must have been signed at most `maxAgeMs` ago, since anyone holding an old
   * genuine notification can post it again.
   */
  | { via: "receiver"; maxAgeMs: number; now?: () => number }
  /**
   * Read from Apple's notification history over TLS, with the tenant's key (recovery): only
   * Apple could have sent it, however old it is. The one way past the age check.
   */
  | { via: "store-history" };

/** A posted notification signed longer ago than the receiver accepts: 401 `SIGNATURE_INVALID`. */
export class StaleNotificationError extends ServiceError {
  /** When Apple signed it, epoch ms. */
  readonly signedDate: number;

  constructor(signedDate: number, maxAgeMs: number) {
    super(
      "SIGNATURE_INVALID",
      `the notification was signed at ${new Date(signedDate).toISOString()}, more than ` +
        `${describeAge(maxAgeMs)} ago (STOREA_NOTIFICATION_MAX_AGE): too old to be accepted`,
    );
    this.signedDate = signedDate;
  }
}

/** A notification whose signatures all verified and which belongs to the tenant. */
export interface VerifiedStoreaNotification {
  /** The decoded `signedPayload`, unchanged. */
  payload: Record<string, unknown>;
  notificationUUID: string;
  /** The decoded nested `signedTransactionInfo`, or null when there is none (TEST). */
  transaction: Record<string, unknown> | null;
  /** The decoded nested `signedRenewalInfo`, or null. */
  renewal: Record<string, unknown> | null;
  /** `data.environment` (or the summary's): `Production` or `Sandbox`; null when absent. */
  environment: string | null;
}

/**
 * Verifies `signedPayload` for the tenant holding `credentials`, as it reached the service by
 * `origin`.
 * @throws {ServiceError} 401 `SIGNATURE_INVALID` for a bad signature, another app's notification
 * or a posted one too old ({@linkcode StaleNotificationError}); 429 `RATE_LIMITED` for a posted
 * one whose chain was never seen while the budget of such chains is spent; 400 `INVALID_REQUEST`
 * for a signed payload without a notification UUID or nesting deeper than a request body may.
 */
export async function verifyStoreaNotification(
  jws: StoreaJwsVerifier,
  signedPayload: string,
  credentials: StoreaCredentials,
  origin: StoreaNotificationOrigin,
): Promise<VerifiedStoreaNotification> {
  const from = origin.via === "receiver" ? "anyone" : "store";
  const payload = await verified(jws, signedPayload, "signedPayload", { from });
  if (origin.via === "receiver") checkAge(payload, origin.maxAgeMs, origin.now ?? Date.now);
  // Most types carry `data`; RENEWAL_EXTENSION summaries carry `summary` instead.
  const data = objectOrEmpty(payload.data);
  const summary = objectOrEmpty(payload.summary);
  // Nested in a payload that verified: only the store could have put them there.
  const nested = { from: "store" } as const;
  const transaction = typeof data.signedTransactionInfo === "string"
    ? await verified(jws, data.signedTransactionInfo, "signedTransactionInfo", nested)
    : null;
  const renewal = typeof data.signedRenewalInfo === "string"
    ? await verified(jws, data.signedRenewalInfo, "signedRenewalInfo", nested)
    : null;

  const bundleId = data.bundleId ?? summary.bundleId;
  if (bundleId !== credentials.bundleId) {
    throw mismatch(`the notification's bundle id is not the tenant's (${credentials.bundleId})`);
  }
  if (transaction !== null && transaction.bundleId !== credentials.bundleId) {
    throw mismatch("the notification's transaction belongs to another bundle id");
  }
  // The app id is checked only in Production: Sandbox notifications of unreleased apps have none.
  const environment = data.environment ?? summary.environment;
  // Apple names it appAppleId; the store-neutral spelling appStoreaId is accepted too.
  const appId = data.appAppleId ?? data.appStoreaId ?? summary.appAppleId;
  if (credentials.appId !== null && environment === "Production" && appId !== credentials.appId) {
    throw mismatch(`the notification's app id is not the tenant's (${credentials.appId})`);
  }

  // Stored and delivered as `data`: as deep as a request body may be (see MAX_JSON_DEPTH).
  if (nestsDeeperThan(payload, MAX_JSON_DEPTH)) {
    throw invalidRequest(`the signed payload nests deeper than ${MAX_JSON_DEPTH} levels`);
  }
  const uuid = payload.notificationUUID;
  if (typeof uuid !== "string" || uuid.length === 0 || uuid.length > 200) {
    throw invalidRequest("the signed payload has no notificationUUID");
  }
  return {
    payload,
    notificationUUID: uuid,
    transaction,
    renewal,
    environment: typeof environment === "string" ? environment : null,
  };
}

async function verified(
  jws: StoreaJwsVerifier,
  token: string,
  what: string,
  options: JwsVerifyOptions,
): Promise<Record<string, unknown>> {
  try {
    return await jws.verify(token, options);
  } catch (error) {
    if (error instanceof JwsInvalidError) {
      throw new ServiceError("SIGNATURE_INVALID", `${what} does not verify: ${error.message}`);
    }
    if (error instanceof UnseenChainBudgetError) {
      throw rateLimited(error.message, error.retryAfterSeconds, { cause: error });
    }
    throw error;
  }
}

/** Refuses a posted notification signed more than `maxAgeMs` ago (or with no `signedDate`). */
function checkAge(payload: Record<string, unknown>, maxAgeMs: number, now: () => number): void {
  const signedDate = payload.signedDate;
  if (typeof signedDate !== "number" || !Number.isFinite(signedDate)) {
    throw new ServiceError("SIGNATURE_INVALID", "the notification has no signedDate");
  }
  if (now() - signedDate > maxAgeMs) throw new StaleNotificationError(signedDate, maxAgeMs);
}

/** `maxAgeMs` in the largest unit that writes it whole: `10d`, `36h`, `90m`. */
function describeAge(maxAgeMs: number): string {
  for (const [unit, ms] of [["d", 86_400_000], ["h", 3_600_000], ["m", 60_000]] as const) {
    if (maxAgeMs % ms === 0) return `${maxAgeMs / ms}${unit}`;
  }
  return `${Math.round(maxAgeMs / 1000)}s`;
}

function mismatch(message: string): ServiceError {
  return new ServiceError("SIGNATURE_INVALID", message);
}
