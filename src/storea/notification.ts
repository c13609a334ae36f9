/**
 * Store A notifications (App Store Server Notifications V2): the signed payload and its nested
 * transaction and renewal info are verified with the same JWS checks as verify responses, and the
 * notification must belong to the tenant's app (docs/operations.md, "How a notification is
 * received").
 */
import { invalidRequest, ServiceError } from "../errors.ts";
import type { StoreaCredentials } from "../db/credentials.ts";
import { MAX_JSON_DEPTH, nestsDeeperThan, objectOrEmpty } from "../json.ts";
import { JwsInvalidError, type StoreaJwsVerifier } from "./jws.ts";

/** A notification whose signatures all verified and which belongs to the tenant. */
export interface VerifiedStoreaNotification {
  /** The decoded `signedPayload`, unchanged. */
  payload: Record<string, unknown>;
  notificationUUID: string;
  /** The decoded nested `signedTransactionInfo`, or null when there is none (TEST). */
  transaction: Record<string, unknown> | null;
  /** The decoded nested `signedRenewalInfo`, or null. */
  renewal: Record<string, unknown> | null;
}

/**
 * Verifies `signedPayload` for the tenant holding `credentials`.
 * @throws {ServiceError} 401 `SIGNATURE_INVALID` for a bad signature or another app's
 * notification; 400 `INVALID_REQUEST` for a signed payload without a notification UUID or
 * nesting deeper than a request body may.
 */
export async function verifyStoreaNotification(
  jws: StoreaJwsVerifier,
  signedPayload: string,
  credentials: StoreaCredentials,
): Promise<VerifiedStoreaNotification> {
  const payload = await verified(jws, signedPayload, "signedPayload");
  // Most types carry `data`; RENEWAL_EXTENSION summaries carry `summary` instead.
  const data = objectOrEmpty(payload.data);
  const summary = objectOrEmpty(payload.summary);
  const transaction = typeof data.signedTransactionInfo === "string"
    ? await verified(jws, data.signedTransactionInfo, "signedTransactionInfo")
    : null;
  const renewal = typeof data.signedRenewalInfo === "string"
    ? await verified(jws, data.signedRenewalInfo, "signedRenewalInfo")
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
  return { payload, notificationUUID: uuid, transaction, renewal };
}

async function verified(
  jws: StoreaJwsVerifier,
  token: string,
  what: string,
): Promise<Record<string, unknown>> {
  try {
    return await jws.verify(token);
  } catch (error) {
    if (error instanceof JwsInvalidError) {
      throw new ServiceError("SIGNATURE_INVALID", `${what} does not verify: ${error.message}`);
    }
    throw error;
  }
}

function mismatch(message: string): ServiceError {
  return new ServiceError("SIGNATURE_INVALID", message);
}
