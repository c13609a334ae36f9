/**
 * Which IP addresses a callback may not reach: one table of ranges, taken from the IANA IPv4 and
 * IPv6 Special-Purpose Address Registries (with their "Globally Reachable" column), the IPv4
 * multicast block and the IPv6 address space outside global unicast (2000::/3), and one matcher.
 * The most specific range containing an address decides (192.0.0.9/32 is reachable although
 * 192.0.0.0/24 is not). Where an IPv6 range carries an IPv4 address (mapped, compatible, NAT64,
 * 6to4), the IPv4 address is judged too. See docs/security.md, "Callback safety".
 */

/** One range of the table. */
export interface SpecialPurposeRange {
  /** The block as the registry writes it, e.g. `169.254.0.0/16`. */
  cidr: string;
  /** The registry's name for it. */
  name: string;
  /** Where it is defined. */
  reference: string;
  /** The registry's "Globally Reachable" column; `null` where it says N/A (counts as false). */
  globallyReachable: boolean | null;
  /**
   * Where an IPv4 address sits inside it (`last32`: the low 32 bits; `6to4`: bits 16 to 47).
   * An address of the range is refused when that IPv4 address is not globally reachable,
   * whatever the range's own column says.
   */
  embedsIPv4?: "last32" | "6to4";
}

/** The table. Order does not matter: the longest matching prefix decides. */
export const SPECIAL_PURPOSE_RANGES: readonly SpecialPurposeRange[] = [
  // IANA IPv4 Special-Purpose Address Registry.
  v4("0.0.0.0/8", '"This network"', "RFC 791", false),
  v4("0.0.0.0/32", '"This host on this network"', "RFC 1122", false),
  v4("10.0.0.0/8", "Private-Use", "RFC 1918", false),
  v4("100.64.0.0/10", "Shared Address Space", "RFC 6598", false),
  v4("127.0.0.0/8", "Loopback", "RFC 1122", false),
  v4("169.254.0.0/16", "Link Local", "RFC 3927", false),
  v4("172.16.0.0/12", "Private-Use", "RFC 1918", false),
  v4("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890", false),
  v4("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", false),
  v4("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", false),
  v4("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", true),
  v4("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", true),
  v4("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050", false),
  v4("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050", false),
  v4("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", false),
  v4("192.31.196.0/24", "AS112-v4", "RFC 7535", true),
  v4("192.52.193.0/24", "AMT", "RFC 7450", true),
  v4("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", null),
  v4("192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", false),
  v4("192.168.0.0/16", "Private-Use", "RFC 1918", false),
  v4("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", true),
  v4("198.18.0.0/15", "Benchmarking", "RFC 2544", false),
  v4("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", false),
  v4("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", false),
  v4("240.0.0.0/4", "Reserved", "RFC 1112", false),
  v4("255.255.255.255/32", "Limited Broadcast", "RFC 8190, RFC 919", false),
  // IANA IPv4 Multicast Address Space Registry.
  v4("224.0.0.0/4", "Multicast", "RFC 5771", false),

  // IANA IPv6 Special-Purpose Address Registry.
  v6("::1/128", "Loopback Address", "RFC 4291", false),
  v6("::/128", "Unspecified Address", "RFC 4291", false),
  v6("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", false, "last32"),
  v6("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", true, "last32"),
  v6("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", false),
  v6("100::/64", "Discard-Only Address Block", "RFC 6666", false),
  v6("100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", false),
  v6("2001::/23", "IETF Protocol Assignments", "RFC 2928", false),
  v6("2001::/32", "TEREDO", "RFC 4380, RFC 8190", null),
  v6("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", true),
  v6("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", true),
  v6("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", true),
  v6("2001:2::/48", "Benchmarking", "RFC 5180", false),
  v6("2001:3::/32", "AMT", "RFC 7450", true),
  v6("2001:4:112::/48", "AS112-v6", "RFC 7535", true),
  v6("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", null),
  v6("2001:20::/28", "ORCHIDv2", "RFC 7343", true),
  v6("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", true),
  v6("2001:db8::/32", "Documentation", "RFC 3849", false),
  v6("2002::/16", "6to4", "RFC 3056", null, "6to4"),
  v6("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", true),
  v6("3fff::/20", "Documentation", "RFC 9637", false),
  v6("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", false),
  v6("fc00::/7", "Unique-Local", "RFC 4193, RFC 8190", false),
  v6("fe80::/10", "Link-Local Unicast", "RFC 4291", false),
  // Deprecated, and inside ::/8: named for a clearer refusal.
  v6("::/96", "IPv4-compatible Address (deprecated)", "RFC 4291", false, "last32"),

  // IANA IPv6 Address Space Registry: everything outside 2000::/3 (Global Unicast).
  v6("::/8", "Reserved by IETF", "RFC 4291", false),
  v6("100::/8", "Reserved by IETF", "RFC 4291", false),
  v6("200::/7", "Reserved by IETF", "RFC 4048", false),
  v6("400::/6", "Reserved by IETF", "RFC 4291", false),
  v6("800::/5", "Reserved by IETF", "RFC 4291", false),
  v6("1000::/4", "Reserved by IETF", "RFC 4291", false),
  v6("4000::/3", "Reserved by IETF", "RFC 4291", false),
  v6("6000::/3", "Reserved by IETF", "RFC 4291", false),
  v6("8000::/3", "Reserved by IETF", "RFC 4291", false),
  v6("a000::/3", "Reserved by IETF", "RFC 4291", false),
  v6("c000::/3", "Reserved by IETF", "RFC 4291", false),
  v6("e000::/4", "Reserved by IETF", "RFC 4291", false),
  v6("f000::/5", "Reserved by IETF", "RFC 4291", false),
  v6("f800::/6", "Reserved by IETF", "RFC 4291", false),
  v6("fe00::/9", "Reserved by IETF", "RFC 4291", false),
  v6("fec0::/10", "Reserved by IETF (formerly Site-Local)", "RFC 3879", false),
  v6("ff00::/8", "Multicast", "RFC 4291", false),
];

function v4(
  cidr: string,
  name: string,
  reference: string,
  globallyReachable: boolean | null,
): SpecialPurposeRange {
  return { cidr, name, reference, globallyReachable };
}

function v6(
  cidr: string,
  name: string,
  reference: string,
  globallyReachable: boolean | null,
  embedsIPv4?: "last32" | "6to4",
): SpecialPurposeRange {
  return embedsIPv4 === undefined
    ? { cidr, name, reference, globallyReachable }
    : { cidr, name, reference, globallyReachable, embedsIPv4 };
}

interface CompiledRange {
  range: SpecialPurposeRange;
  bytes: Uint8Array;
  prefixLength: number;
}

/** The table parsed once, most specific first, so the first match is the longest prefix. */
const COMPILED: readonly CompiledRange[] = SPECIAL_PURPOSE_RANGES.map((range) => {
  const [address, length] = range.cidr.split("/");
  const bytes = parseIpAddress(address);
  const prefixLength = Number(length);
  if (bytes === null || !(prefixLength >= 0 && prefixLength <= bytes.length * 8)) {
    throw new Error(`special_addresses: bad range ${range.cidr}`);
  }
  return { range, bytes, prefixLength };
}).sort((a, b) => b.prefixLength - a.prefixLength);

/**
 * Parses an IP address in its plain form: IPv4 as four decimal numbers without leading zeros,
 * IPv6 as hex groups with at most one `::` and optionally a dotted IPv4 tail. Anything else (octal,
 * hex or single-number IPv4 spellings, zone ids, brackets) is not an address here: callers that
 * meet it refuse it rather than guess how some other parser would read it.
 */
export function parseIpAddress(text: string): Uint8Array | null {
  return parseIPv4(text) ?? parseIPv6(text);
}

function parseIPv4(text: string): Uint8Array | null {
  const parts = text.split(".");
  if (parts.length !== 4) return null;
  const bytes = new Uint8Array(4);
  for (let i = 0; i < 4; i++) {
    if (!/^(0|[1-9]\d{0,2})$/.test(parts[i])) return null;
    const n = Number(parts[i]);
    if (n > 255) return null;
    bytes[i] = n;
  }
  return bytes;
}

function parseIPv6(text: string): Uint8Array | null {
  const halves = text.split("::");
  if (halves.length > 2) return null;
  const compressed = halves.length === 2;
  const head = wordsOf(halves[0], !compressed);
  const tail = compressed ? wordsOf(halves[1], true) : [];
  if (head === null || tail === null) return null;
  const missing = 8 - head.length - tail.length;
  if (compressed ? missing < 1 : missing !== 0) return null;
  const words = [...head, ...new Array<number>(missing).fill(0), ...tail];
  const bytes = new Uint8Array(16);
  words.forEach((word, i) => {
    bytes[2 * i] = word >> 8;
    bytes[2 * i + 1] = word & 0xff;
  });
  return bytes;
}

/** The 16-bit words of colon-separated hex groups; the last may be dotted IPv4 when `last`. */
function wordsOf(part: string, last: boolean): number[] | null {
  if (part === "") return [];
  const groups = part.split(":");
  const words: number[] = [];
  for (let i = 0; i < groups.length; i++) {
    const group = groups[i];
    if (last && i === groups.length - 1 && group.includes(".")) {
      const ipv4 = parseIPv4(group);
      if (ipv4 === null) return null;
      words.push((ipv4[0] << 8) | ipv4[1], (ipv4[2] << 8) | ipv4[3]);
    } else if (/^[0-9a-fA-F]{1,4}$/.test(group)) {
      words.push(parseInt(group, 16));
    } else {
      return null;
    }
  }
  return words;
}

/** The most specific range of the table that holds `bytes`, or null when none does. */
function rangeOfBytes(bytes: Uint8Array): SpecialPurposeRange | null {
  for (const { range, bytes: base, prefixLength } of COMPILED) {
    if (base.length === bytes.length && inPrefix(bytes, base, prefixLength)) return range;
  }
  return null;
}

function inPrefix(bytes: Uint8Array, base: Uint8Array, prefixLength: number): boolean {
  const whole = prefixLength >> 3;
  for (let i = 0; i < whole; i++) if (bytes[i] !== base[i]) return false;
  const rest = prefixLength & 7;
  if (rest === 0) return true;
  const mask = (0xff << (8 - rest)) & 0xff;
  return (bytes[whole] & mask) === (base[whole] & mask);
}

/** The most specific range of the table that holds `address`, or null (also for a non-address). */
export function specialPurposeRangeOf(address: string): SpecialPurposeRange | null {
  const bytes = parseIpAddress(address);
  return bytes === null ? null : rangeOfBytes(bytes);
}

/**
 * Why a callback may not connect to `address`, or null when it is globally reachable: for
 * example `169.254.169.254 is in 169.254.0.0/16 (Link Local)`, or for an IPv6 address carrying
 * an IPv4 one, `64:ff9b::a9fe:a9fe carries 169.254.169.254, in 169.254.0.0/16 (Link Local)`.
 * Text that is not an address in plain form is refused too.
 */
export function nonGlobalAddressReason(address: string): string | null {
  const bytes = parseIpAddress(address);
  if (bytes === null) return `${address} is not an IP address in plain form`;
  const range = rangeOfBytes(bytes);
  if (range === null) return null;
  if (range.embedsIPv4 !== undefined) {
    const at = range.embedsIPv4 === "6to4" ? 2 : 12;
    const ipv4 = bytes.slice(at, at + 4);
    const inner = rangeOfBytes(ipv4);
    if (inner !== null && inner.globallyReachable !== true) {
      return `${address} carries ${ipv4.join(".")}, in ${describe(inner)}`;
    }
    if (range.globallyReachable === false) return `${address} is in ${describe(range)}`;
    return null; // NAT64 or 6to4 of a reachable IPv4 address
  }
  return range.globallyReachable === true ? null : `${address} is in ${describe(range)}`;
}

/**
 * The cloud providers' instance metadata services, which hand out the machine's credentials to
 * whoever asks from it: never a callback, even where private networks are allowed. The Deno
 * permissions deny them too (src/process/permissions.ts), and the systemd unit denies link-local.
 */
export const CLOUD_METADATA_ADDRESSES: readonly string[] = [
  "169.254.169.254", // AWS, Google Cloud, Azure, Oracle, DigitalOcean, OpenStack
  "169.254.170.2", // AWS ECS task metadata
  "100.100.100.200", // Alibaba Cloud
  "fd00:ec2::254", // AWS over IPv6
];
const METADATA_BYTES = CLOUD_METADATA_ADDRESSES.map((address) => parseIpAddress(address)!);

/**
 * Why `address` is a cloud metadata service ({@linkcode CLOUD_METADATA_ADDRESSES}), in any
 * spelling, carried in an IPv6 address or not; null when it is not one.
 */
export function metadataAddressReason(address: string): string | null {
  const bytes = parseIpAddress(address);
  if (bytes === null) return null;
  const candidates = [bytes];
  const range = rangeOfBytes(bytes);
  if (range?.embedsIPv4 !== undefined) {
    const at = range.embedsIPv4 === "6to4" ? 2 : 12;
    candidates.push(bytes.slice(at, at + 4));
  }
  for (const candidate of candidates) {
    const index = METADATA_BYTES.findIndex((metadata) =>
      metadata.length === candidate.length && metadata.every((byte, i) => byte === candidate[i])
    );
    if (index !== -1) {
      return `${address} is a cloud metadata service (${CLOUD_METADATA_ADDRESSES[index]})`;
    }
  }
  return null;
}

function describe(range: SpecialPurposeRange): string {
  return `${range.cidr} (${range.name})`;
}
