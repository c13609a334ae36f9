/** The per-key throttle for log lines a sender can repeat at will. */
import assert from "node:assert/strict";
import { Throttle } from "../src/lib/throttle.ts";

/** A throttle whose clock a test moves with `advance`. */
function throttleOf(intervalMs: number, maxKeys?: number) {
  let clock = 1_000_000;
  const throttle = new Throttle({ intervalMs, maxKeys, now: () => clock });
  return {
    throttle,
    advance(ms: number) {
      clock += ms;
    },
  };
}

Deno.test("throttle: one event per key per interval", () => {
  const { throttle, advance } = throttleOf(60_000);
  assert.equal(throttle.allow("a"), true);
  assert.equal(throttle.allow("a"), false);
  assert.equal(throttle.allow("b"), true, "keys are independent");
  advance(59_999);
  assert.equal(throttle.allow("a"), false);
  advance(1);
  assert.equal(throttle.allow("a"), true);
  assert.equal(throttle.allow("a"), false);
  assert.equal(throttle.allow("b"), true, "b passed 60 s ago");
});

Deno.test("throttle: bounded, forgetting expired keys first, then the oldest", () => {
  const { throttle, advance } = throttleOf(60_000, 3);
  throttle.allow("old");
  advance(60_000);
  throttle.allow("a");
  throttle.allow("b");
  assert.equal(throttle.size, 3);
  // Full: the expired key goes, the recent ones stay closed.
  assert.equal(throttle.allow("c"), true);
  assert.equal(throttle.size, 3);
  assert.equal(throttle.allow("a"), false);
  assert.equal(throttle.allow("b"), false);
  // Full of recent keys: the oldest is forgotten, and may pass early (the safe side).
  assert.equal(throttle.allow("d"), true);
  assert.equal(throttle.size, 3);
  assert.equal(throttle.allow("a"), true, "a was the oldest, forgotten");
  for (let i = 0; i < 10_000; i++) throttle.allow(`flood-${i}`);
  assert.equal(throttle.size, 3);
});
