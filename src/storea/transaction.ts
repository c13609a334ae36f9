/**
 * A verified store A transaction in the shape of the verify response: epoch-ms dates as ISO-8601,
 * absent optional fields as null, and `price` in the currency's smallest unit (docs/verify.md,
 * "POST /v1/storea/verify").
 */

/** The `transaction` object of the store A verify response. */
export interface StoreaTransaction {
  transactionId: string;
  originalTransactionId: string;
  bundleId: string;
  productId: string;
  purchaseDate: string | null;
  originalPurchaseDate: string | null;
  expiresDate: string | null;
  type: string | null;
  inAppOwnershipType: string | null;
  quantity: number | null;
  webOrderLineItemId: string | null;
  revocationDate: string | null;
  revocationReason: number | null;
  offerType: number | null;
  offerIdentifier: string | null;
  appAccountToken: string | null;
  storefront: string | null;
  storefrontId: string | null;
  transactionReason: string | null;
  currency: string | null;
  price: number | null;
  signedTransactionInfo: string;
  rawDecodedPayload: Record<string, unknown>;
}

/** Normalizes a decoded (and already verified) `signedTransactionInfo` payload. */
export function normalizeTransaction(
  payload: Record<string, unknown>,
  signedTransactionInfo: string,
): StoreaTransaction {
  const currency = stringOrNull(payload.currency);
  return {
    transactionId: stringOrNull(payload.transactionId) ?? "",
    originalTransactionId: stringOrNull(payload.originalTransactionId) ?? "",
    bundleId: stringOrNull(payload.bundleId) ?? "",
    productId: stringOrNull(payload.productId) ?? "",
    purchaseDate: isoDate(payload.purchaseDate),
    originalPurchaseDate: isoDate(payload.originalPurchaseDate),
    expiresDate: isoDate(payload.expiresDate),
    type: stringOrNull(payload.type),
    inAppOwnershipType: stringOrNull(payload.inAppOwnershipType),
    quantity: integerOrNull(payload.quantity),
    webOrderLineItemId: stringOrNull(payload.webOrderLineItemId),
    revocationDate: isoDate(payload.revocationDate),
    revocationReason: integerOrNull(payload.revocationReason),
    offerType: integerOrNull(payload.offerType),
    offerIdentifier: stringOrNull(payload.offerIdentifier),
    appAccountToken: stringOrNull(payload.appAccountToken),
    storefront: stringOrNull(payload.storefront),
    storefrontId: stringOrNull(payload.storefrontId),
    transactionReason: stringOrNull(payload.transactionReason),
    currency,
    price: typeof payload.price === "number" && currency !== null
      ? priceInMinorUnits(payload.price, currency)
      : null,
    signedTransactionInfo,
    rawDecodedPayload: payload,
  };
}

/**
 * ISO 4217 minor-unit exponents that are not 2, from ISO 4217 List One (the current currency
 * and funds codes) as published by its maintenance agency (SIX) on 2024-06-25. Every other code
 * has exponent 2; so do the codes the list marks N.A. (XAU, XDR, XXX...), which no store prices
 * in. `Intl` is not used: its data (CLDR) gives the digits people write, not ISO's, and differs
 * for IQD, RSD, LBP and others.
 */
const ISO_4217_EXPONENTS: ReadonlyMap<string, number> = new Map(
  ([
    [0, "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"],
    [3, "BHD IQD JOD KWD LYD OMR TND"],
    [4, "CLF UYW"],
  ] as const).flatMap(([exponent, codes]) => codes.split(" ").map((code) => [code, exponent])),
);

/**
 * Converts Apple's milli-units to the smallest unit of `currency` (its ISO 4217 exponent):
 * USD 9990 -> 999 cents, JPY 1200000 -> 1200 yen, KWD 1990 -> 1990 fils. A code the table does
 * not know gets 2, the exponent of most currencies.
 */
export function priceInMinorUnits(milliUnits: number, currency: string): number {
  const exponent = ISO_4217_EXPONENTS.get(currency) ?? 2;
  return Math.round((milliUnits * 10 ** exponent) / 1000);
}

/** An epoch-ms date as ISO-8601, or null when it is absent or not a finite number. */
export function isoDate(value: unknown): string | null {
  if (typeof value !== "number" || !Number.isFinite(value)) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

/** A string, or null for anything else. */
export function stringOrNull(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

/** An integer, or null for anything else. */
export function integerOrNull(value: unknown): number | null {
  return typeof value === "number" && Number.isInteger(value) ? value : null;
}
