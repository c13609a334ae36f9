/**
 * The state of a store B purchase on its deliveries (docs/deliveries.md, "State on every
 * delivery"): a Google Play notification only says that something changed, so before the first
 * attempt of its delivery the dispatcher asks the Play Developer API, with the tenant's
 * credentials, what verify would answer for the notification's purchase, and writes it into the
 * payload as `state: {purchase, fetchedAt}`. When it cannot be had, `state` stays null and
 * `stateError` says why with verify's codes; the delivery goes anyway.
 */
import type { TenantCredentials } from "../db/credentials.ts";
import { ServiceError } from "../errors.ts";
import type { StorebVerifier } from "../storeb/verify.ts";
import { objectOrEmpty } from "../lib/json.ts";
import { type DeliveryPayload, serializePayload } from "./payload.ts";
import { storebPurchaseOf } from "./store_events.ts";

/** What {@linkcode StorebStateSource} needs. */
export interface StorebStateSourceOptions {
  storeb: StorebVerifier;
  /** The tenant's store credentials (cached briefly by the caller). */
  credentialsOf: (tenantId: string) => Promise<TenantCredentials>;
  /**
   * How long one fetch may take: it is part of the delivery attempt, whose lease must outlast it
   * and the POST after it.
   */
  timeoutMs: number;
  /** The clock, for tests. */
  now?: () => Date;
}

/** Fills in the state of store B purchases on their deliveries. */
export class StorebStateSource {
  #options: StorebStateSourceOptions;

  constructor(options: StorebStateSourceOptions) {
    this.#options = options;
  }

  /** `payloadText` with its `state` or `stateError` filled in; unchanged when not a purchase's. */
  async complete(tenantId: string, payloadText: string): Promise<string> {
    const payload = JSON.parse(payloadText) as DeliveryPayload;
    const purchase = storebPurchaseOf(objectOrEmpty(payload.data));
    if (payload.source !== "storeb" || purchase === null) return payloadText;
    const credentials = (await this.#options.credentialsOf(tenantId)).storeb;
    if (credentials === null) {
      return serializePayload({
        ...payload,
        state: null,
        stateError: {
          error: "CREDENTIALS_MISSING",
          message: "the tenant has no store B credentials to fetch the purchase with",
        },
      });
    }
    try {
      const outcome = await this.#options.storeb.verify(credentials, purchase, {
        timeoutMs: this.#options.timeoutMs,
      });
      if (!outcome.valid) {
        return serializePayload({
          ...payload,
          state: null,
          stateError: { error: outcome.error, message: outcome.message },
        });
      }
      const fetchedAt = (this.#options.now?.() ?? new Date()).toISOString();
      return serializePayload({ ...payload, state: { purchase: outcome.purchase, fetchedAt } });
    } catch (error) {
      // The client's own retries are spent: the delivery goes with why the state is missing.
      const stateError = error instanceof ServiceError
        ? { error: error.code, message: error.message }
        : { error: "INTERNAL_ERROR", message: "the purchase could not be fetched" };
      return serializePayload({ ...payload, state: null, stateError });
    }
  }
}
