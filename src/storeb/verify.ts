/**
 * Store B verification (spec 2.3, 4.2; decisions.md 6): asks the Play Developer API about a
 * purchase token and normalizes the answer.
 */
import type { StorebCredentials } from "../db/credentials.ts";
import type { StorebVerifyRequest } from "../api/storeb_verify.ts";
import { ServiceError } from "../errors.ts";

/** Where the Play Developer API and its token endpoint are, and how long a call may take. */
export interface StorebVerifierOptions {
  /** `STOREB_API_URL`. */
  apiUrl: string;
  /** `STOREB_TOKEN_URL`: where access tokens come from, and the assertion's `aud`. */
  tokenUrl: string;
  /** The whole verification's deadline, retries included. */
  timeoutMs: number;
}

/** A verify outcome: a normalized purchase, or a domain failure answered with HTTP 200. */
export type StorebVerifyOutcome =
  | {
    valid: true;
    appUserId: string | null;
    purchase: Record<string, unknown>;
    /** The upstream HTTP status, for the validation audit. */
    upstreamStatus: number;
  }
  | {
    valid: false;
    error: "PURCHASE_NOT_FOUND" | "PACKAGE_NAME_MISMATCH";
    message: string;
    /** The upstream HTTP status, or null when no upstream call was made. */
    upstreamStatus: number | null;
  };

/** Verifies store B purchases for any tenant. */
export class StorebVerifier {
  #options: StorebVerifierOptions;

  constructor(options: StorebVerifierOptions) {
    this.#options = options;
  }

  /** Verifies one purchase with the tenant's credentials. Upstream failures throw. */
  verify(
    _credentials: StorebCredentials,
    _request: StorebVerifyRequest,
  ): Promise<StorebVerifyOutcome> {
    void this.#options;
    return Promise.reject(
      new ServiceError("GOOGLE_API_ERROR", "store B verification is not available yet", {
        details: { status: null, upstreamCode: null },
      }),
    );
  }
}
