/** `POST /v1/storeb/verify` (spec 4.2). */
import { z } from "zod";
import { ServiceError } from "../errors.ts";
import type { Route } from "../http/router.ts";
import { admitVerifyRequest, credentialsMissing, type VerifyDeps } from "./verify_common.ts";

/** The request body of spec 4.2; unknown fields are refused. */
export const storebVerifyRequest = z.strictObject({
  packageName: z.string().min(1).max(200),
  productId: z.string().min(1).max(200),
  purchaseToken: z.string().min(1).max(4096),
  type: z.enum(["subscription", "product"]),
});

/** A valid store B verify request. */
export type StorebVerifyRequest = z.infer<typeof storebVerifyRequest>;

/** The store B verify route. */
export function storebVerifyRoute(deps: VerifyDeps): Route {
  return {
    method: "POST",
    pattern: "/v1/storeb/verify",
    handler: async (request, context) => {
      const admitted = await admitVerifyRequest(request, context, deps, storebVerifyRequest);
      if (admitted.credentials.storeb === null) throw credentialsMissing("storeb");
      // The Play Developer API client is not part of this build yet.
      throw new ServiceError("GOOGLE_API_ERROR", "store B verification is not available yet", {
        details: { status: null, upstreamCode: null },
      });
    },
  };
}
