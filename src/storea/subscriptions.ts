/**
 * The statuses of a customer's subscriptions (docs/store_gateway.md, "POST
 * /v1/storea/subscriptions"): Get All Subscription Statuses in the tenant's environment(s), every
 * signed transaction and renewal info verified before anything in it is used, one entry per last
 * transaction of each subscription group.
 */
import type { StoreaCredentials } from "./credentials.ts";
import { isJsonObject } from "../lib/json.ts";
import type { StoreaEnvironmentName } from "./api_client.ts";
import {
  askEnvironments,
  bundleMismatch,
  malformedAnswer,
  type StoreaContext,
  transactionNotFound,
  verifiedFromStore,
} from "./lookup.ts";
import { normalizeRenewal, type StoreaRenewal } from "./renewal.ts";
import { normalizeTransaction, type StoreaTransaction } from "./transaction.ts";

/** A subscriptions request, as the route validated it. */
export interface StoreaSubscriptionsInput {
  /** Any transaction of the customer. */
  transactionId: string;
  environment?: StoreaEnvironmentName;
}

/** Apple's `status` 1 to 5 by name. */
export const SUBSCRIPTION_STATUS_NAMES: Readonly<Record<number, StoreaStatusName>> = {
  1: "active",
  2: "expired",
  3: "billing_retry",
  4: "grace_period",
  5: "revoked",
};

/** The name of a subscription status. */
export type StoreaStatusName = "active" | "expired" | "billing_retry" | "grace_period" | "revoked";

/** One subscription: the last transaction of one original transaction in its group. */
export interface StoreaSubscription {
  subscriptionGroupIdentifier: string | null;
  originalTransactionId: string;
  /** As Apple sent it: 1 to 5 today. */
  status: number | null;
  /** Null for a status Apple added after this version. */
  statusName: StoreaStatusName | null;
  transaction: StoreaTransaction;
  /** Null when Apple sent no renewal info. */
  renewal: StoreaRenewal | null;
}

/** A subscriptions outcome, or a domain failure answered with HTTP 200. */
export type StoreaSubscriptionsOutcome =
  | {
    valid: true;
    environment: StoreaEnvironmentName;
    appUserId: string | null;
    subscriptions: StoreaSubscription[];
    upstreamStatus: number;
  }
  | {
    valid: false;
    error: "TRANSACTION_NOT_FOUND" | "BUNDLE_ID_MISMATCH";
    message: string;
    upstreamStatus: number;
  };

/** One entry of Apple's `lastTransactions`, checked for shape but not yet verified. */
interface LastTransaction {
  subscriptionGroupIdentifier: string | null;
  originalTransactionId: string | null;
  status: number | null;
  signedTransactionInfo: string;
  signedRenewalInfo: string | null;
}

/** Looks the customer's subscriptions up with the tenant's credentials. Upstream failures throw. */
export async function lookUpSubscriptions(
  context: StoreaContext,
  credentials: StoreaCredentials,
  input: StoreaSubscriptionsInput,
): Promise<StoreaSubscriptionsOutcome> {
  const outcome = await askEnvironments(
    context,
    credentials,
    input.environment,
    (environment, signal) =>
      context.client.send(credentials, {
        operation: "subscriptions",
        method: "GET",
        path: `/inApps/v1/subscriptions/${encodeURIComponent(input.transactionId)}`,
        idempotent: true,
      }, { environment, signal }),
  );
  if (!outcome.found) return transactionNotFound(outcome.environments);
  const body = outcome.answer.kind === "ok" ? outcome.answer.body : null;
  const entries = lastTransactionsOf(body);
  if (typeof body?.bundleId === "string" && body.bundleId !== credentials.bundleId) {
    return bundleMismatch(body.bundleId, credentials);
  }

  const verified = await Promise.all(entries.map(async (entry) => ({
    entry,
    transaction: await verifiedFromStore(
      context.jws,
      entry.signedTransactionInfo,
      "signedTransactionInfo",
    ),
    renewal: entry.signedRenewalInfo === null
      ? null
      : await verifiedFromStore(context.jws, entry.signedRenewalInfo, "signedRenewalInfo"),
  })));
  const foreign = verified.find(({ transaction }) => transaction.bundleId !== credentials.bundleId);
  if (foreign) return bundleMismatch(foreign.transaction.bundleId, credentials);

  const subscriptions = verified.map(({ entry, transaction, renewal }): StoreaSubscription => {
    const normalized = normalizeTransaction(transaction, entry.signedTransactionInfo);
    return {
      subscriptionGroupIdentifier: entry.subscriptionGroupIdentifier,
      originalTransactionId: entry.originalTransactionId ?? normalized.originalTransactionId,
      status: entry.status,
      statusName: entry.status === null ? null : SUBSCRIPTION_STATUS_NAMES[entry.status] ?? null,
      transaction: normalized,
      renewal: renewal === null ? null : normalizeRenewal(renewal, entry.signedRenewalInfo!),
    };
  });
  return {
    valid: true,
    environment: outcome.environment,
    appUserId: mostRecent(verified.map((v) => v.transaction))?.appAccountToken ?? null,
    subscriptions,
    upstreamStatus: 200,
  };
}

/**
 * The transaction bought last (by `purchaseDate`), whose `appAccountToken` is the customer's
 * `appUserId` (docs/store_gateway.md, "POST /v1/storea/subscriptions").
 */
function mostRecent(transactions: Record<string, unknown>[]): { appAccountToken: string } | null {
  let latest: Record<string, unknown> | null = null;
  for (const transaction of transactions) {
    const date = transaction.purchaseDate;
    if (typeof date !== "number") continue;
    if (latest === null || date > (latest.purchaseDate as number)) latest = transaction;
  }
  if (latest === null || typeof latest.appAccountToken !== "string") return null;
  return { appAccountToken: latest.appAccountToken };
}

/** Apple's `data[].lastTransactions[]`, flattened with each group's identifier. */
function lastTransactionsOf(body: Record<string, unknown> | null): LastTransaction[] {
  if (!Array.isArray(body?.data)) throw malformedAnswer("subscription statuses without data");
  const entries: LastTransaction[] = [];
  for (const group of body.data) {
    if (!isJsonObject(group) || !Array.isArray(group.lastTransactions)) {
      throw malformedAnswer("a subscription group without lastTransactions");
    }
    const groupId = typeof group.subscriptionGroupIdentifier === "string"
      ? group.subscriptionGroupIdentifier
      : null;
    for (const item of group.lastTransactions) {
      if (!isJsonObject(item) || typeof item.signedTransactionInfo !== "string") {
        throw malformedAnswer("a subscription without signedTransactionInfo");
      }
      entries.push({
        subscriptionGroupIdentifier: groupId,
        originalTransactionId: typeof item.originalTransactionId === "string"
          ? item.originalTransactionId
          : null,
        status: typeof item.status === "number" && Number.isInteger(item.status)
          ? item.status
          : null,
        signedTransactionInfo: item.signedTransactionInfo,
        signedRenewalInfo: typeof item.signedRenewalInfo === "string"
          ? item.signedRenewalInfo
          : null,
      });
    }
  }
  return entries;
}
