/**
 * Store A verification (docs/integration.md, "POST /v1/storea/verify"): finds a transaction in the
 * tenant's environment(s), verifies the JWS the App Store returned, checks the bundle and
 * normalizes.
 */
import { ServiceError } from "../errors.ts";
import { timeoutSignal } from "../abort.ts";
import type { StoreaCredentials } from "../db/credentials.ts";
import type { StoreaApiClient, StoreaEnvironmentName } from "./api_client.ts";
import { JwsInvalidError, type StoreaJwsVerifier } from "./jws.ts";
import { normalizeTransaction, type StoreaTransaction } from "./transaction.ts";

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
  /** The whole verification's deadline, both environments and retries included. */
  timeoutMs: number;
}

/** Verifies store A transactions for any tenant. */
export class StoreaVerifier {
  #options: StoreaVerifierOptions;

  constructor(options: StoreaVerifierOptions) {
    this.#options = options;
  }

  /** Verifies one transaction with the tenant's credentials. Upstream failures throw. */
  async verify(
    credentials: StoreaCredentials,
    input: StoreaVerifyInput,
  ): Promise<StoreaVerifyOutcome> {
    const mode = input.environment ?? credentials.environment;
    // Automatic mode asks production first, then sandbox.
    const environments: StoreaEnvironmentName[] = mode === "auto"
      ? ["production", "sandbox"]
      : [mode];
    const { signal, clear } = timeoutSignal(this.#options.timeoutMs);
    try {
      let lastStatus = 404;
      for (const [index, environment] of environments.entries()) {
        const lookup = await this.#options.client.getTransactionInfo(
          credentials,
          input.transactionId,
          { environment, signal },
        );
        const isLast = index === environments.length - 1;
        if (lookup.kind === "unauthorized") {
          // Production answers 401 for an app never released: worth trying sandbox. Anywhere
          // else a 401 means the tenant's key is wrong, which the operator has to fix.
          if (!isLast && environment === "production") continue;
          throw new ServiceError(
            "APPLE_API_ERROR",
            `the App Store refused the tenant's API key in ${environment} (401); check its ` +
              "key id, issuer id, bundle id and private key",
            { details: { status: 401, upstreamCode: null } },
          );
        }
        if (lookup.kind === "not_found") {
          lastStatus = 404;
          continue;
        }
        return await this.#found(credentials, environment, lookup.signedTransactionInfo);
      }
      return {
        valid: false,
        error: "TRANSACTION_NOT_FOUND",
        message: `no transaction with this id in ${environments.join(" or ")}`,
        upstreamStatus: lastStatus,
      };
    } finally {
      clear();
    }
  }

  async #found(
    credentials: StoreaCredentials,
    environment: StoreaEnvironmentName,
    signedTransactionInfo: string,
  ): Promise<StoreaVerifyOutcome> {
    let payload: Record<string, unknown>;
    try {
      // Read from the store over TLS with the tenant's key: no budget for a new chain.
      payload = await this.#options.jws.verify(signedTransactionInfo, { from: "store" });
    } catch (error) {
      if (!(error instanceof JwsInvalidError)) throw error;
      // Data the App Store returns is trusted only once it verifies.
      throw new ServiceError(
        "APPLE_API_ERROR",
        `the App Store's signedTransactionInfo did not verify: ${error.message}`,
        { details: { status: 200, upstreamCode: null }, cause: error },
      );
    }
    if (payload.bundleId !== credentials.bundleId) {
      return {
        valid: false,
        error: "BUNDLE_ID_MISMATCH",
        message: `the transaction belongs to bundle ${
          JSON.stringify(payload.bundleId)
        }, not this tenant's ${credentials.bundleId}`,
        upstreamStatus: 200,
      };
    }
    const transaction = normalizeTransaction(payload, signedTransactionInfo);
    return {
      valid: true,
      environment,
      appUserId: transaction.appAccountToken,
      transaction,
      upstreamStatus: 200,
    };
  }
}
