/**
 * The part of `npm:@apple/app-store-server-library@3.1.0` that `bench/storea_jws.ts` uses,
 * declared here because the package's own types pull in `@types/node@25`, whose globals
 * (`CryptoKey` among them) clash with Deno's and break `deno check` of the whole tree.
 * Signatures copied from the package's `dist/jws_verification.d.ts` and `models/Environment.d.ts`.
 * @module
 */

/** The server environment (Apple's `Environment` enum). */
export declare enum Environment {
  SANDBOX = "Sandbox",
  PRODUCTION = "Production",
  XCODE = "Xcode",
  LOCAL_TESTING = "LocalTesting",
}

/** Apple's verifier of App Store signed data. */
export declare class SignedDataVerifier {
  /**
   * @param appleRootCertificates DER root certificates (Node `Buffer`s).
   * @param enableOnlineChecks OCSP checks and expiry judged now; `false`: offline, at signedDate.
   */
  constructor(
    appleRootCertificates: Uint8Array[],
    enableOnlineChecks: boolean,
    environment: Environment,
    bundleId: string,
    appAppleId?: number,
  );
  /** Verifies the outer `signedPayload` JWS of a notification and returns its payload. */
  verifyAndDecodeNotification(
    signedPayload: string,
  ): Promise<{ notificationUUID?: string; [field: string]: unknown }>;
}
