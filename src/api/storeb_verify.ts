/** `POST /v1/storeb/verify` (docs/verify.md, "POST /v1/storeb/verify"). */
import { z } from "zod";
import type { StorebVerifier } from "../storeb/verify.ts";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import {
  admitVerifyRequest,
  domainFailureResponse,
  logStoreAction,
  pathSegmentField,
  runVerification,
  type VerifyDeps,
} from "./verify_common.ts";

/** The request body; unknown fields are refused. */
export const storebVerifyRequest = z.strictObject({
  // Checked against the tenant's package before it could reach a URL.
  packageName: z.string().min(1).max(200),
  productId: pathSegmentField(1, 200),
  purchaseToken: pathSegmentField(1, 4096),
  type: z.enum(["subscription", "product"]),
  // Acknowledge a paid purchase before answering
  // (docs/store_gateway.md, "Store B: acknowledging purchases").
  acknowledge: z.boolean().optional(),
});

/** A valid store B verify request. */
export type StorebVerifyRequest = z.infer<typeof storebVerifyRequest>;

/** What the store B verify route needs. */
export interface StorebVerifyDeps extends VerifyDeps {
  storeb: StorebVerifier;
}

/** Answers `POST /v1/storeb/verify`. */
export function storebVerifyHandler(deps: StorebVerifyDeps): Handler {
  return async (request, context) => {
    const { tenantId, keyId, body, credentials } = await admitVerifyRequest(request, context, {
      deps,
      store: "storeb",
      schema: storebVerifyRequest,
    });
    const { packageName, productId, purchaseToken, type } = body;
    const acknowledge = body.acknowledge === true;
    const outcome = await runVerification(deps, {
      tenantId,
      store: "storeb",
      subject: purchaseToken,
      // With acknowledge the answer differs (and a write may follow): another question.
      variant: `${type}\0${packageName}\0${productId}${acknowledge ? "\0acknowledge" : ""}`,
    }, () => deps.storeb.verify(credentials, body));
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    const answer: Record<string, unknown> = {
      valid: true,
      version: deps.version,
      appUserId: outcome.appUserId,
      purchase: outcome.purchase,
    };
    const { acknowledgement } = outcome;
    if (acknowledge && acknowledgement) {
      logStoreAction(deps.log, {
        reqId: context.reqId,
        tenantId,
        keyId,
        store: "storeb",
        action: "acknowledge",
        productId,
        purchaseToken,
        outcome: acknowledgement.outcome,
      });
      answer.acknowledged = acknowledgement.acknowledged;
      if (acknowledgement.acknowledgeError) {
        answer.acknowledgeError = acknowledgement.acknowledgeError;
      }
    }
    return jsonResponse(200, answer);
  };
}
