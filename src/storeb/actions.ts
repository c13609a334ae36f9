/**
 * Store B actions (docs/store_gateway.md, "Store B: acknowledging purchases"): acknowledge a
 * purchase, consume a one-time product, and acknowledge a verified purchase in the verify call.
 *
 * Each reads the purchase first, with verify's lookup, and writes only when the store has not
 * done it yet: Google does not document its answer to a repeated acknowledge or consume, so the
 * read is what makes a repeated request answer `alreadyAcknowledged` / `alreadyConsumed`.
 *
 * A write is never retried blindly (docs/architecture.md, "Retrying store B calls"):
 * when its answer is lost (a timeout, a dropped connection, a 5xx) the purchase is read again to
 * learn whether the write took effect, and the write is sent once more only when it did not.
 */
import { ServiceError } from "../errors.ts";
import type { ServiceAccount } from "./oauth.ts";
import type { PurchaseWrite, StorebApiClient, WriteAttempt } from "./api_client.ts";
import type { ProductPurchase, SubscriptionPurchase } from "./purchase.ts";
import { lookUpPurchase, notFound, type PurchaseRef, upstreamFailure } from "./lookup.ts";
import { googleApiError } from "./upstream.ts";

/** The client and the tenant's service account an action uses. */
export interface ActionContext {
  client: StorebApiClient;
  account: ServiceAccount;
}

/** A domain failure of an action, answered with HTTP 200 and `valid: false`. */
export interface StorebActionFailure {
  valid: false;
  error: "PURCHASE_NOT_FOUND" | "PACKAGE_NAME_MISMATCH" | "PURCHASE_PENDING";
  message: string;
}

/** What `POST /v1/storeb/acknowledge` answers. */
export type StorebAcknowledgeOutcome =
  | { valid: true; acknowledged: true; alreadyAcknowledged: boolean }
  | StorebActionFailure;

/** What `POST /v1/storeb/consume` answers. */
export type StorebConsumeOutcome =
  | { valid: true; consumed: true; alreadyConsumed: boolean }
  | StorebActionFailure;

/** What came of `acknowledge: true` on a valid verify. */
export interface VerifyAcknowledgement {
  /** Whether the purchase is acknowledged after the call, by it or before it. */
  acknowledged: boolean;
  /** Set when an acknowledgement was attempted and failed. */
  acknowledgeError?: { error: string; message: string };
  /** For the `store_action` line: `acknowledged`, `already_acknowledged`, `not_paid` or a code. */
  outcome: string;
}

/**
 * How long an action may take: each step (a read or a write, with its token and the client's own
 * retries) gets at most `stepMs` (`UPSTREAM_TIMEOUT`), and all of them together at most three
 * times that, which the request's deadline (3 x `UPSTREAM_TIMEOUT` + 5 s) leaves room for.
 */
export class ActionBudget {
  readonly stepMs: number;
  readonly totalMs: number;
  #endsAt: number;

  constructor(stepMs: number, steps = 3) {
    this.stepMs = stepMs;
    this.totalMs = steps * stepMs;
    this.#endsAt = performance.now() + this.totalMs;
  }

  /**
   * The time limit of the next step. Throws `spent` (the failure that called for the step) or a
   * 502 `GOOGLE_API_ERROR` when nothing is left.
   */
  next(spent?: ServiceError): number {
    const left = Math.floor(this.#endsAt - performance.now());
    if (left > 0) return Math.min(this.stepMs, left);
    throw spent ?? googleApiError(
      `the store B API did not answer within ${this.totalMs} ms`,
      { status: null, upstreamCode: null },
    );
  }
}

/** What the service needs to know of a purchase before acting on it. */
export interface PurchaseState {
  /** Payment not completed: it can be neither acknowledged nor consumed yet. */
  pending: boolean;
  /**
   * Paid: a product purchased; a subscription active, in its grace period, or canceled but still
   * within the period paid for (Google refunds it too if it is not acknowledged).
   */
  paid: boolean;
  /** Acknowledged, or (a product) consumed, which acknowledges it too. */
  acknowledged: boolean;
  /** A product consumed. */
  consumed: boolean;
}

/** Reads the states that matter to acknowledge and consume from a normalized purchase. */
export function purchaseStateOf(purchase: SubscriptionPurchase | ProductPurchase): PurchaseState {
  if (purchase.kind === "storeb#subscriptionPurchaseV2") {
    const state = purchase.rawResponse.subscriptionState;
    return {
      pending: state === "SUBSCRIPTION_STATE_PENDING",
      paid: state === "SUBSCRIPTION_STATE_ACTIVE" ||
        state === "SUBSCRIPTION_STATE_IN_GRACE_PERIOD" ||
        (state === "SUBSCRIPTION_STATE_CANCELED" &&
          Date.parse(purchase.expiryTime ?? "") > Date.now()),
      acknowledged: purchase.acknowledgementState === 1,
      consumed: false,
    };
  }
  return {
    pending: purchase.purchaseState === 2,
    paid: purchase.purchaseState === 0,
    acknowledged: purchase.acknowledgementState === 1 || purchase.consumptionState === 1,
    consumed: purchase.consumptionState === 1,
  };
}

/** Acknowledges `ref` unless it is already acknowledged. Upstream failures throw. */
export async function acknowledgePurchase(
  context: ActionContext,
  ref: PurchaseRef,
  budget: ActionBudget,
): Promise<StorebAcknowledgeOutcome> {
  const read = await lookUpPurchase(context.client, context.account, ref, budget.next());
  if (!read.found) return failure(read);
  const state = purchaseStateOf(read.normalized.purchase);
  if (state.pending) return pending(ref.type, "acknowledged");
  if (state.acknowledged) return { valid: true, acknowledged: true, alreadyAcknowledged: true };
  const written = await writeAndConfirm(context, budget, { ...ref, action: "acknowledge" });
  if (!written.done) return written.failure;
  return { valid: true, acknowledged: true, alreadyAcknowledged: written.byOther };
}

/** Consumes the one-time product `ref` unless it is already consumed. Upstream failures throw. */
export async function consumePurchase(
  context: ActionContext,
  ref: Omit<PurchaseRef, "type">,
  budget: ActionBudget,
): Promise<StorebConsumeOutcome> {
  const product: PurchaseRef = { ...ref, type: "product" };
  const read = await lookUpPurchase(context.client, context.account, product, budget.next());
  if (!read.found) return failure(read);
  const state = purchaseStateOf(read.normalized.purchase);
  if (state.pending) return pending("product", "consumed");
  if (state.consumed) return { valid: true, consumed: true, alreadyConsumed: true };
  // Not acknowledged yet is fine: Google lets a purchase be consumed, which acknowledges it.
  const written = await writeAndConfirm(context, budget, { ...product, action: "consume" });
  if (!written.done) return written.failure;
  return { valid: true, consumed: true, alreadyConsumed: written.byOther };
}

/**
 * `acknowledge: true` on verify: acknowledges `purchase`, just read, when it is paid and not yet
 * acknowledged. A failed attempt is reported, not thrown: the verify answer stands.
 */
export async function acknowledgeVerified(
  context: ActionContext,
  ref: PurchaseRef,
  purchase: SubscriptionPurchase | ProductPurchase,
  budget: ActionBudget,
): Promise<VerifyAcknowledgement> {
  const state = purchaseStateOf(purchase);
  if (state.acknowledged) return { acknowledged: true, outcome: "already_acknowledged" };
  if (!state.paid) return { acknowledged: false, outcome: "not_paid" };
  try {
    const written = await writeAndConfirm(context, budget, { ...ref, action: "acknowledge" });
    if (written.done) {
      return {
        acknowledged: true,
        outcome: written.byOther ? "already_acknowledged" : "acknowledged",
      };
    }
    const { error, message } = written.failure;
    return { acknowledged: false, acknowledgeError: { error, message }, outcome: error };
  } catch (error) {
    if (!(error instanceof ServiceError)) throw error;
    return {
      acknowledged: false,
      acknowledgeError: { error: error.code, message: error.message },
      outcome: error.code,
    };
  }
}

/** A write's end: done (by this call, or by someone else meanwhile), or a domain failure. */
type WriteOutcome =
  | { done: true; byOther: boolean }
  | { done: false; failure: StorebActionFailure };

/**
 * Sends `write` and makes sure of its outcome. An answer decides: 2xx done, 404/410
 * `PURCHASE_NOT_FOUND`, 429 and other refusals throw. No answer, or a 5xx, leaves the outcome
 * unknown: the purchase is read, and the write is sent once more only when the read says it did
 * not take effect. A 400 or 409 is also followed by a read, since the app (or another replica)
 * may have acknowledged or consumed the purchase between the first read and the write.
 */
async function writeAndConfirm(
  context: ActionContext,
  budget: ActionBudget,
  write: PurchaseWrite,
): Promise<WriteOutcome> {
  const isDone = (state: PurchaseState) =>
    write.action === "consume" ? state.consumed : state.acknowledged;
  let lost: ServiceError | undefined;
  for (let attempt = 1; attempt <= 2; attempt++) {
    const sent = await context.client.writePurchase(context.account, write, {
      timeoutMs: budget.next(lost),
    });
    let refused: ServiceError | undefined;
    if (sent.answered) {
      const { status } = sent.response;
      if (status >= 200 && status < 300) return { done: true, byOther: false };
      if (status === 404 || status === 410) {
        return { done: false, failure: failure(notFound(write.type, status)) };
      }
      if (status === 400 || status === 409) refused = upstreamFailure(sent.response);
      else if (status < 500) throw upstreamFailure(sent.response);
      else lost = upstreamFailure(sent.response);
    } else {
      lost = noAnswer(write, sent);
    }
    const read = await lookUpPurchase(
      context.client,
      context.account,
      write,
      budget.next(refused ?? lost),
    );
    if (!read.found) return { done: false, failure: failure(read) };
    const state = purchaseStateOf(read.normalized.purchase);
    if (isDone(state)) return { done: true, byOther: refused !== undefined };
    if (refused) throw refused;
    if (state.pending) {
      return { done: false, failure: pending(write.type, pastTense(write.action)) };
    }
  }
  throw lost!;
}

function noAnswer(write: PurchaseWrite, sent: Extract<WriteAttempt, { answered: false }>) {
  const what = sent.timedOut ? "did not answer in time" : "could not be reached";
  return googleApiError(`the store B API ${what} when asked to ${write.action} the purchase`, {
    status: null,
    upstreamCode: null,
    cause: sent.error,
  });
}

function failure(
  outcome: { error: StorebActionFailure["error"]; message: string },
): StorebActionFailure {
  return { valid: false, error: outcome.error, message: outcome.message };
}

function pending(type: PurchaseRef["type"], what: "acknowledged" | "consumed") {
  return failure({
    error: "PURCHASE_PENDING",
    message: `this ${type} purchase is pending: its payment has not completed, so it cannot be ` +
      `${what} yet; Google's three days to acknowledge start when the payment completes`,
  });
}

function pastTense(action: PurchaseWrite["action"]): "acknowledged" | "consumed" {
  return action === "consume" ? "consumed" : "acknowledged";
}
