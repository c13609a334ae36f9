/** `POST /v1/storea/history` (docs/store_gateway.md, "POST /v1/storea/history"). */
import { z } from "zod";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import { HISTORY_PRODUCT_TYPES, type StoreaHistoryInput } from "../storea/history.ts";
import type { StoreaVerifyDeps } from "./storea_verify.ts";
import {
  admitVerifyRequest,
  domainFailureResponse,
  pathSegmentField,
  runVerification,
} from "./verify_common.ts";

/** Each array filter holds at most this many items. */
export const HISTORY_FILTER_LIMIT = 50;

/** Text sent to Apple as a query parameter: well-formed Unicode, `max` characters at most. */
function queryText(max: number) {
  return z.string().min(1).max(max).refine((value) => value.isWellFormed(), {
    message: "must be well-formed Unicode (no unpaired surrogate)",
  });
}

/** An ISO-8601 date and time with a zone (`Z` or an offset), not before 1970. */
const isoDateTime = z.iso.datetime({ offset: true })
  .refine((value) => Date.parse(value) >= 0, { message: "must not be before 1970" });

/** The request body; unknown fields are refused. */
export const storeaHistoryRequest = z.strictObject({
  transactionId: pathSegmentField(1, 128),
  environment: z.enum(["production", "sandbox"]).optional(),
  revision: queryText(1024).optional(),
  sort: z.enum(["ascending", "descending"]).default("ascending"),
  startDate: isoDateTime.optional(),
  endDate: isoDateTime.optional(),
  productIds: z.array(queryText(200)).max(HISTORY_FILTER_LIMIT).optional(),
  productTypes: z.array(z.enum(HISTORY_PRODUCT_TYPES)).max(HISTORY_FILTER_LIMIT).optional(),
  subscriptionGroupIdentifiers: z.array(queryText(200)).max(HISTORY_FILTER_LIMIT).optional(),
  inAppOwnershipType: z.enum(["FAMILY_SHARED", "PURCHASED"]).optional(),
  revoked: z.boolean().optional(),
}).refine(
  // Apple refuses such a window; saying so here saves the tenant a call to learn it.
  (body) =>
    body.startDate === undefined || body.endDate === undefined ||
    Date.parse(body.startDate) < Date.parse(body.endDate),
  { message: "must be later than startDate", path: ["endDate"] },
);

/** A valid history request. */
export type StoreaHistoryRequest = z.infer<typeof storeaHistoryRequest>;

/** The request as the store A client takes it: dates in epoch milliseconds. */
export function historyInput(body: StoreaHistoryRequest): StoreaHistoryInput {
  const { startDate, endDate, ...rest } = body;
  return {
    ...rest,
    ...(startDate === undefined ? {} : { startDate: Date.parse(startDate) }),
    ...(endDate === undefined ? {} : { endDate: Date.parse(endDate) }),
  };
}

/** Answers `POST /v1/storea/history`. */
export function storeaHistoryHandler(deps: StoreaVerifyDeps): Handler {
  return async (request, context) => {
    const { tenantId, body, credentials } = await admitVerifyRequest(request, context, {
      deps,
      store: "storea",
      schema: storeaHistoryRequest,
    });
    const input = historyInput(body);
    const { transactionId, ...filters } = input;
    const outcome = await runVerification(deps, {
      tenantId,
      store: "storea",
      subject: transactionId,
      // Only requests asking exactly the same page share one call.
      variant: `history\0${JSON.stringify(filters)}`,
    }, () => deps.storea.history(credentials, input));
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, {
      valid: true,
      version: deps.version,
      environment: outcome.environment,
      transactions: outcome.transactions,
      revision: outcome.revision,
      hasMore: outcome.hasMore,
    });
  };
}
