/**
 * What a tenant's receiver does with a delivery's `X-Service-Signature`, for the simulators'
 * callback receiver and the tests. The service only signs (src/delivery/signature.ts); it never
 * checks a delivery signature itself, so this lives with the simulators.
 */
import { Buffer } from "node:buffer";
import { timingSafeEqual } from "node:crypto";
import { sign } from "../src/delivery/signature.ts";

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
