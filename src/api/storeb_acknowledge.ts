/**
 * `POST /v1/storeb/acknowledge` (docs/store_gateway.md, "Store B: acknowledging purchases"):
 * acknowledges a store B purchase, once, whatever the number of requests.
 */
import { z } from "zod";
import type { StorebCredentials } from "../storeb/credentials.ts";
import { errorCode } from "../errors.ts";
import type { Handler } from "../http/router.ts";
import { jsonResponse } from "../http/server.ts";
import {
  admitVerifyRequest,
  domainFailureResponse,
  logStoreAction,
  pathSegmentField,
} from "./verify_common.ts";
import type { StorebVerifyDeps } from "./storeb_verify.ts";

/** The request body; unknown fields are refused. */
export const storebAcknowledgeRequest = z.strictObject({
  // Checked against the tenant's package before it could reach a URL.
  packageName: z.string().min(1).max(200),
  productId: pathSegmentField(1, 200),
  purchaseToken: pathSegmentField(1, 4096),
  type: z.enum(["subscription", "product"]),
});

/** Answers `POST /v1/storeb/acknowledge`. */
export function storebAcknowledgeHandler(deps: StorebVerifyDeps): Handler {
  return async (request, context) => {
    const admitted = await admitVerifyRequest(request, context, {
      deps,
      store: "storeb",
      schema: storebAcknowledgeRequest,
    });
    const { body } = admitted;
    const outcome = await runStorebAction(deps, admitted, {
      action: "acknowledge",
      // The type is part of the question: a product and a subscription are different calls.
      variant: body.type,
      run: (credentials) => deps.storeb.acknowledge(credentials, body),
      done: (success) => success.alreadyAcknowledged ? "already_acknowledged" : "acknowledged",
    });
    if (!outcome.valid) return domainFailureResponse(deps.version, outcome);
    return jsonResponse(200, {
      valid: true,
      version: deps.version,
      acknowledged: true,
      alreadyAcknowledged: outcome.alreadyAcknowledged,
    });
  };
}

/** An admitted store action request: who asked, and about which purchase. */
export interface AdmittedAction {
  reqId: string;
  tenantId: string;
  keyId: string;
  body: { packageName: string; productId: string; purchaseToken: string };
  credentials: StorebCredentials;
}

/** What a store action runs, and how its success is logged. */
export interface StorebActionSpec<T extends { valid: boolean }> {
  action: "acknowledge" | "consume";
  /** What else tells two requests apart (the purchase type). */
  variant: string;
  run: (credentials: StorebCredentials) => Promise<T>;
  /** The `store_action` outcome of a success. */
  done: (success: Extract<T, { valid: true }>) => string;
}

/**
 * Runs a store action, shared with identical requests in flight (one upstream sequence for all:
 * one read, at most one write), and logs `store_action` for this request whatever came of it:
 * the success, the domain failure's code, or the error's code.
 */
export async function runStorebAction<T extends { valid: boolean; error?: string }>(
  deps: StorebVerifyDeps,
  admitted: AdmittedAction,
  spec: StorebActionSpec<T>,
): Promise<T> {
  const { tenantId, keyId, body, credentials } = admitted;
  const flightKey = [
    "storeb-action",
    tenantId,
    spec.action,
    spec.variant,
    body.packageName,
    body.productId,
    body.purchaseToken,
  ].join("\0");
  const log = (outcome: string) =>
    logStoreAction(deps.log, {
      reqId: admitted.reqId,
      tenantId,
      keyId,
      store: "storeb",
      action: spec.action,
      productId: body.productId,
      purchaseToken: body.purchaseToken,
      outcome,
    });
  let outcome: T;
  try {
    outcome = await deps.flights.run(flightKey, () => spec.run(credentials));
  } catch (error) {
    log(errorCode(error, "INTERNAL_ERROR"));
    throw error;
  }
  log(
    outcome.valid ? spec.done(outcome as Extract<T, { valid: true }>) : outcome.error ?? "invalid",
  );
  return outcome;
}
