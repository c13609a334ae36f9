/**
 * The send-time check of a callback (docs/security.md, "Callback safety"): the URL as written,
 * then the addresses its host name resolves to, each of which must be public unless private
 * networks are allowed, and never a cloud metadata service. The addresses that passed are the only ones the attempt may connect to:
 * the HTTP client is handed them and never resolves the name again, so a DNS answer that changes
 * between the check and the connection (DNS rebinding) cannot steer it elsewhere.
 */
import type { CallbackPolicy } from "./callback_policy.ts";
import { callbackHost, callbackUrlProblem } from "./callback_url.ts";
import {
  metadataAddressReason,
  nonGlobalAddressReason,
  parseIpAddress,
} from "./special_addresses.ts";
import { untilAborted } from "../lib/abort.ts";
import { setBounded } from "../lib/cache.ts";

/**
 * Ports of other protocols (SMTP, IRC, ...), where a POST could be read as commands: refused as
 * `fetch` refuses them (the Fetch standard's "bad ports"), since callbacks no longer go through it.
 */
const BAD_PORTS = new Set(
  (
    "0 1 7 9 11 13 15 17 19 20 21 22 23 25 37 42 43 53 69 77 79 87 95 101 102 103 104 109 110 " +
    "111 113 115 117 119 123 135 137 139 143 161 179 389 427 465 512 513 514 515 526 530 531 " +
    "532 540 548 554 556 563 587 601 636 989 990 993 995 1719 1720 1723 2049 3659 4045 4190 " +
    "5060 5061 6000 6566 6665 6666 6667 6668 6669 6679 6697 10080"
  ).split(" ").map(Number),
);

/**
 * How long a host's checked addresses are reused: as long as a connection to them is kept idle
 * (src/delivery/callback_client.ts), so that a name changed to point elsewhere is followed within
 * that time.
 */
export const CHECKED_ADDRESSES_TTL_MS = 30_000;
/** The most hosts whose checked addresses are kept: a tenant's callback host each, at most. */
const CHECKED_HOSTS_LIMIT = 10_000;

/**
 * The addresses of each callback host that passed the check, kept for
 * {@linkcode CHECKED_ADDRESSES_TTL_MS}: the dispatcher's attempts to a host look it up once per
 * period instead of twice (A and AAAA) per attempt, which at hundreds of deliveries a second would
 * be a resolver's rate limit (docs/security.md, "Callback safety"). Only a passing check is kept,
 * and only while its addresses answer: a refusal, a failed lookup or an attempt that got no answer
 * is asked again at the next attempt.
 */
export class CheckedAddresses {
  #entries = new Map<string, { addresses: string[]; until: number }>();
  #now: () => number;

  constructor(options: { now?: () => number } = {}) {
    this.#now = options.now ?? (() => performance.now());
  }

  /** The addresses of `host` that passed a check within the period, or null. */
  get(host: string): string[] | null {
    const entry = this.#entries.get(host);
    if (entry === undefined) return null;
    if (entry.until > this.#now()) return entry.addresses;
    this.#entries.delete(host);
    return null;
  }

  /** Keeps the addresses of `host` that just passed the check. */
  set(host: string, addresses: string[]): void {
    const until = this.#now() + CHECKED_ADDRESSES_TTL_MS;
    setBounded(this.#entries, host, { addresses, until }, CHECKED_HOSTS_LIMIT);
  }

  /** Drops the addresses of `host`: none of them answered, so the next check asks again. */
  forget(host: string): void {
    this.#entries.delete(host);
  }
}

/** A name lookup: the addresses of `host` (IPv4 first, by convention), or a rejection. */
export type ResolveHost = (host: string, signal: AbortSignal) => Promise<string[]>;

/** A callback that may be called now, and where. */
export interface CheckedCallback {
  url: URL;
  /** The host name (or address) of the URL, without brackets: for TLS and the `Host` header. */
  host: string;
  /**
   * The addresses that passed the check, in the resolver's order: connect to these only. Null
   * only for a target made without {@linkcode checkCallback}: the HTTP client then resolves the
   * name itself and keeps its connections by name.
   */
  addresses: string[] | null;
}

/** How the target is checked. */
export interface CheckOptions {
  policy: CallbackPolicy;
  /** Only for the message of a lookup cut short by `signal`. */
  timeoutMs: number;
  /** {@linkcode resolveHost} by default. */
  resolve?: ResolveHost;
  /** Where passing checks are kept briefly; without it, every check resolves the name. */
  checkedAddresses?: CheckedAddresses;
}

/**
 * Checks the callback URL and resolves its host, within `signal`'s deadline (a resolver that
 * ignores the signal is abandoned when it fires). Returns where to connect, or why not.
 */
export async function checkCallback(
  text: string,
  options: CheckOptions,
  signal: AbortSignal,
): Promise<CheckedCallback | { problem: string }> {
  const problem = callbackUrlProblem(text, options.policy);
  if (problem !== null) return { problem };
  const url = new URL(text);
  if (url.port !== "" && BAD_PORTS.has(Number(url.port))) {
    return { problem: `port ${url.port} belongs to another protocol` };
  }
  const host = callbackHost(url);
  // A literal address needs no lookup; callbackUrlProblem has judged it.
  if (parseIpAddress(host) !== null) return { url, host, addresses: [host] };
  const kept = options.checkedAddresses?.get(host) ?? null;
  if (kept !== null) return { url, host, addresses: kept };
  let answers: string[];
  try {
    answers = await untilAborted((options.resolve ?? resolveHost)(host, signal), signal);
  } catch (error) {
    if (signal.aborted) {
      return { problem: `${host} did not resolve within ${options.timeoutMs} ms` };
    }
    return { problem: `${host} does not resolve (${describeLookupError(error)})` };
  }
  // One refused address refuses the name: a name that mixes public and private answers is either
  // misconfigured or an attempt to reach the private one. A metadata service is refused even
  // where private networks are allowed.
  for (const address of answers) {
    if (options.policy.allowPrivateNetworks) {
      const metadata = metadataAddressReason(address);
      if (metadata !== null) return { problem: `${host} resolves to ${metadata}` };
      continue;
    }
    const reason = nonGlobalAddressReason(address);
    if (reason !== null) {
      return { problem: `${host} resolves to an address that is not public: ${reason}` };
    }
  }
  const addresses = answers.filter((address) => parseIpAddress(address) !== null);
  if (addresses.length === 0) return { problem: `${host} does not resolve` };
  options.checkedAddresses?.set(host, addresses);
  return { url, host, addresses };
}

/** A and AAAA records through Deno's resolver (which reads the hosts file and resolv.conf). */
export async function resolveHost(host: string, signal: AbortSignal): Promise<string[]> {
  const lookups = await Promise.allSettled([
    Deno.resolveDns(host, "A", { signal }),
    Deno.resolveDns(host, "AAAA", { signal }),
  ]);
  const addresses = lookups.flatMap((lookup) => lookup.status === "fulfilled" ? lookup.value : []);
  if (addresses.length === 0 && lookups[0].status === "rejected") throw lookups[0].reason;
  return addresses;
}

function describeLookupError(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}`.slice(0, 300) : String(error);
}
