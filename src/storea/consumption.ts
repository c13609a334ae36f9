/**
 * Consumption information for a refund request (docs/store_gateway.md, "Answering refund
 * requests"): Send Consumption Information v2, a PUT of Apple's `ConsumptionRequest` for one
 * transaction. The PUT replaces what Apple holds for the transaction, so sending the same body
 * twice leaves Apple as sending it once does: it is retried once like a read
 * (docs/architecture.md, "Retrying store A calls").
 */
import type { StoreaCredentials } from "./credentials.ts";
import type { StoreaEnvironmentName } from "./api_client.ts";
import {
  askEnvironments,
  refusedByApple,
  type StoreaContext,
  transactionNotFound,
} from "./lookup.ts";

/** Apple's `deliveryStatus` values. */
export const DELIVERY_STATUSES = [
  "DELIVERED",
  "UNDELIVERED_QUALITY_ISSUE",
  "UNDELIVERED_WRONG_ITEM",
  "UNDELIVERED_SERVER_OUTAGE",
  "UNDELIVERED_OTHER",
] as const;

/** Apple's `refundPreference` values. */
export const REFUND_PREFERENCES = ["DECLINE", "GRANT_FULL", "GRANT_PRORATED"] as const;

/** The highest `consumptionPercentage`: 100 % in milliunits. */
export const CONSUMPTION_PERCENTAGE_MAX = 100_000;

/** Apple's `ConsumptionRequest` (v2), exactly the fields it documents. */
export interface ConsumptionRequest {
  /** Always true: without the customer's consent nothing is sent. */
  customerConsented: true;
  sampleContentProvided: boolean;
  deliveryStatus: (typeof DELIVERY_STATUSES)[number];
  /** Milliunits: 0 to 100000. */
  consumptionPercentage?: number;
  refundPreference?: (typeof REFUND_PREFERENCES)[number];
}

/** A consumption request, as the route validated it. */
export interface StoreaConsumptionInput {
  transactionId: string;
  environment?: StoreaEnvironmentName;
  request: ConsumptionRequest;
}

/** Sent, or not sent because no environment knows the transaction. */
export type StoreaConsumptionOutcome =
  | { valid: true; environment: StoreaEnvironmentName; upstreamStatus: number }
  | {
    valid: false;
    error: "TRANSACTION_NOT_FOUND";
    message: string;
    upstreamStatus: number;
  };

/**
 * Sends the consumption information with the tenant's credentials.
 * @throws {ServiceError} 400 `INVALID_REQUEST` with `details.upstreamCode` when Apple refused the
 * values (for one its documentation lets only it check, such as a percentage for an
 * auto-renewable subscription), and the upstream errors of every store A call.
 */
export async function sendConsumption(
  context: StoreaContext,
  credentials: StoreaCredentials,
  input: StoreaConsumptionInput,
): Promise<StoreaConsumptionOutcome> {
  const { request } = input;
  const body = {
    customerConsented: request.customerConsented,
    ...(request.consumptionPercentage === undefined
      ? {}
      : { consumptionPercentage: request.consumptionPercentage }),
    deliveryStatus: request.deliveryStatus,
    ...(request.refundPreference === undefined
      ? {}
      : { refundPreference: request.refundPreference }),
    sampleContentProvided: request.sampleContentProvided,
  };
  const outcome = await askEnvironments(
    context,
    credentials,
    input.environment,
    (environment, signal) =>
      context.client.send(credentials, {
        operation: "consumption",
        method: "PUT",
        path: `/inApps/v2/transactions/consumption/${encodeURIComponent(input.transactionId)}`,
        body,
        idempotent: true,
        answersBadRequest: true,
      }, { environment, signal }),
  );
  if (!outcome.found) return transactionNotFound(outcome.environments);
  const answer = outcome.answer;
  if (answer.kind === "bad_request") throw refusedByApple(answer, "consumption information");
  return { valid: true, environment: outcome.environment, upstreamStatus: answer.status };
}
