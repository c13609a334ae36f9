/** Deadlines that share one runtime timer per 25 ms slot. */
import assert from "node:assert/strict";
import { afterDeadline, SLOT_MS } from "../src/lib/shared_timers.ts";

function firedAt(ms: number): { cancel: () => void; fired: Promise<number> } {
  let cancel: () => void = () => {};
  const fired = new Promise<number>((resolve) => {
    cancel = afterDeadline(ms, () => resolve(Date.now()));
  });
  return { cancel, fired };
}

Deno.test("shared timers: a deadline fires never early and at most one slot late", async () => {
  for (const ms of [0, 1, 40, 120]) {
    const armed = Date.now();
    const at = await firedAt(ms).fired;
    assert.ok(at - armed >= ms, `${ms} ms fired after ${at - armed} ms`);
    // One slot, plus room for a busy machine.
    assert.ok(at - armed <= ms + SLOT_MS + 200, `${ms} ms fired after ${at - armed} ms`);
  }
});

Deno.test("shared timers: deadlines in one slot share one runtime timer", async () => {
  const original = globalThis.setTimeout;
  let armed = 0;
  // Counts the runtime timers the module sets; each is still a real one.
  globalThis.setTimeout = ((...args: Parameters<typeof setTimeout>) => {
    armed++;
    return original(...args);
  }) as typeof setTimeout;
  const fired: Promise<number>[] = [];
  try {
    for (let i = 0; i < 100; i++) fired.push(firedAt(60).fired);
  } finally {
    globalThis.setTimeout = original;
  }
  // All 100 end within the same few milliseconds: one slot, or two if a boundary fell between.
  assert.ok(armed <= 2, `${armed} timers for 100 deadlines`);
  assert.equal((await Promise.all(fired)).length, 100);
});

Deno.test("shared timers: a cancelled deadline never fires; the others in its slot do", async () => {
  let cancelledFired = false;
  const cancel = afterDeadline(30, () => cancelledFired = true);
  const kept = firedAt(30);
  cancel();
  cancel(); // twice is harmless
  await kept.fired;
  await new Promise((resolve) => setTimeout(resolve, SLOT_MS * 2));
  assert.equal(cancelledFired, false);
});

Deno.test("shared timers: the same callback armed twice is two deadlines", async () => {
  let calls = 0;
  const callback = () => calls++;
  afterDeadline(10, callback);
  const cancelSecond = afterDeadline(10, callback);
  cancelSecond();
  await new Promise((resolve) => setTimeout(resolve, 10 + SLOT_MS * 3));
  assert.equal(calls, 1);
});

Deno.test("shared timers: cancelling the last deadline of a slot clears its runtime timer", () => {
  const original = globalThis.clearTimeout;
  let cleared = 0;
  globalThis.clearTimeout = ((id?: number) => {
    cleared++;
    original(id);
  }) as typeof clearTimeout;
  try {
    const slotOf = (now: number) => Math.ceil((now + 60_000) / SLOT_MS);
    let cancels: (() => void)[];
    while (true) {
      const before = Date.now();
      cancels = Array.from({ length: 10 }, () => afterDeadline(60_000, () => {}));
      if (slotOf(before) === slotOf(Date.now())) break;
      // A slot boundary fell between: start again, so that all ten share one slot.
      for (const cancel of cancels) cancel();
      cleared = 0;
    }
    for (const cancel of cancels.slice(1)) cancel();
    assert.equal(cleared, 0, "the slot still has a deadline");
    cancels[0]();
    assert.equal(cleared, 1);
  } finally {
    globalThis.clearTimeout = original;
  }
});
