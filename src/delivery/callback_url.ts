/**
 * Which callback URLs deliveries may go to (docs/security.md, "Callback safety"). A callback
 * must be https unless `CALLBACK_ALLOW_HTTP` is on, and must not point at localhost or at an
 * address that is not globally reachable unless `CALLBACK_ALLOW_PRIVATE_NETWORKS` is on (both are
 * off in production by default). This module checks the URL as written; the sender checks the
 * resolved addresses again at send time and connects to one of them.
 */
import type { CallbackPolicy } from "./callback_policy.ts";
import {
  metadataAddressReason,
  nonGlobalAddressReason,
  parseIpAddress,
} from "./special_addresses.ts";

/** Why a callback URL is refused, or null when it is acceptable. */
export function callbackUrlProblem(text: string, policy: CallbackPolicy): string | null {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return "is not a URL";
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return "must be an http(s) URL";
  if (url.username !== "" || url.password !== "") return "must not carry credentials";
  if (url.hash !== "") return "must not have a fragment";
  if (url.protocol !== "https:" && !policy.allowHttp) return "must use https";
  // The URL parser has already turned IPv4 spellings such as 2852039166 or 0xa9.0xfe.0xa9.0xfe
  // into dotted decimal, so a host is either an address in plain form or a name.
  const host = callbackHost(url).replace(/\.$/, "");
  if (policy.allowPrivateNetworks) {
    // Every metadata address is private too: only here does this check add anything.
    const metadata = metadataAddressReason(host);
    return metadata === null ? null : `must not point at ${metadata}`;
  }
  if (host === "localhost" || host.endsWith(".localhost")) return "must not point at localhost";
  if (parseIpAddress(host) !== null) {
    const reason = nonGlobalAddressReason(host);
    if (reason !== null) return `must not point at an address that is not public: ${reason}`;
  }
  return null;
}

/** The host to connect to: the URL's host name, without the brackets of an IPv6 address. */
export function callbackHost(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, "");
}

/**
 * `text` with every http(s) URL in it cut to scheme, host and path: no user name, password,
 * query string or fragment, where tenants put tokens. For anything bound for a log line or the
 * attempts table, such as an HTTP client's error message.
 */
export function withoutUrlSecrets(text: string): string {
  return text.replace(
    /\b(https?:\/\/)(?:[^\s/?#@]*@)?([^\s/?#]*)([^\s?#]*)(?:[?#][^\s]*?)?(?=[)\]>"',.:;]*(?:\s|$))/gi,
    "$1$2$3",
  );
}
