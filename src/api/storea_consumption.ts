/** `POST /v1/storea/consumption` (docs/store_gateway.md, "Answering refund requests"). */
import { z } from "zod";
import { errorCode } from "../errors.ts";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import {
  CONSUMPTION_PERCENTAGE_MAX,
  DELIVERY_STATUSES,
  REFUND_PREFERENCES,
  type StoreaConsumptionOutcome,
} from "../storea/consumption.ts";
import type { StoreaVerifyDeps } from "./storea_verify.ts";
import {
  admitVerifyRequest,
  domainFailureResponse,
  logStoreAction,
  pathSegmentField,
} from "./verify_common.ts";

/**
 * The request body: the transaction, and Apple's `ConsumptionRequest` (v2) checked against the
 * values and rules Apple documents, so a refusal costs no call; unknown fields are refused.
 */
export const storeaConsumptionRequest = z.strictObject({
  transactionId: pathSegmentField(1, 128),
  environment: z.enum(["production", "sandbox"]).optional(),
  customerConsented: z.boolean().refine((consented) => consented, {
    message: "must be true: consumption information is sent only with the customer's consent",
  }),
  sampleContentProvided: z.boolean(),
  deliveryStatus: z.enum(DELIVERY_STATUSES),
  consumptionPercentage: z.int().min(0).max(CONSUMPTION_PERCENTAGE_MAX).optional(),
  refundPreference: z.enum(REFUND_PREFERENCES).optional(),
}).superRefine((body, context) => {
  const percentage = body.consumptionPercentage;
  if (percentage === undefined) return;
  if (body.deliveryStatus !== "DELIVERED" && percentage !== 0) {
    context.addIssue({
      code: "custom",
      path: ["consumptionPercentage"],
      message: "must be 0 when deliveryStatus is not DELIVERED",
    });
  }
  if (
    body.refundPreference === "GRANT_PRORATED" &&
    (percentage <= 0 || percentage >= CONSUMPTION_PERCENTAGE_MAX)
  ) {
    context.addIssue({
      code: "custom",
      path: ["consumptionPercentage"],
      message: "with GRANT_PRORATED, must be greater than 0 and less than 100000 " +
        "(leave it out for an auto-renewable subscription)",
    });
  }
});

/** A valid consumption request. */
export type StoreaConsumptionRequest = z.infer<typeof storeaConsumptionRequest>;

/** Answers `POST /v1/storea/consumption`. */
export function storeaConsumptionHandler(deps: StoreaVerifyDeps): Handler {
  return async (request, context) => {
    const { reqId, tenantId, keyId, body, credentials } = await admitVerifyRequest(
      request,
      context,
      {
        deps,
        store: "storea",
        schema: storeaConsumptionRequest,
      },
    );
    const { transactionId, environment, ...fields } = body;
    const action = {
      reqId,
      tenantId,
      keyId,
      store: "storea" as const,
      action: "consumption",
      transactionId,
    };
    let outcome: StoreaConsumptionOutcome;
    try {
      outcome = await deps.storea.sendConsumption(credentials, {
        transactionId,
        environment,
        request: { ...fields, customerConsented: true },
      });
    } catch (error) {
      logStoreAction(deps.log, { ...action, outcome: errorCode(error, "INTERNAL_ERROR") });
      throw error;
    }
    logStoreAction(deps.log, { ...action, outcome: outcome.valid ? "sent" : outcome.error });
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, { valid: true, version: deps.version, transactionId, sent: true });
  };
}
