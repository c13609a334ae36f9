/**
 * Store simulators, for this project's tests and demo and for tenants' own tests: a test PKI and
 * signer shaped like Apple's with a fake App Store Server API (store A); a fake Google OAuth token
 * endpoint and Play Developer API, and an OIDC issuer that mints Pub/Sub push tokens (store B);
 * notifications of any type for either store; and a callback receiver that checks delivery
 * signatures as a tenant's backend would. None of this is part of what the service runs.
 *
 * ```ts
 * import { createStoreaTestPki, StoreaSigner } from "@purchase-relay/service/simulators";
 * ```
 * @module
 */
export * from "./callback_receiver.ts";
export * from "./service_account.ts";
export * from "./storea_api.ts";
export * from "./storea_pki.ts";
export * from "./storea_signer.ts";
export * from "./storeb_play.ts";
export * from "./storeb_push.ts";
export * from "./store_notifications.ts";
export * from "./webhook_signature.ts";
