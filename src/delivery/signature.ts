/**
 * The signature of outbound deliveries, in the style of Stripe and Svix (docs/deliveries.md,
 * "What is signed"): `X-Service-Signature: t=<epoch seconds>,v1=<hex HMAC-SHA256>` over
 * `<t>.<raw body>`, keyed with the tenant's webhook secret (UTF-8). During a secret rotation's
 * grace period the header carries one `v1=` per secret, the new one first.
 */
import { createHmac } from "node:crypto";

/**
 * The header value for `body` sent at `timestampSeconds`, signed with every secret given. The body
 * is the text sent, or its UTF-8 bytes (what the sender has at hand): both sign the same.
 */
export function signatureHeader(
  secrets: readonly string[],
  timestampSeconds: number,
  body: string | Uint8Array,
): string {
  const signatures = secrets.map((secret) => `v1=${sign(secret, timestampSeconds, body)}`);
  return [`t=${timestampSeconds}`, ...signatures].join(",");
}

/** Lower-case hex HMAC-SHA256 of `<t>.<body>`. */
export function sign(secret: string, timestampSeconds: number, body: string | Uint8Array): string {
  // Two updates rather than one string: a 16 KB body is not copied into a new string first.
  return createHmac("sha256", secret).update(`${timestampSeconds}.`).update(body).digest("hex");
}
