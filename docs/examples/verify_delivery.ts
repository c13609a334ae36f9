/**
 * Verifies a Purchase Relay delivery in your backend. Copy this file: it has no dependencies
 * and runs wherever WebCrypto does (Deno, Node 20+, Bun, Cloudflare Workers).
 *
 * The service signs `<t>.<raw body>` with HMAC-SHA256 keyed with your webhook secret and sends
 * `X-Service-Signature: t=<epoch seconds>,v1=<hex>`. During a secret rotation the header
 * carries two `v1` values (new secret first); a delivery is genuine when any of them matches.
 *
 * @module
 */

/** Options of {@linkcode checkDelivery} and {@linkcode verifyDelivery}. */
export interface VerifyDeliveryOptions {
  /** How far `t` may be from now, in the past or the future, in seconds. Default 300. */
  toleranceSeconds?: number;
  /** The current time in epoch seconds; defaults to the clock. */
  nowSeconds?: number;
}

/**
 * Why a delivery is refused, checked in this order:
 * - `no_header`: no `X-Service-Signature` header, or an empty one;
 * - `malformed_header`: no `t`, a `t` that is not a whole number of seconds, two `t`, or no
 *   `v1` holding hex;
 * - `timestamp_outside_tolerance`: `t` is further from now than the tolerance (a replay, or a
 *   clock out of sync);
 * - `no_matching_signature`: no `v1` is the signature of this body with this secret (a
 *   changed body, a wrong secret, or a body that was parsed and serialised again).
 */
export type DeliveryRefusal =
  | "no_header"
  | "malformed_header"
  | "timestamp_outside_tolerance"
  | "no_matching_signature";

/** The outcome of {@linkcode checkDelivery}. */
export type DeliveryCheck =
  | { valid: true; reason: null }
  | { valid: false; reason: DeliveryRefusal };

/**
 * Checks that `signatureHeader` (the `X-Service-Signature` value) holds a `v1` signature of
 * `rawBody` made with `secret`, at a timestamp within the tolerance of now; when it does not,
 * the answer says why. Log the reason; answer the sender only with a non-2xx status.
 *
 * `rawBody` must be the body exactly as received, before any JSON parsing: re-serialising a
 * parsed body changes its bytes and the signature no longer matches.
 */
export async function checkDelivery(
  secret: string,
  signatureHeader: string | null,
  rawBody: string,
  options: VerifyDeliveryOptions = {},
): Promise<DeliveryCheck> {
  if (!signatureHeader) return refused("no_header");
  const tolerance = options.toleranceSeconds ?? 300;
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000);

  let timestamp: string | null = null;
  const candidates: Uint8Array[] = [];
  for (const part of signatureHeader.split(",")) {
    const separator = part.indexOf("=");
    if (separator < 0) continue;
    const key = part.slice(0, separator).trim();
    const value = part.slice(separator + 1).trim();
    if (key === "t") {
      if (timestamp !== null) return refused("malformed_header"); // two timestamps: ambiguous
      timestamp = value;
    } else if (key === "v1") {
      const bytes = fromHex(value);
      if (bytes !== null) candidates.push(bytes);
    } // other schemes are ignored, so a future `v2` does not break this receiver
  }
  if (timestamp === null || !/^\d{1,15}$/.test(timestamp) || candidates.length === 0) {
    return refused("malformed_header");
  }
  if (Math.abs(now - Number(timestamp)) > tolerance) return refused("timestamp_outside_tolerance");

  const encoder = new TextEncoder();
  const key = await crypto.subtle.importKey(
    "raw",
    encoder.encode(secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const expected = new Uint8Array(
    await crypto.subtle.sign("HMAC", key, encoder.encode(`${timestamp}.${rawBody}`)),
  );
  let matched = false;
  for (const candidate of candidates) {
    // Not `||=`: every candidate is compared, so the time taken does not depend on which matched.
    matched = constantTimeEqual(candidate, expected) || matched;
  }
  return matched ? { valid: true, reason: null } : refused("no_matching_signature");
}

/** {@linkcode checkDelivery} as a boolean: true when the delivery is genuine. */
export async function verifyDelivery(
  secret: string,
  signatureHeader: string | null,
  rawBody: string,
  options: VerifyDeliveryOptions = {},
): Promise<boolean> {
  return (await checkDelivery(secret, signatureHeader, rawBody, options)).valid;
}

function refused(reason: DeliveryRefusal): DeliveryCheck {
  return { valid: false, reason };
}

/** Compares without returning early, so timing does not reveal how many bytes matched. */
function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a[i] ^ b[i];
  return difference === 0;
}

/** The bytes of a lower- or upper-case hex string, or null when it is not hex. */
function fromHex(hex: string): Uint8Array | null {
  if (hex.length === 0 || hex.length % 2 !== 0 || !/^[0-9a-fA-F]+$/.test(hex)) return null;
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return bytes;
}

// Usage with Deno.serve (Node, Bun and Workers read the body the same way with request.text()):
//
// const secret = Deno.env.get("PURCHASE_RELAY_WEBHOOK_SECRET")!; // whsec_...
//
// Deno.serve(async (request) => {
//   const rawBody = await request.text(); // the raw body: verify before JSON.parse
//   const header = request.headers.get("X-Service-Signature");
//   const check = await checkDelivery(secret, header, rawBody);
//   if (!check.valid) {
//     console.warn(`refused a delivery: ${check.reason}`);
//     return new Response("invalid signature", { status: 401 });
//   }
//   const eventId = request.headers.get("X-Service-Event-Id")!; // stable across retries
//   if (await alreadyProcessed(eventId)) return new Response(null, { status: 204 });
//   const delivery = JSON.parse(rawBody);
//   await handle(delivery); // e.g. switch (delivery.event) { case "subscription.renewed": ... }
//   await markProcessed(eventId);
//   return new Response(null, { status: 204 }); // any 2xx means delivered
// });
