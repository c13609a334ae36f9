/**
 * `POST /v1/webhooks/storeb/:tenantId`. Checks in this order (docs/relay.md, "How a
 * notification is received"):
 * unknown tenant (401, whatever the token, so tenant ids cannot be enumerated) -> store B
 * credentials with a push service account (401: nothing to check the token against) -> OIDC
 * push token (401) -> inactive tenant (404) -> envelope (400) -> package (400) -> dedup -> 200
 * after the commit.
 */
import { ServiceError } from "../errors.ts";
import { readValidatedBody, RECEIVER_BODY_LIMIT } from "../http/body.ts";
import type { Handler } from "../http/router.ts";
import type { PushTokenVerifier } from "../storeb/push_token.ts";
import { decodeStorebNotification, pushEnvelopeSchema } from "../storeb/notification.ts";
import { storebEvent } from "../events/store_events.ts";
import { isId } from "../lib/ids.ts";
import { Throttle } from "../lib/throttle.ts";
import { receiptResponse, type ReceiverDeps } from "./receiver_common.ts";

/** What the store B receiver needs beyond the common receiver dependencies. */
export interface StorebWebhookDeps extends ReceiverDeps {
  pushTokens: PushTokenVerifier;
}

/** How often a tenant without a push service account is named in the logs, at most. */
const MISSING_ACCOUNT_WARN_INTERVAL_MS = 60_000;

/** Answers `POST /v1/webhooks/storeb/:tenantId`. */
export function storebWebhookHandler(deps: StorebWebhookDeps): Handler {
  const missingAccountWarnings = new Throttle({ intervalMs: MISSING_ACCOUNT_WARN_INTERVAL_MS });
  return async (request, context) => {
    const tenantId = context.params.tenantId;
    const authorization = request.headers.get("authorization");
    const tenant = isId("tenant", tenantId) ? await deps.findTenant(tenantId) : null;
    // An unknown tenant is indistinguishable from a bad token, so tenant ids cannot be probed.
    if (tenant === null) throw unauthenticated();
    const credentials = (await deps.credentialsOf(tenantId)).storeb;
    if (credentials === null) throw unauthenticated();
    // Stored before the push service account was required: only the audience could be
    // checked, and any Google project can mint a token for it (docs/operations.md).
    if (credentials.pushServiceAccount === null) {
      if (missingAccountWarnings.allow(tenantId)) {
        deps.log.warn("push_service_account_missing", {
          reqId: context.reqId,
          tenantId,
          hint: "store B notifications are refused until storeb set-credentials is run " +
            "again with --push-service-account",
        });
      }
      throw unauthenticated();
    }
    try {
      await deps.pushTokens.verify(authorization, {
        audience: credentials.pushAudience,
        serviceAccountEmail: credentials.pushServiceAccount,
      });
    } catch (error) {
      // One message for every UNAUTHENTICATED case, so that a known tenant cannot be told
      // from an unknown one by the wording; the reason goes to the debug log.
      if (error instanceof ServiceError && error.code === "UNAUTHENTICATED") {
        deps.log.debug("push_token_refused", { reqId: context.reqId, reason: error.message });
        throw unauthenticated();
      }
      throw error;
    }
    context.tenantId = tenantId;
    if (!tenant.active) {
      throw new ServiceError("TENANT_NOT_FOUND", `tenant ${tenantId} is inactive`);
    }

    const envelope = await readValidatedBody(request, pushEnvelopeSchema, RECEIVER_BODY_LIMIT);
    const { messageId, notification } = decodeStorebNotification(
      envelope,
      credentials.packageName,
    );
    return await receiptResponse(
      deps,
      context,
      storebEvent(tenantId, notification, { messageId, envelope }),
    );
  };
}

function unauthenticated(): ServiceError {
  return new ServiceError("UNAUTHENTICATED", "missing or invalid push token");
}
