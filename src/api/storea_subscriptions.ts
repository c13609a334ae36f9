/** `POST /v1/storea/subscriptions` (docs/store_gateway.md, "POST /v1/storea/subscriptions"). */
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import { type StoreaVerifyDeps, storeaVerifyRequest } from "./storea_verify.ts";
import { admitVerifyRequest, domainFailureResponse, runVerification } from "./verify_common.ts";

/** The request body: the same as verify's (any transaction of the customer). */
export const storeaSubscriptionsRequest = storeaVerifyRequest;

/** Answers `POST /v1/storea/subscriptions`. */
export function storeaSubscriptionsHandler(deps: StoreaVerifyDeps): Handler {
  return async (request, context) => {
    const { tenantId, body, credentials } = await admitVerifyRequest(request, context, {
      deps,
      store: "storea",
      schema: storeaSubscriptionsRequest,
    });
    const outcome = await runVerification(deps, {
      tenantId,
      store: "storea",
      subject: body.transactionId,
      // Not folded into a verify of the same id, which answers something else.
      variant: `subscriptions\0${body.environment ?? ""}`,
    }, () => deps.storea.subscriptions(credentials, body));
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, {
      valid: true,
      version: deps.version,
      environment: outcome.environment,
      appUserId: outcome.appUserId,
      subscriptions: outcome.subscriptions,
    });
  };
}
