/** Abort signals that end work. */
import assert from "node:assert/strict";
import { timeoutSignal, untilAborted } from "../src/lib/abort.ts";

Deno.test("timeout signal: aborts with a TimeoutError once the time is up", async () => {
  const { signal, clear } = timeoutSignal(30);
  assert.equal(signal.aborted, false);
  const reason = await new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(signal.reason))
  );
  assert.ok(reason instanceof DOMException);
  assert.equal(reason.name, "TimeoutError");
  clear(); // harmless afterwards
});

Deno.test("timeout signal: cleared, it never aborts", async () => {
  const { signal, clear } = timeoutSignal(20);
  clear();
  await new Promise((resolve) => setTimeout(resolve, 60));
  assert.equal(signal.aborted, false);
});

Deno.test("until aborted: settles like the work, or rejects with the signal's reason", async () => {
  const controller = new AbortController();
  assert.equal(await untilAborted(Promise.resolve(3), controller.signal), 3);
  const pending = untilAborted(new Promise(() => {}), controller.signal);
  controller.abort(new Error("stop"));
  await assert.rejects(pending, /stop/);
  await assert.rejects(untilAborted(Promise.resolve(1), controller.signal), /stop/);
});
