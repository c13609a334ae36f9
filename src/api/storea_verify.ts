/** `POST /v1/storea/verify` (spec 4.1). */
import { z } from "zod";
import { ServiceError } from "../errors.ts";
import type { Route } from "../http/router.ts";
import { admitVerifyRequest, credentialsMissing, type VerifyDeps } from "./verify_common.ts";

/** The request body of spec 4.1; unknown fields are refused. */
export const storeaVerifyRequest = z.strictObject({
  transactionId: z.string().min(1).max(128),
  environment: z.enum(["production", "sandbox"]).optional(),
});

/** A valid store A verify request. */
export type StoreaVerifyRequest = z.infer<typeof storeaVerifyRequest>;

/** The store A verify route. */
export function storeaVerifyRoute(deps: VerifyDeps): Route {
  return {
    method: "POST",
    pattern: "/v1/storea/verify",
    handler: async (request, context) => {
      const admitted = await admitVerifyRequest(request, context, deps, storeaVerifyRequest);
      if (admitted.credentials.storea === null) throw credentialsMissing("storea");
      // The App Store Server API client is not part of this build yet.
      throw new ServiceError("APPLE_API_ERROR", "store A verification is not available yet", {
        details: { status: null, upstreamCode: null },
      });
    },
  };
}
