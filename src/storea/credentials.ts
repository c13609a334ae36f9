/**
 * A tenant's store A credentials: an App Store Connect API key and the app it is for, as the
 * store A client signs its calls with them (docs/configuration.md, "Store credentials"). Stored
 * sealed by `db/credentials.ts`.
 */

/** Which store A environment a tenant's transactions are looked up in. */
export type StoreaEnvironment = "auto" | "production" | "sandbox";

/** Store A (App Store Server API) credentials. */
export interface StoreaCredentials {
  bundleId: string;
  keyId: string;
  issuerId: string;
  /** PKCS#8 PEM of the EC P-256 signing key. */
  privateKeyPem: string;
  environment: StoreaEnvironment;
  appId: number | null;
}
