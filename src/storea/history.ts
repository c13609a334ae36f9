/**
 * One page of a customer's transaction history (docs/store_gateway.md, "POST /v1/storea/history"):
 * Get Transaction History v2 with the tenant's filters in Apple's own query parameters, every
 * signed transaction verified before anything in it is used.
 */
import type { StoreaCredentials } from "./credentials.ts";
import type { StoreaEnvironmentName } from "./api_client.ts";
import {
  askEnvironments,
  bundleMismatch,
  malformedAnswer,
  refusedByApple,
  type StoreaContext,
  transactionNotFound,
  verifiedFromStore,
} from "./lookup.ts";
import { normalizeTransaction, type StoreaTransaction } from "./transaction.ts";

/** Apple's product types, as the history filter names them. */
export const HISTORY_PRODUCT_TYPES = [
  "AUTO_RENEWABLE",
  "NON_RENEWABLE",
  "CONSUMABLE",
  "NON_CONSUMABLE",
] as const;

/** A history request, as the route validated it; dates in epoch milliseconds. */
export interface StoreaHistoryInput {
  transactionId: string;
  environment?: StoreaEnvironmentName;
  /** From the previous page's answer. */
  revision?: string;
  sort: "ascending" | "descending";
  startDate?: number;
  endDate?: number;
  productIds?: string[];
  productTypes?: (typeof HISTORY_PRODUCT_TYPES)[number][];
  subscriptionGroupIdentifiers?: string[];
  inAppOwnershipType?: "FAMILY_SHARED" | "PURCHASED";
  revoked?: boolean;
}

/** A page of history, or a domain failure answered with HTTP 200. */
export type StoreaHistoryOutcome =
  | {
    valid: true;
    environment: StoreaEnvironmentName;
    transactions: StoreaTransaction[];
    /** Passed back for the next page. */
    revision: string;
    hasMore: boolean;
    upstreamStatus: number;
  }
  | {
    valid: false;
    error: "TRANSACTION_NOT_FOUND" | "BUNDLE_ID_MISMATCH";
    message: string;
    upstreamStatus: number;
  };

/**
 * Apple's query parameters for `input`, in the order its documentation lists them: `revision`,
 * `sort` upper-case, dates in epoch ms, a repeated singular name per array item, then
 * `inAppOwnershipType` and `revoked`.
 */
export function historyQuery(input: StoreaHistoryInput): [string, string][] {
  const query: [string, string][] = [];
  if (input.revision !== undefined) query.push(["revision", input.revision]);
  query.push(["sort", input.sort.toUpperCase()]);
  if (input.startDate !== undefined) query.push(["startDate", String(input.startDate)]);
  if (input.endDate !== undefined) query.push(["endDate", String(input.endDate)]);
  for (const id of input.productIds ?? []) query.push(["productId", id]);
  for (const type of input.productTypes ?? []) query.push(["productType", type]);
  for (const id of input.subscriptionGroupIdentifiers ?? []) {
    query.push(["subscriptionGroupIdentifier", id]);
  }
  if (input.inAppOwnershipType !== undefined) {
    query.push(["inAppOwnershipType", input.inAppOwnershipType]);
  }
  if (input.revoked !== undefined) query.push(["revoked", String(input.revoked)]);
  return query;
}

/** Reads one page of history with the tenant's credentials. Upstream failures throw. */
export async function lookUpHistory(
  context: StoreaContext,
  credentials: StoreaCredentials,
  input: StoreaHistoryInput,
): Promise<StoreaHistoryOutcome> {
  const query = historyQuery(input);
  const outcome = await askEnvironments(
    context,
    credentials,
    input.environment,
    (environment, signal) =>
      context.client.send(credentials, {
        operation: "history",
        method: "GET",
        path: `/inApps/v2/history/${encodeURIComponent(input.transactionId)}`,
        query,
        idempotent: true,
        // Every value is the tenant's (the revision) or was checked by the route: Apple's 400
        // is the tenant's to fix, not a reason to retry later.
        answersBadRequest: true,
      }, { environment, signal }),
  );
  if (!outcome.found) return transactionNotFound(outcome.environments);
  if (outcome.answer.kind === "bad_request") {
    throw refusedByApple(outcome.answer, "history request");
  }
  const body = outcome.answer.body;
  const signed = body?.signedTransactions;
  if (!Array.isArray(signed) || !signed.every((jws) => typeof jws === "string")) {
    throw malformedAnswer("a history without signedTransactions");
  }
  if (typeof body?.revision !== "string" || typeof body.hasMore !== "boolean") {
    throw malformedAnswer("a history without revision or hasMore");
  }
  if (typeof body.bundleId === "string" && body.bundleId !== credentials.bundleId) {
    return bundleMismatch(body.bundleId, credentials);
  }
  const payloads = await Promise.all(
    signed.map((jws: string) => verifiedFromStore(context.jws, jws, "signedTransactionInfo")),
  );
  const foreign = payloads.find((payload) => payload.bundleId !== credentials.bundleId);
  if (foreign) return bundleMismatch(foreign.bundleId, credentials);
  return {
    valid: true,
    environment: outcome.environment,
    transactions: payloads.map((payload, i) => normalizeTransaction(payload, signed[i])),
    revision: body.revision,
    hasMore: body.hasMore,
    upstreamStatus: 200,
  };
}
