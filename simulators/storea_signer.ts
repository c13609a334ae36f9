/**
 * Signs App Store-shaped JWS with a {@link StoreaTestPki} and builds realistic decoded
 * payloads: transactions (JWSTransactionDecodedPayload), renewal info
 * (JWSRenewalInfoDecodedPayload) and notifications V2 (ResponseBodyV2DecodedPayload).
 * Field names and value shapes follow what Apple sends, extra fields included.
 *
 * @module
 */
import { base64url } from "../src/crypto/secrets.ts";
import { CompactSign } from "jose";
import type { StoreaTestPki } from "./storea_pki.ts";

/** The `environment` value inside Apple's payloads. */
export type StoreaEnvironmentName = "Production" | "Sandbox";

/** Apple's in-app product types. */
export type StoreaProductType =
  | "Auto-Renewable Subscription"
  | "Non-Renewing Subscription"
  | "Consumable"
  | "Non-Consumable";

/**
 * A decoded transaction (Apple's JWSTransactionDecodedPayload). Dates are epoch
 * milliseconds, `price` is in milli-units of `currency`. Any other field may be added and
 * is signed as given; a field set to `undefined` is left out of the JSON.
 */
export interface StoreaTransactionPayload {
  transactionId: string;
  originalTransactionId: string;
  webOrderLineItemId?: string;
  bundleId: string;
  productId: string;
  subscriptionGroupIdentifier?: string;
  purchaseDate: number;
  originalPurchaseDate: number;
  expiresDate?: number;
  quantity: number;
  type: StoreaProductType;
  inAppOwnershipType: "PURCHASED" | "FAMILY_SHARED";
  appAccountToken?: string;
  signedDate: number;
  environment: StoreaEnvironmentName;
  transactionReason?: "PURCHASE" | "RENEWAL";
  storefront?: string;
  storefrontId?: string;
  price?: number;
  currency?: string;
  appTransactionId?: string;
  revocationDate?: number;
  /** `0` other, `1` app issue. */
  revocationReason?: number;
  /** `1` intro, `2` promotional, `3` offer code. */
  offerType?: number;
  offerIdentifier?: string;
  [field: string]: unknown;
}

/** A decoded renewal info (Apple's JWSRenewalInfoDecodedPayload); same conventions. */
export interface StoreaRenewalInfoPayload {
  originalTransactionId: string;
  autoRenewProductId: string;
  productId: string;
  /** `0` off, `1` on. */
  autoRenewStatus: number;
  /** `1` customer cancel, `2` billing error, `3` price increase declined, `4` unavailable, `5` other. */
  expirationIntent?: number;
  gracePeriodExpiresDate?: number;
  isInBillingRetryPeriod?: boolean;
  offerType?: number;
  offerIdentifier?: string;
  recentSubscriptionStartDate?: number;
  renewalDate?: number;
  renewalPrice?: number;
  currency?: string;
  signedDate: number;
  environment: StoreaEnvironmentName;
  appTransactionId?: string;
  [field: string]: unknown;
}

/** `data` of a decoded notification. */
export interface StoreaNotificationData {
  appAppleId?: number;
  bundleId: string;
  bundleVersion?: string;
  environment: StoreaEnvironmentName;
  signedTransactionInfo?: string;
  signedRenewalInfo?: string;
  /** `1` active, `2` expired, `3` billing retry, `4` grace period, `5` revoked. */
  status?: number;
  [field: string]: unknown;
}

/** A decoded App Store Server Notification V2 (Apple's ResponseBodyV2DecodedPayload). */
export interface StoreaNotificationPayload {
  notificationType: string;
  subtype?: string;
  notificationUUID: string;
  data: StoreaNotificationData;
  version: string;
  signedDate: number;
  [field: string]: unknown;
}

/** Options of {@link StoreaSigner.notificationPayload}. */
export interface StoreaNotificationOptions {
  /** E.g. `DID_RENEW`, `TEST`, or any string. */
  notificationType: string;
  /** E.g. `BILLING_RECOVERY`; omitted from the payload when absent. */
  subtype?: string;
  /** Default: the transaction's, else the signer's bundle id. */
  bundleId?: string;
  /** Default: the transaction's, else the signer's environment. */
  environment?: StoreaEnvironmentName;
  /** Signed into `data.signedTransactionInfo`. Absent (and no `signedTransactionInfo`): no field, as in TEST. */
  transaction?: StoreaTransactionPayload;
  /** Signed into `data.signedRenewalInfo`. */
  renewalInfo?: StoreaRenewalInfoPayload;
  /** A ready JWS for `data.signedTransactionInfo` (e.g. from another PKI); wins over `transaction`. */
  signedTransactionInfo?: string;
  /** A ready JWS for `data.signedRenewalInfo`; wins over `renewalInfo`. */
  signedRenewalInfo?: string;
  /** `data.appAppleId`; omitted when absent. */
  appAppleId?: number;
  /** `data.bundleVersion`. Default `"1.0"`. */
  bundleVersion?: string;
  /** `data.status`; omitted when absent. */
  status?: number;
  /** Default: a random UUID. */
  notificationUUID?: string;
  /** Default: now. */
  signedDate?: number;
}

/** Options of the {@link StoreaSigner} constructor. */
export interface StoreaSignerOptions {
  /** Bundle id of sample payloads. Default `com.example.app` (the test fixtures' bundle). */
  bundleId?: string;
  /** Environment of sample payloads. Default `Production`. */
  environment?: StoreaEnvironmentName;
}

/** Protected header fields of a JWS made by {@link StoreaSigner.signRaw}. */
export interface StoreaJwsHeader {
  alg?: string;
  x5c?: string[];
  [field: string]: unknown;
}

const DAY_MS = 86_400_000;
const encoder = new TextEncoder();

/**
 * Signs payloads as the App Store does: compact JWS, protected header
 * `{ alg: "ES256", x5c: [leaf, intermediate, root] }`, signed with the leaf key.
 *
 * @example
 * ```ts
 * const signer = new StoreaSigner(await createStoreaTestPki());
 * const transaction = signer.sampleTransaction({ productId: "com.example.app.coins" });
 * const jws = await signer.signTransaction(transaction);
 * const signedPayload = await signer.signNotification(
 *   await signer.notificationPayload({ notificationType: "DID_RENEW", transaction }),
 * );
 * ```
 */
export class StoreaSigner {
  /** The PKI whose leaf signs and whose chain is the `x5c`. */
  readonly pki: StoreaTestPki;
  /** Bundle id used by the sample builders. */
  readonly bundleId: string;
  /** Environment used by the sample builders. */
  readonly environment: StoreaEnvironmentName;

  /** Signs with `pki`'s leaf key; `options` set the defaults of the sample builders. */
  constructor(pki: StoreaTestPki, options: StoreaSignerOptions = {}) {
    this.pki = pki;
    this.bundleId = options.bundleId ?? "com.example.app";
    this.environment = options.environment ?? "Production";
  }

  /** Signs a decoded transaction into a `signedTransactionInfo` JWS. */
  signTransaction(payload: StoreaTransactionPayload): Promise<string> {
    return this.#sign(payload);
  }

  /** Signs a decoded renewal info into a `signedRenewalInfo` JWS. */
  signRenewalInfo(payload: StoreaRenewalInfoPayload): Promise<string> {
    return this.#sign(payload);
  }

  /** Signs a decoded notification into the `signedPayload` JWS a receiver gets. */
  signNotification(payload: StoreaNotificationPayload): Promise<string> {
    return this.#sign(payload);
  }

  /**
   * Signs anything with the leaf key (ES256 signature bytes) under a header of
   * `{ alg: "ES256", x5c }` merged with `header`, for negative tests: `{ alg: "ES384" }`,
   * `{ x5c: pki.x5c.slice(0, 2) }`, `{ x5c: undefined }` (no x5c), `{ x5c: other.x5c }`
   * (a valid chain whose leaf did not sign). A `Uint8Array` payload is signed as raw bytes
   * (e.g. invalid JSON); anything else is JSON-encoded.
   */
  async signRaw(payload: unknown, header: StoreaJwsHeader = {}): Promise<string> {
    const fullHeader = { alg: "ES256", x5c: this.pki.x5c, ...header };
    const payloadBytes = payload instanceof Uint8Array
      ? payload
      : encoder.encode(JSON.stringify(payload));
    // WebCrypto rather than jose: jose refuses a header alg that does not match the key.
    const signingInput = `${base64url(encoder.encode(JSON.stringify(fullHeader)))}.${
      base64url(payloadBytes)
    }`;
    const signature = await crypto.subtle.sign(
      { name: "ECDSA", hash: "SHA-256" },
      this.pki.leafPrivateKey,
      encoder.encode(signingInput),
    );
    return `${signingInput}.${base64url(new Uint8Array(signature))}`;
  }

  /**
   * A realistic decoded transaction: by default a fresh monthly auto-renewable
   * subscription bought a minute ago in the USA storefront at 9.99 USD, with an
   * `appAccountToken`. `overrides` win; `originalTransactionId` defaults to the
   * `transactionId`; for a type other than an auto-renewable subscription the
   * subscription-only fields are dropped unless given.
   */
  sampleTransaction(overrides: Partial<StoreaTransactionPayload> = {}): StoreaTransactionPayload {
    const now = Date.now();
    const transactionId = overrides.transactionId ?? appleNumericId();
    const purchaseDate = overrides.purchaseDate ?? now - 60_000;
    const subscription = (overrides.type ?? "Auto-Renewable Subscription") ===
      "Auto-Renewable Subscription";
    const base: StoreaTransactionPayload = {
      transactionId,
      originalTransactionId: transactionId,
      webOrderLineItemId: subscription ? appleNumericId() : undefined,
      bundleId: this.bundleId,
      productId: `${this.bundleId}.pro.monthly`,
      subscriptionGroupIdentifier: subscription ? "21000001" : undefined,
      purchaseDate,
      originalPurchaseDate: purchaseDate,
      expiresDate: subscription ? purchaseDate + 30 * DAY_MS : undefined,
      quantity: 1,
      type: "Auto-Renewable Subscription",
      inAppOwnershipType: "PURCHASED",
      appAccountToken: crypto.randomUUID(),
      signedDate: now,
      environment: this.environment,
      transactionReason: "PURCHASE",
      storefront: "USA",
      storefrontId: "143441",
      price: 9990,
      currency: "USD",
      appTransactionId: appleNumericId(),
    };
    return withoutUndefined({ ...base, ...overrides });
  }

  /**
   * A realistic decoded renewal info for a subscription that renews automatically in 30
   * days at 9.99 USD. `overrides` win (e.g. the `originalTransactionId` and `productId` of
   * the transaction it belongs to).
   */
  sampleRenewalInfo(overrides: Partial<StoreaRenewalInfoPayload> = {}): StoreaRenewalInfoPayload {
    const now = Date.now();
    const productId = overrides.productId ?? `${this.bundleId}.pro.monthly`;
    const base: StoreaRenewalInfoPayload = {
      originalTransactionId: appleNumericId(),
      autoRenewProductId: productId,
      productId,
      autoRenewStatus: 1,
      renewalPrice: 9990,
      currency: "USD",
      signedDate: now,
      environment: this.environment,
      recentSubscriptionStartDate: now - 60_000,
      renewalDate: now + 30 * DAY_MS,
      appTransactionId: appleNumericId(),
    };
    return withoutUndefined({ ...base, ...overrides });
  }

  /**
   * Builds a decoded notification (`version` `2.0`, random `notificationUUID`, `signedDate`
   * now) whose `data` carries the transaction and renewal info signed as nested JWS.
   * Pass the result to {@link StoreaSigner.signNotification}.
   */
  async notificationPayload(
    options: StoreaNotificationOptions,
  ): Promise<StoreaNotificationPayload> {
    const signedTransactionInfo = options.signedTransactionInfo ??
      (options.transaction ? await this.signTransaction(options.transaction) : undefined);
    const signedRenewalInfo = options.signedRenewalInfo ??
      (options.renewalInfo ? await this.signRenewalInfo(options.renewalInfo) : undefined);
    const data: StoreaNotificationData = withoutUndefined({
      appAppleId: options.appAppleId,
      bundleId: options.bundleId ?? options.transaction?.bundleId ?? this.bundleId,
      bundleVersion: options.bundleVersion ?? "1.0",
      environment: options.environment ?? options.transaction?.environment ?? this.environment,
      signedTransactionInfo,
      signedRenewalInfo,
      status: options.status,
    });
    return withoutUndefined({
      notificationType: options.notificationType,
      subtype: options.subtype,
      notificationUUID: options.notificationUUID ?? crypto.randomUUID(),
      data,
      version: "2.0",
      signedDate: options.signedDate ?? Date.now(),
    });
  }

  #sign(payload: object): Promise<string> {
    return new CompactSign(encoder.encode(JSON.stringify(payload)))
      .setProtectedHeader({ alg: "ES256", x5c: this.pki.x5c })
      .sign(this.pki.leafPrivateKey);
  }
}

/** A numeric id shaped like Apple's (16 digits, starting 2000000). */
function appleNumericId(): string {
  const digits = crypto.getRandomValues(new Uint8Array(9));
  return `2000000${Array.from(digits, (d) => d % 10).join("")}`;
}

/** Drops keys whose value is `undefined`, so optional fields are absent, not null. */
function withoutUndefined<T extends object>(value: T): T {
  return Object.fromEntries(
    Object.entries(value).filter(([, field]) => field !== undefined),
  ) as T;
}
