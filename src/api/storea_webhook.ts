/**
 * `POST /v1/webhooks/storea/:tenantId`. Checks in this order (docs/relay.md, "How a
 * notification is received"):
 * body (400) -> tenant exists and is active (404) -> store A credentials (400) -> JWS chain and
 * signatures (401) -> bundle and app id (401) -> dedup -> 200 after the commit.
 */
import { z } from "zod";
import { ServiceError } from "../errors.ts";
import { readValidatedBody, RECEIVER_BODY_LIMIT } from "../http/body.ts";
import type { Handler } from "../http/router.ts";
import { type StoreaJwsVerifier, UnseenChainBudgetError } from "../storea/jws.ts";
import { StaleNotificationError, verifyStoreaNotification } from "../storea/notification.ts";
import { Throttle } from "../lib/throttle.ts";
import { storeaEvent } from "../events/store_events.ts";
import { isId } from "../lib/ids.ts";
import { receiptResponse, type ReceiverDeps } from "./receiver_common.ts";

/** The body Apple posts; other fields are tolerated for forward compatibility. */
const storeaNotificationBody = z.object({ signedPayload: z.string().min(1) });

/** What the store A receiver needs beyond the common receiver dependencies. */
export interface StoreaWebhookDeps extends ReceiverDeps {
  jws: StoreaJwsVerifier;
  /** How long after `signedDate` a posted notification is accepted (`STOREA_NOTIFICATION_MAX_AGE`). */
  storeaNotificationMaxAgeMs: number;
}

/**
 * How often each of the refusals anyone can repeat at will is logged, at most: per tenant for old
 * notifications, once for the whole process for unseen chains.
 */
const REFUSAL_LOG_INTERVAL_MS = 10_000;

/** Answers `POST /v1/webhooks/storea/:tenantId`. */
export function storeaWebhookHandler(deps: StoreaWebhookDeps): Handler {
  const refusalLines = new Throttle({ intervalMs: REFUSAL_LOG_INTERVAL_MS });
  const verify = async (signedPayload: string, tenantId: string, reqId: string) => {
    const credentials = (await deps.credentialsOf(tenantId)).storea;
    if (credentials === null) {
      throw new ServiceError(
        "CREDENTIALS_MISSING",
        "the tenant has no store A credentials, needed to match the bundle id",
      );
    }
    try {
      return await verifyStoreaNotification(deps.jws, signedPayload, credentials, {
        via: "receiver",
        maxAgeMs: deps.storeaNotificationMaxAgeMs,
      });
    } catch (error) {
      if (error instanceof StaleNotificationError && refusalLines.allow(`old:${tenantId}`)) {
        deps.log.warn("storea_notification_too_old", {
          reqId,
          tenantId,
          signedDate: new Date(error.signedDate).toISOString(),
          maxAgeMs: deps.storeaNotificationMaxAgeMs,
        });
      }
      const cause = error instanceof ServiceError ? error.cause : null;
      if (cause instanceof UnseenChainBudgetError && refusalLines.allow("unseen")) {
        deps.log.warn("storea_unseen_chains_refused", {
          reqId,
          tenantId,
          refusedSinceBoot: deps.jws.unseenChainsRefused,
          hint: "notifications signed by certificate chains never verified here are arriving " +
            "faster than they are checked: forged ones, most likely",
        });
      }
      throw error;
    }
  };
  return async (request, context) => {
    const body = await readValidatedBody(request, storeaNotificationBody, RECEIVER_BODY_LIMIT);
    const tenantId = context.params.tenantId;
    // An unknown and an inactive tenant get the same 404 here.
    const tenant = isId("tenant", tenantId) ? await deps.findTenant(tenantId) : null;
    if (tenant === null || !tenant.active) {
      throw new ServiceError("TENANT_NOT_FOUND", `no active tenant ${tenantId}`);
    }
    context.tenantId = tenantId;
    const notification = await verify(body.signedPayload, tenantId, context.reqId);
    return await receiptResponse(deps, context, storeaEvent(tenantId, notification));
  };
}
