/**
 * `POST /v1/webhooks/storea/:tenantId`. Checks in this order (docs/operations.md, "How a
 * notification is received"):
 * body (400) -> tenant exists and is active (404) -> store A credentials (400) -> JWS chain and
 * signatures (401) -> bundle and app id (401) -> dedup -> 200 after the commit.
 */
import { z } from "zod";
import { ServiceError } from "../errors.ts";
import { readValidatedBody, RECEIVER_BODY_LIMIT } from "../http/body.ts";
import type { Handler } from "../http/router.ts";
import type { StoreaJwsVerifier } from "../storea/jws.ts";
import { verifyStoreaNotification } from "../storea/notification.ts";
import { classifyStorea } from "../events/catalog.ts";
import { isId } from "../ids.ts";
import { receiptResponse, type ReceiverDeps } from "./receiver_common.ts";

/** The body Apple posts; other fields are tolerated for forward compatibility. */
const storeaNotificationBody = z.object({ signedPayload: z.string().min(1) });

/** What the store A receiver needs beyond the common receiver dependencies. */
export interface StoreaWebhookDeps extends ReceiverDeps {
  jws: StoreaJwsVerifier;
}

/** Answers `POST /v1/webhooks/storea/:tenantId`. */
export function storeaWebhookHandler(deps: StoreaWebhookDeps): Handler {
  return async (request, context) => {
    const body = await readValidatedBody(request, storeaNotificationBody, RECEIVER_BODY_LIMIT);
    const tenantId = context.params.tenantId;
    // An unknown and an inactive tenant get the same 404 here.
    const tenant = isId("tenant", tenantId) ? await deps.findTenant(tenantId) : null;
    if (tenant === null || !tenant.active) {
      throw new ServiceError("TENANT_NOT_FOUND", `no active tenant ${tenantId}`);
    }
    context.tenantId = tenantId;
    const credentials = (await deps.credentialsOf(tenantId)).storea;
    if (credentials === null) {
      throw new ServiceError(
        "CREDENTIALS_MISSING",
        "the tenant has no store A credentials, needed to match the bundle id",
      );
    }
    const notification = await verifyStoreaNotification(
      deps.jws,
      body.signedPayload,
      credentials,
    );
    return await receiptResponse(deps, context, {
      tenantId,
      source: "storea",
      externalId: notification.notificationUUID,
      entry: classifyStorea(notification.payload, notification.transaction),
      data: notification.payload,
      raw: notification.payload,
    });
  };
}
