/**
 * Store A verification (docs/verify.md, "POST /v1/storea/verify"): finds a transaction in the
 * tenant's environment(s), verifies the JWS the App Store returned, checks the bundle and
 * normalizes. The verifier also carries the store gateway's lookups and actions, which share its
 * client, its verifier of Apple's signatures and its deadline.
 */
import type { StoreaCredentials } from "./credentials.ts";
import type { StoreaApiClient, StoreaEnvironmentName } from "./api_client.ts";
import type { StoreaJwsVerifier } from "./jws.ts";
import { normalizeTransaction, type StoreaTransaction } from "./transaction.ts";
import {
  askEnvironments,
  bundleMismatch,
  malformedAnswer,
  type StoreaContext,
  transactionNotFound,
  verifiedFromStore,
} from "./lookup.ts";
import {
  lookUpSubscriptions,
  type StoreaSubscriptionsInput,
  type StoreaSubscriptionsOutcome,
} from "./subscriptions.ts";
import { lookUpHistory, type StoreaHistoryInput, type StoreaHistoryOutcome } from "./history.ts";
import {
  sendConsumption,
  type StoreaConsumptionInput,
  type StoreaConsumptionOutcome,
} from "./consumption.ts";

/** A store A verify request, as the route validated it. */
export interface StoreaVerifyInput {
  transactionId: string;
  /** The per-call override of the tenant's environment. */
  environment?: StoreaEnvironmentName;
}

/** A verify outcome: a normalized transaction, or a domain failure answered with HTTP 200. */
export type StoreaVerifyOutcome =
  | {
    valid: true;
    environment: StoreaEnvironmentName;
    appUserId: string | null;
    transaction: StoreaTransaction;
    /** The upstream HTTP status, for the validation audit. */
    upstreamStatus: number;
  }
  | {
    valid: false;
    error: "TRANSACTION_NOT_FOUND" | "BUNDLE_ID_MISMATCH";
    message: string;
    upstreamStatus: number;
  };

/** What the verifier needs. */
export interface StoreaVerifierOptions {
  client: StoreaApiClient;
  jws: StoreaJwsVerifier;
  /** Each operation's deadline, both environments and retries included. */
  timeoutMs: number;
}

/** Verifies store A transactions, and looks up and acts for any tenant. */
export class StoreaVerifier {
  #context: StoreaContext;

  constructor(options: StoreaVerifierOptions) {
    this.#context = { client: options.client, jws: options.jws, timeoutMs: options.timeoutMs };
  }

  /** Verifies one transaction with the tenant's credentials. Upstream failures throw. */
  async verify(
    credentials: StoreaCredentials,
    input: StoreaVerifyInput,
  ): Promise<StoreaVerifyOutcome> {
    const { client, jws } = this.#context;
    const outcome = await askEnvironments(
      this.#context,
      credentials,
      input.environment,
      (environment, signal) =>
        client.send(credentials, {
          operation: "get_transaction",
          method: "GET",
          path: `/inApps/v1/transactions/${encodeURIComponent(input.transactionId)}`,
          idempotent: true,
        }, { environment, signal }),
    );
    if (!outcome.found) return transactionNotFound(outcome.environments);
    const signedTransactionInfo = outcome.answer.kind === "ok"
      ? outcome.answer.body?.signedTransactionInfo
      : undefined;
    if (typeof signedTransactionInfo !== "string") throw malformedAnswer("without a transaction");
    const payload = await verifiedFromStore(jws, signedTransactionInfo, "signedTransactionInfo");
    if (payload.bundleId !== credentials.bundleId) {
      return bundleMismatch(payload.bundleId, credentials);
    }
    const transaction = normalizeTransaction(payload, signedTransactionInfo);
    return {
      valid: true,
      environment: outcome.environment,
      appUserId: transaction.appAccountToken,
      transaction,
      upstreamStatus: 200,
    };
  }

  /** The statuses of every subscription of the transaction's customer (Get All Subscription Statuses). */
  subscriptions(
    credentials: StoreaCredentials,
    input: StoreaSubscriptionsInput,
  ): Promise<StoreaSubscriptionsOutcome> {
    return lookUpSubscriptions(this.#context, credentials, input);
  }

  /** One page of the transaction's customer's history (Get Transaction History v2). */
  history(
    credentials: StoreaCredentials,
    input: StoreaHistoryInput,
  ): Promise<StoreaHistoryOutcome> {
    return lookUpHistory(this.#context, credentials, input);
  }

  /** Sends consumption information for a refund request (Send Consumption Information v2). */
  sendConsumption(
    credentials: StoreaCredentials,
    input: StoreaConsumptionInput,
  ): Promise<StoreaConsumptionOutcome> {
    return sendConsumption(this.#context, credentials, input);
  }
}
