/**
 * `POST /v1/storeb/consume` (docs/store_gateway.md, "Store B: acknowledging purchases"): consumes a
 * store B one-time product purchase, once, whatever the number of requests. Consuming also
 * acknowledges it.
 */
import { z } from "zod";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import { admitVerifyRequest, domainFailureResponse, pathSegmentField } from "./verify_common.ts";
import type { StorebVerifyDeps } from "./storeb_verify.ts";
import { runStorebAction } from "./storeb_acknowledge.ts";

/** The request body; unknown fields are refused. No `type`: only one-time products are consumed. */
export const storebConsumeRequest = z.strictObject({
  // Checked against the tenant's package before it could reach a URL.
  packageName: z.string().min(1).max(200),
  productId: pathSegmentField(1, 200),
  purchaseToken: pathSegmentField(1, 4096),
});

/** Answers `POST /v1/storeb/consume`. */
export function storebConsumeHandler(deps: StorebVerifyDeps): Handler {
  return async (request, context) => {
    const admitted = await admitVerifyRequest(request, context, {
      deps,
      store: "storeb",
      schema: storebConsumeRequest,
    });
    const { body } = admitted;
    const outcome = await runStorebAction(deps, admitted, {
      action: "consume",
      variant: "product",
      run: (credentials) => deps.storeb.consume(credentials, body),
      done: (success) => success.alreadyConsumed ? "already_consumed" : "consumed",
    });
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, {
      valid: true,
      version: deps.version,
      consumed: true,
      alreadyConsumed: outcome.alreadyConsumed,
    });
  };
}
