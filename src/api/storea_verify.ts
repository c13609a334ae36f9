/** `POST /v1/storea/verify` (docs/verify.md, "POST /v1/storea/verify"). */
import { z } from "zod";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import type { StoreaVerifier } from "../storea/verify.ts";
import {
  admitVerifyRequest,
  domainFailureResponse,
  pathSegmentField,
  runVerification,
  type VerifyDeps,
} from "./verify_common.ts";

/** The request body; unknown fields are refused. */
export const storeaVerifyRequest = z.strictObject({
  transactionId: pathSegmentField(1, 128),
  environment: z.enum(["production", "sandbox"]).optional(),
});

/** A valid store A verify request. */
export type StoreaVerifyRequest = z.infer<typeof storeaVerifyRequest>;

/** What the store A verify route needs. */
export interface StoreaVerifyDeps extends VerifyDeps {
  storea: StoreaVerifier;
}

/** Answers `POST /v1/storea/verify`. */
export function storeaVerifyHandler(deps: StoreaVerifyDeps): Handler {
  return async (request, context) => {
    const { tenantId, body, credentials } = await admitVerifyRequest(request, context, {
      deps,
      store: "storea",
      schema: storeaVerifyRequest,
    });
    const { transactionId, environment } = body;
    const outcome = await runVerification(deps, {
      tenantId,
      store: "storea",
      subject: transactionId,
      variant: environment ?? "",
    }, () => deps.storea.verify(credentials, body));
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, {
      valid: true,
      version: deps.version,
      environment: outcome.environment,
      appUserId: outcome.appUserId,
      transaction: outcome.transaction,
    });
  };
}
