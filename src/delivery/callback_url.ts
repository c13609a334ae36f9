/**
 * Which callback URLs deliveries may go to (decisions.md 4 and 9). In production a callback must
 * be https and must not point at a private, loopback, link-local or metadata address, unless
 * `CALLBACK_ALLOW_INSECURE` is set. This module checks the URL as written; the dispatcher checks
 * the resolved address again at send time.
 */
import { isIP } from "node:net";

/** Why a callback URL is refused, or null when it is acceptable. */
export function callbackUrlProblem(text: string, allowInsecure: boolean): string | null {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return "is not a URL";
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return "must be an http(s) URL";
  if (url.username !== "" || url.password !== "") return "must not carry credentials";
  if (url.hash !== "") return "must not have a fragment";
  if (allowInsecure) return null;
  if (url.protocol !== "https:") return "must use https";
  const host = url.hostname.replace(/^\[|\]$/g, "");
  if (host === "localhost" || host.endsWith(".localhost")) return "must not point at localhost";
  if (isIP(host) !== 0 && !isPublicAddress(host)) {
    return "must not point at a private, loopback, link-local or metadata address";
  }
  return null;
}

/** Whether an IPv4 or IPv6 address is publicly routable. */
export function isPublicAddress(address: string): boolean {
  const version = isIP(address);
  if (version === 4) return isPublicIPv4(address);
  if (version === 6) {
    const lower = address.toLowerCase();
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
    if (mapped) return isPublicIPv4(mapped[1]);
    // URL parsing writes an IPv4-mapped address in hex: ::ffff:7f00:1 is 127.0.0.1.
    const mappedHex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(lower);
    if (mappedHex) {
      const high = parseInt(mappedHex[1], 16);
      const low = parseInt(mappedHex[2], 16);
      return isPublicIPv4(`${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`);
    }
    if (lower === "::" || lower === "::1") return false;
    const first = parseInt(lower.split(":")[0] || "0", 16);
    if ((first & 0xfe00) === 0xfc00) return false; // fc00::/7 unique local
    if ((first & 0xffc0) === 0xfe80) return false; // fe80::/10 link-local
    if ((first & 0xff00) === 0xff00) return false; // multicast
    return true;
  }
  return false;
}

function isPublicIPv4(address: string): boolean {
  const [a, b] = address.split(".").map(Number);
  if (a === 0 || a === 10 || a === 127) return false;
  if (a === 169 && b === 254) return false; // link-local, including cloud metadata
  if (a === 172 && b >= 16 && b <= 31) return false;
  if (a === 192 && b === 168) return false;
  if (a === 100 && b >= 64 && b <= 127) return false; // carrier-grade NAT
  if (a >= 224) return false; // multicast and reserved
  return true;
}
