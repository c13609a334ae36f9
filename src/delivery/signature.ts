/**
 * The signature of outbound deliveries (spec 4.7, decisions.md 9), in the style of Stripe and
 * Svix: `X-Service-Signature: t=<epoch seconds>,v1=<hex HMAC-SHA256>` over `<t>.<raw body>`,
 * keyed with the tenant's webhook secret (UTF-8). During a secret rotation's grace period the
 * header carries one `v1=` per secret, the new one first.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

/** The header value for `body` sent at `timestampSeconds`, signed with every secret given. */
export function signatureHeader(
  secrets: readonly string[],
  timestampSeconds: number,
  body: string,
): string {
  const signatures = secrets.map((secret) => `v1=${sign(secret, timestampSeconds, body)}`);
  return [`t=${timestampSeconds}`, ...signatures].join(",");
}

/** Lower-case hex HMAC-SHA256 of `<t>.<body>`. */
export function sign(secret: string, timestampSeconds: number, body: string): string {
  return createHmac("sha256", secret).update(`${timestampSeconds}.${body}`).digest("hex");
}

/** Options of {@linkcode verifySignature}. */
export interface VerifySignatureOptions {
  /** How old a timestamp may be; decisions.md 9 recommends 5 minutes. */
  toleranceSeconds?: number;
  /** The clock, epoch seconds. */
  nowSeconds?: number;
}

/**
 * What a tenant's receiver does: true when `header` holds a `v1` signature of `body` made with
 * `secret` at a timestamp within the tolerance. Comparison is constant-time.
 */
export function verifySignature(
  secret: string,
  header: string | null,
  body: string,
  options: VerifySignatureOptions = {},
): boolean {
  if (!header) return false;
  const tolerance = options.toleranceSeconds ?? 300;
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000);
  let timestamp: number | null = null;
  const candidates: string[] = [];
  for (const part of header.split(",")) {
    const [key, value] = part.trim().split("=", 2);
    if (key === "t" && /^\d+$/.test(value ?? "")) timestamp = Number(value);
    if (key === "v1" && value) candidates.push(value);
  }
  if (timestamp === null || Math.abs(now - timestamp) > tolerance) return false;
  const expected = Buffer.from(sign(secret, timestamp, body), "hex");
  return candidates.some((candidate) => {
    const given = Buffer.from(candidate, "hex");
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
}
