/** Deadlines on work that may never settle. */
import assert from "node:assert/strict";
import { DeadlineExceededError, withDeadline } from "../src/lib/deadline.ts";

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
