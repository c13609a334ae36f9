/**
 * What a tenant's receiver does with a delivery's `X-Service-Signature`, for the simulators'
 * callback receiver and the tests. The service only signs (src/delivery/signature.ts); it never
 * checks a delivery signature itself, so this lives with the simulators. The rules are those of
 * docs/deliveries.md, "Verifying deliveries", and of the examples in docs/examples/.
 *
 * The expected signature is computed here from those rules, as a tenant would, never with the
 * service's own signing code: every end-to-end test that checks a delivery's signature through
 * the callback receiver then fails when the service signs anything other than what is documented.
 */
import { Buffer } from "node:buffer";
import { createHmac, timingSafeEqual } from "node:crypto";

/** Options of {@linkcode checkSignature} and {@linkcode verifySignature}. */
export interface VerifySignatureOptions {
  /** How far `t` may be from now, in the past or the future. Default 300 seconds. */
  toleranceSeconds?: number;
  /** The clock, epoch seconds. */
  nowSeconds?: number;
}

/**
 * Why a signature is refused, checked in this order:
 * - `no_header`: no `X-Service-Signature`, or an empty one;
 * - `malformed_header`: no `t`, a `t` that is not a whole number of seconds, two `t`, or no
 *   `v1` holding hex;
 * - `timestamp_outside_tolerance`: `t` is further from now than the tolerance;
 * - `no_matching_signature`: no `v1` is the signature of the body made with the secret(s).
 */
export type SignatureRefusal =
  | "no_header"
  | "malformed_header"
  | "timestamp_outside_tolerance"
  | "no_matching_signature";

/** The outcome of {@linkcode checkSignature}: valid, or refused with the reason. */
export type SignatureCheck =
  | { valid: true; reason: null }
  | { valid: false; reason: SignatureRefusal };

/** The parts of a header that a receiver reads. */
interface ParsedHeader {
  timestamp: number;
  signatures: Buffer[];
}

/**
 * What a tenant's receiver does: valid when `header` holds a `v1` signature of `body` made with
 * `secret` (or with any of several secrets, as a receiver holds during a rotation) at a
 * timestamp within the tolerance; otherwise refused, saying why. Comparison is constant-time.
 */
export function checkSignature(
  secret: string | readonly string[],
  header: string | null,
  body: string,
  options: VerifySignatureOptions = {},
): SignatureCheck {
  if (!header) return refused("no_header");
  const parsed = parseHeader(header);
  if (parsed === null) return refused("malformed_header");
  const tolerance = options.toleranceSeconds ?? 300;
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - parsed.timestamp) > tolerance) return refused("timestamp_outside_tolerance");
  const secrets = typeof secret === "string" ? [secret] : secret;
  let matched = false;
  for (const candidateSecret of secrets) {
    const expected = expectedSignature(candidateSecret, parsed.timestamp, body);
    for (const given of parsed.signatures) {
      // Not `||`: every signature is compared, so the time taken does not tell which matched.
      matched = (given.length === expected.length && timingSafeEqual(given, expected)) || matched;
    }
  }
  return matched ? { valid: true, reason: null } : refused("no_matching_signature");
}

/** {@linkcode checkSignature} as a boolean, for callers that need no reason. */
export function verifySignature(
  secret: string | readonly string[],
  header: string | null,
  body: string,
  options: VerifySignatureOptions = {},
): boolean {
  return checkSignature(secret, header, body, options).valid;
}

/** HMAC-SHA256 of `<t>.<body>` keyed with the secret (docs/deliveries.md, "What is signed"). */
function expectedSignature(secret: string, timestamp: number, body: string): Buffer {
  return createHmac("sha256", secret).update(`${timestamp}.${body}`, "utf8").digest();
}

/**
 * `t` and the hex `v1` values of `header`, or null when it is malformed. Keys other than `t`
 * and `v1` are ignored, so that a scheme added later does not break a receiver.
 */
function parseHeader(header: string): ParsedHeader | null {
  let timestamp: string | null = null;
  const signatures: Buffer[] = [];
  for (const part of header.split(",")) {
    const separator = part.indexOf("=");
    if (separator < 0) continue;
    const key = part.slice(0, separator).trim();
    const value = part.slice(separator + 1).trim();
    if (key === "t") {
      if (timestamp !== null) return null; // two timestamps: ambiguous
      timestamp = value;
    } else if (key === "v1" && /^(?:[0-9a-fA-F]{2})+$/.test(value)) {
      signatures.push(Buffer.from(value, "hex"));
    }
  }
  if (timestamp === null || !/^\d{1,15}$/.test(timestamp) || signatures.length === 0) return null;
  return { timestamp: Number(timestamp), signatures };
}

function refused(reason: SignatureRefusal): SignatureCheck {
  return { valid: false, reason };
}
