/**
 * The runner of scheduled prunes (src/retention/job.ts) and their pace (src/retention/batches.ts):
 * one run at a time, a run stopped between batches at shutdown, and batches spaced by the time
 * the previous one took.
 */
import assert from "node:assert/strict";
import { PruneJob } from "../src/retention/job.ts";
import { BatchPacer } from "../src/retention/batches.ts";

Deno.test("prune job: one run at a time; stop ends the schedule and waits for the run", async () => {
  const started: AbortSignal[] = [];
  let finish = () => {};
  const job = new PruneJob("test prune job", "0 0 1 1 *", (signal) => {
    started.push(signal);
    return new Promise((resolve) => finish = resolve);
  });
  job.start(); // a run at once, then the schedule
  const joined = job.run();
  assert.equal(started.length, 1, "a second run joins the one under way");

  let stopped = false;
  const stopping = job.stop().then(() => stopped = true);
  assert.equal(started[0].aborted, true, "the run is told to stop");
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(stopped, false, "stop waits for the run to end");
  finish();
  await joined;
  await stopping;
  await job.run();
  assert.equal(started.length, 1, "no run after stop");
});

Deno.test("prune job: a failing prune does not break the job", async () => {
  let runs = 0;
  const job = new PruneJob("test failing prune job", "0 0 1 1 *", () => {
    runs++;
    return Promise.reject(new Error("database away"));
  });
  await job.run();
  await job.run();
  assert.equal(runs, 2);
  await job.stop();
});

Deno.test("batch pacer: a pause as long as the last batch, and none after a stop", async () => {
  const stop = new AbortController();
  const pacer = new BatchPacer({ batchSize: 3, signal: stop.signal });
  assert.equal(pacer.batchSize, 3);
  const slow = () => new Promise<string>((resolve) => setTimeout(() => resolve("done"), 120));
  assert.equal(await pacer.run(slow), "done");
  const before = performance.now();
  assert.equal(await pacer.run(() => Promise.resolve(1)), 1);
  assert.ok(performance.now() - before >= 100, "the second batch waited for the first's time");
  // A stop during the pause ends it at once, and the batch does not run.
  const waiting = pacer.run(slow);
  stop.abort();
  assert.equal(await waiting, null);
  assert.equal(pacer.stopped, true);
});
