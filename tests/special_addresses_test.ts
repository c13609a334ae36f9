/**
 * The table of special-purpose ranges (src/delivery/special_addresses.ts): every entry with an
 * address of its own and the verdict the registries give it, the most specific entry deciding,
 * range boundaries, IPv4 carried in IPv6, and the spellings a URL parser or a resolver can yield.
 */
import assert from "node:assert/strict";
import {
  nonGlobalAddressReason,
  parseIpAddress,
  SPECIAL_PURPOSE_RANGES,
  specialPurposeRangeOf,
} from "../src/delivery/special_addresses.ts";

/** For each entry: an address that falls in it and in no more specific entry, and the verdict. */
const SAMPLES: [cidr: string, address: string, refused: boolean][] = [
  // IPv4 Special-Purpose Address Registry
  ["0.0.0.0/8", "0.1.2.3", true],
  ["0.0.0.0/32", "0.0.0.0", true],
  ["10.0.0.0/8", "10.255.255.255", true],
  ["100.64.0.0/10", "100.127.255.254", true],
  ["127.0.0.0/8", "127.0.0.1", true],
  ["169.254.0.0/16", "169.254.169.254", true],
  ["172.16.0.0/12", "172.31.0.1", true],
  ["192.0.0.0/24", "192.0.0.100", true],
  ["192.0.0.0/29", "192.0.0.1", true],
  ["192.0.0.8/32", "192.0.0.8", true],
  ["192.0.0.9/32", "192.0.0.9", false],
  ["192.0.0.10/32", "192.0.0.10", false],
  ["192.0.0.170/32", "192.0.0.170", true],
  ["192.0.0.171/32", "192.0.0.171", true],
  ["192.0.2.0/24", "192.0.2.10", true],
  ["192.31.196.0/24", "192.31.196.1", false],
  ["192.52.193.0/24", "192.52.193.1", false],
  ["192.88.99.0/24", "192.88.99.1", true],
  ["192.88.99.2/32", "192.88.99.2", true],
  ["192.168.0.0/16", "192.168.1.1", true],
  ["192.175.48.0/24", "192.175.48.6", false],
  ["198.18.0.0/15", "198.18.0.1", true],
  ["198.51.100.0/24", "198.51.100.7", true],
  ["203.0.113.0/24", "203.0.113.9", true],
  ["240.0.0.0/4", "250.1.2.3", true],
  ["255.255.255.255/32", "255.255.255.255", true],
  ["224.0.0.0/4", "239.255.255.250", true],
  // IPv6 Special-Purpose Address Registry
  ["::1/128", "::1", true],
  ["::/128", "::", true],
  ["::ffff:0:0/96", "::ffff:8.8.8.8", true],
  ["64:ff9b::/96", "64:ff9b::8.8.8.8", false],
  ["64:ff9b:1::/48", "64:ff9b:1::808:808", true],
  ["100::/64", "100::1", true],
  ["100:0:0:1::/64", "100:0:0:1::1", true],
  ["2001::/23", "2001:100::1", true],
  ["2001::/32", "2001:0:4136:e378:8000:63bf:3fff:fdd2", true],
  ["2001:1::1/128", "2001:1::1", false],
  ["2001:1::2/128", "2001:1::2", false],
  ["2001:1::3/128", "2001:1::3", false],
  ["2001:2::/48", "2001:2::1", true],
  ["2001:3::/32", "2001:3::1", false],
  ["2001:4:112::/48", "2001:4:112::1", false],
  ["2001:10::/28", "2001:10::1", true],
  ["2001:20::/28", "2001:20::1", false],
  ["2001:30::/28", "2001:30::1", false],
  ["2001:db8::/32", "2001:db8::1", true],
  ["2002::/16", "2002:808:808::1", false],
  ["2620:4f:8000::/48", "2620:4f:8000::1", false],
  ["3fff::/20", "3fff:fff::1", true],
  ["5f00::/16", "5f00::1", true],
  ["fc00::/7", "fd12:3456::1", true],
  ["fe80::/10", "fe80::1", true],
  ["::/96", "::808:808", true],
  // IPv6 Address Space Registry outside 2000::/3
  ["::/8", "::1:0:0:0", true],
  ["100::/8", "1ff::1", true],
  ["200::/7", "300::1", true],
  ["400::/6", "700::1", true],
  ["800::/5", "f00::1", true],
  ["1000::/4", "1fff::1", true],
  ["4000::/3", "4000::1", true],
  ["6000::/3", "7fff::1", true],
  ["8000::/3", "8000::1", true],
  ["a000::/3", "bfff::1", true],
  ["c000::/3", "c000::1", true],
  ["e000::/4", "efff::1", true],
  ["f000::/5", "f7ff::1", true],
  ["f800::/6", "fbff::1", true],
  ["fe00::/9", "fe7f::1", true],
  ["fec0::/10", "fec0::1", true],
  ["ff00::/8", "ff02::1", true],
];

Deno.test("special addresses: every entry of the table, with the verdict of its registry", () => {
  const sampled = new Set(SAMPLES.map(([cidr]) => cidr));
  const entries = SPECIAL_PURPOSE_RANGES.map((range) => range.cidr);
  assert.deepEqual(entries.filter((cidr) => !sampled.has(cidr)), [], "entries without a sample");
  assert.equal(new Set(entries).size, entries.length, "an entry is listed twice");
  for (const [cidr, address, refused] of SAMPLES) {
    assert.equal(specialPurposeRangeOf(address)?.cidr, cidr, `${address} should fall in ${cidr}`);
    const reason = nonGlobalAddressReason(address);
    assert.equal(reason !== null, refused, `${address} (${cidr}): ${reason}`);
  }
  for (const range of SPECIAL_PURPOSE_RANGES) {
    assert.ok(range.name.length > 0 && /^RFC \d+/.test(range.reference), range.cidr);
  }
});

Deno.test("special addresses: the reason names the range and its registry name", () => {
  assert.equal(
    nonGlobalAddressReason("169.254.169.254"),
    "169.254.169.254 is in 169.254.0.0/16 (Link Local)",
  );
  assert.equal(
    nonGlobalAddressReason("198.18.0.1"),
    "198.18.0.1 is in 198.18.0.0/15 (Benchmarking)",
  );
  assert.equal(nonGlobalAddressReason("8.8.8.8"), null);
  assert.equal(nonGlobalAddressReason("2606:4700:4700::1111"), null);
});

Deno.test("special addresses: range boundaries", () => {
  const cases: [string, boolean][] = [
    ["9.255.255.255", false],
    ["10.0.0.0", true],
    ["11.0.0.0", false],
    ["100.63.255.255", false],
    ["100.64.0.0", true],
    ["100.127.255.255", true],
    ["100.128.0.0", false],
    ["126.255.255.255", false],
    ["128.0.0.0", false],
    ["169.253.255.255", false],
    ["169.255.0.0", false],
    ["172.15.255.255", false],
    ["172.16.0.0", true],
    ["172.31.255.255", true],
    ["172.32.0.0", false],
    ["191.255.255.255", false],
    ["192.0.0.7", true],
    ["192.0.0.11", true],
    ["192.0.1.0", false],
    ["192.167.255.255", false],
    ["192.169.0.0", false],
    ["198.17.255.255", false],
    ["198.19.255.255", true],
    ["198.20.0.0", false],
    ["223.255.255.255", false],
    ["224.0.0.0", true],
    ["1.0.0.0", false],
    ["1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true],
    ["2000::", false],
    ["2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", true],
    ["2001:200::", false],
    ["2001:1::4", true],
    ["2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", false],
    ["2001:db8::", true],
    ["2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", true],
    ["2001:db9::", false],
    ["3ffe:ffff::1", false],
    ["3fff:1000::", false],
    ["3fff:0fff:ffff:ffff:ffff:ffff:ffff:ffff", true],
    ["3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false],
    ["4000::", true],
    ["fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true],
    ["64:ff9b::ffff:ffff", true], // carries 255.255.255.255
    ["64:ff9b:0:0:0:1::", true], // outside the /96: reserved ::/8
  ];
  for (const [address, refused] of cases) {
    assert.equal(nonGlobalAddressReason(address) !== null, refused, address);
  }
});

Deno.test("special addresses: IPv4 carried in IPv6 is judged as IPv4", () => {
  const metadata = /carries 169\.254\.169\.254, in 169\.254\.0\.0\/16 \(Link Local\)/;
  for (
    const address of [
      "::ffff:169.254.169.254", // IPv4-mapped, dotted
      "::ffff:a9fe:a9fe", // IPv4-mapped, as the URL parser writes it
      "::169.254.169.254", // IPv4-compatible
      "::a9fe:a9fe",
      "64:ff9b::169.254.169.254", // NAT64 well-known prefix
      "64:ff9b::a9fe:a9fe",
      "2002:a9fe:a9fe::", // 6to4
      "2002:a9fe:a9fe:1234::1",
      "0:0:0:0:0:FFFF:A9FE:A9FE", // uncompressed, upper case
    ]
  ) {
    assert.match(nonGlobalAddressReason(address) ?? "", metadata, address);
  }
  // Carried loopback, private and reserved addresses too.
  for (
    const address of ["::ffff:7f00:1", "64:ff9b::a00:1", "2002:c0a8:101::", "64:ff9b::f000:1"]
  ) {
    assert.match(nonGlobalAddressReason(address) ?? "", /carries /, address);
  }
  // A NAT64 or 6to4 address of a public IPv4 address is public; mapped and compatible never are.
  assert.equal(nonGlobalAddressReason("64:ff9b::808:808"), null);
  assert.equal(nonGlobalAddressReason("2002:808:808::1"), null);
  assert.match(nonGlobalAddressReason("::ffff:808:808") ?? "", /IPv4-mapped/);
  assert.match(nonGlobalAddressReason("::808:808") ?? "", /IPv4-compatible/);
  // The local-use NAT64 prefix and Teredo are refused whatever they carry.
  assert.match(nonGlobalAddressReason("64:ff9b:1::808:808") ?? "", /64:ff9b:1::\/48/);
  assert.match(nonGlobalAddressReason("2001:0:808:808::") ?? "", /TEREDO/);
});

Deno.test("special addresses: IPv4 spellings, as the URL parser reads them", () => {
  // WHATWG URL parsing turns every IPv4 spelling into dotted decimal, so the check sees the
  // address the connection would go to.
  const spellings: [string, string][] = [
    ["http://2852039166/", "169.254.169.254"],
    ["http://0xa9fea9fe/", "169.254.169.254"],
    ["http://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"],
    ["http://0251.0376.0251.0376/", "169.254.169.254"],
    ["http://169.254.43518/", "169.254.169.254"],
    ["http://169.16689662/", "169.254.169.254"],
    ["http://0x7f.1/", "127.0.0.1"],
    ["http://127.1/", "127.0.0.1"],
    ["http://0/", "0.0.0.0"],
    ["http://017700000001/", "127.0.0.1"],
    ["http://127.0.0.1./", "127.0.0.1"],
    ["http://[::ffff:169.254.169.254]/", "[::ffff:a9fe:a9fe]"],
    ["http://[0:0:0:0:0:ffff:a9fe:a9fe]/", "[::ffff:a9fe:a9fe]"],
    ["http://[::FFFF:A9FE:A9FE]/", "[::ffff:a9fe:a9fe]"],
    ["http://[64:ff9b::169.254.169.254]/", "[64:ff9b::a9fe:a9fe]"],
  ];
  for (const [url, hostname] of spellings) {
    assert.equal(new URL(url).hostname, hostname, url);
    const host = hostname.replace(/^\[|\]$/g, "");
    assert.notEqual(nonGlobalAddressReason(host), null, url);
  }
});

Deno.test("special addresses: only plain forms parse; anything else is refused", () => {
  // What a resolver hook or a misbehaving resolver could hand back: never guessed at.
  for (
    const text of [
      "2852039166",
      "0xa9.0xfe.0xa9.0xfe",
      "0251.0376.0251.0376",
      "169.254.43518",
      "010.0.0.1",
      "256.1.1.1",
      "1.2.3",
      "1.2.3.4.5",
      " 8.8.8.8",
      "8.8.8.8 ",
      "[::1]",
      "fe80::1%eth0",
      "1:2:3:4:5:6:7:8:9",
      "1:2:3:4:5:6:7:8::",
      ":::",
      ":1",
      "12345::",
      "::ffff:1.2.3",
      "example.com",
      "",
    ]
  ) {
    assert.equal(parseIpAddress(text), null, JSON.stringify(text));
    assert.match(nonGlobalAddressReason(text) ?? "", /not an IP address/, JSON.stringify(text));
  }
  assert.deepEqual([...parseIpAddress("1.2.3.4")!], [1, 2, 3, 4]);
  assert.deepEqual(
    [...parseIpAddress("1::ffff:1.2.3.4")!],
    [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 1, 2, 3, 4],
  );
  assert.equal(parseIpAddress("::")?.length, 16);
  assert.equal(parseIpAddress("1:2:3:4:5:6:7::")?.[13], 7);
});
