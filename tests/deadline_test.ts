/** Deadlines on work that may never settle. */
import assert from "node:assert/strict";
import { DeadlineExceededError, timeoutSignal, withDeadline } from "../src/deadline.ts";

Deno.test("deadline: work that settles in time passes through, value or error", async () => {
  assert.equal(await withDeadline(Promise.resolve(7), 1_000), 7);
  await assert.rejects(withDeadline(Promise.reject(new Error("boom")), 1_000), /boom/);
});

Deno.test("deadline: work that never settles rejects once the time is up", async () => {
  const started = performance.now();
  const error = await withDeadline(new Promise(() => {}), 50).catch((e) => e);
  assert.ok(error instanceof DeadlineExceededError);
  assert.equal(error.code, "DEADLINE_EXCEEDED");
  assert.equal(error.message, "no answer within 50 ms");
  assert.ok(performance.now() - started >= 45);
});

Deno.test("timeout signal: aborts with a TimeoutError once the time is up", async () => {
  const { signal, clear } = timeoutSignal(30);
  assert.equal(signal.aborted, false);
  // The signal's timer does not hold the event loop open (the next test); this one does.
  const keepAlive = setTimeout(() => {}, 5_000);
  const reason = await new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(signal.reason))
  );
  clearTimeout(keepAlive);
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

Deno.test("timeout signal: its timer alone does not keep the process running", async () => {
  const module = new URL("../src/deadline.ts", import.meta.url).href;
  const started = performance.now();
  const { code } = await new Deno.Command(Deno.execPath(), {
    args: ["eval", `import { timeoutSignal } from "${module}"; timeoutSignal(20_000);`],
    stdout: "null",
    stderr: "inherit",
  }).output();
  assert.equal(code, 0);
  assert.ok(performance.now() - started < 10_000, "the process waited for the timer");
});
