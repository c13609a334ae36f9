import assert from "node:assert/strict";
import { parseRetryAfterMs } from "../src/lib/retry_after.ts";

Deno.test("Retry-After: delay-seconds or an HTTP date, nothing else", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(parseRetryAfterMs(null, now), null);
  assert.equal(parseRetryAfterMs("120", now), 120_000);
  assert.equal(parseRetryAfterMs(" 5 ", now), 5000);
  assert.equal(parseRetryAfterMs("0", now), 0);
  assert.equal(parseRetryAfterMs("Thu, 01 Jan 2026 00:01:30 GMT", now), 90_000);
  assert.equal(parseRetryAfterMs("Thursday, 01-Jan-26 00:01:30 GMT", now), 90_000, "RFC 850");
  assert.equal(parseRetryAfterMs("Thu Jan  1 00:01:30 2026", now), 90_000, "asctime");
  assert.equal(parseRetryAfterMs("Wed, 31 Dec 2025 23:00:00 GMT", now), 0, "a past date");
});

Deno.test("Retry-After: what Date.parse would take as a year is no hint at all", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  for (const value of ["-5", "1.5", "+30", "soon", "", "30s", "1e3", "0x10"]) {
    assert.equal(parseRetryAfterMs(value, now), null, JSON.stringify(value));
  }
});
