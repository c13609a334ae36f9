/**
 * The lookup cache in front of the database (src/lib/cache.ts): found values in a bounded LRU that
 * misses cannot evict, misses in a bounded negative cache, unknown keys looked up in batches.
 */
import assert from "node:assert/strict";
import { type BatchLoader, loadEach, LookupCache } from "../src/lib/cache.ts";

/** A loader over a fixed table that records every call it gets. */
function recordingLoader(table: Map<string, string>) {
  const calls: string[][] = [];
  let gate: Promise<void> | null = null;
  const load: BatchLoader<string> = async (keys) => {
    calls.push([...keys]);
    if (gate) await gate;
    const values = new Map<string, string>();
    for (const key of keys) if (table.has(key)) values.set(key, table.get(key)!);
    return values;
  };
  return {
    load,
    calls,
    /** Holds every load until the returned function is called. */
    hold(): () => void {
      const { promise, resolve } = Promise.withResolvers<void>();
      gate = promise;
      return () => {
        gate = null;
        resolve();
      };
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

Deno.test("found values and absences are served from the cache for the TTL, then looked up again", async () => {
  const table = new Map([["a", "A"]]);
  const loader = recordingLoader(table);
  const cache = new LookupCache(loader.load, { ttlMs: 40, batchIntervalMs: 0 });
  assert.equal(await cache.get("a"), "A");
  assert.equal(await cache.get("x"), null);
  assert.equal(await cache.get("a"), "A");
  assert.equal(await cache.get("x"), null);
  assert.equal(loader.calls.length, 2);

  table.set("a", "A2");
  table.set("x", "X");
  await sleep(60);
  assert.equal(await cache.get("a"), "A2");
  assert.equal(await cache.get("x"), "X");
  assert.equal(loader.calls.length, 4);
  // A value that disappears (a revoked key) becomes an absence.
  table.delete("a");
  await sleep(60);
  assert.equal(await cache.get("a"), null);
});

Deno.test("a flood of unknown keys neither evicts found values nor grows past its bounds", async () => {
  const table = new Map([["a", "A"], ["b", "B"], ["c", "C"]]);
  const loader = recordingLoader(table);
  const cache = new LookupCache(loader.load, {
    ttlMs: 60_000,
    limit: 3,
    absentLimit: 50,
    batchIntervalMs: 0,
  });
  for (const key of table.keys()) await cache.get(key);
  const before = loader.calls.length;
  await Promise.all(Array.from({ length: 1_000 }, (_, i) => cache.get(`random-${i}`)));
  assert.deepEqual(cache.sizes, { found: 3, absent: 50 });
  for (const key of table.keys()) assert.equal(await cache.get(key), table.get(key));
  const lookedUp = loader.calls.slice(before).flat();
  assert.ok(!lookedUp.some((key) => table.has(key)), "a real key was looked up again");
});

Deno.test("found values are kept least recently used first out", async () => {
  const table = new Map([["a", "A"], ["b", "B"], ["c", "C"]]);
  const loader = recordingLoader(table);
  const cache = new LookupCache(loader.load, { ttlMs: 60_000, limit: 2, batchIntervalMs: 0 });
  await cache.get("a");
  await cache.get("b");
  await cache.get("a"); // a is now more recent than b
  await cache.get("c"); // evicts b
  const calls = loader.calls.length;
  await cache.get("a");
  await cache.get("c");
  assert.equal(loader.calls.length, calls);
  await cache.get("b");
  assert.equal(loader.calls.length, calls + 1);
});

Deno.test("unknown keys share batches: one query in flight, at most one per interval", async () => {
  const loader = recordingLoader(new Map([["real", "R"]]));
  const cache = new LookupCache(loader.load, {
    ttlMs: 60_000,
    batchIntervalMs: 30,
    batchLimit: 40,
  });
  const keys = Array.from({ length: 100 }, (_, i) => `k${i}`);
  const started = performance.now();
  const values = await Promise.all([...keys, "real"].map((key) => cache.get(key)));
  const elapsed = performance.now() - started;
  assert.equal(values.filter((value) => value === null).length, 100);
  assert.equal(values.at(-1), "R");
  // The first key goes at once; the other 100 wait for the interval and go 40 at a time.
  assert.deepEqual(loader.calls.map((batch) => batch.length), [1, 40, 40, 20]);
  assert.ok(elapsed >= 3 * 30 - 5, `batches were ${elapsed.toFixed(0)} ms apart in all`);
});

Deno.test("a known key is looked up on its own, without waiting behind unknown keys", async () => {
  const loader = recordingLoader(new Map([["real", "R"]]));
  const cache = new LookupCache(loader.load, { ttlMs: 20, batchIntervalMs: 0 });
  assert.equal(await cache.get("real"), "R");
  await sleep(40); // stale now: known, but to be looked up again
  const release = loader.hold();
  const unknown = cache.get("unknown"); // a batch in flight, held
  const queued = cache.get("queued"); // waits for that batch to finish
  const known = cache.get("real");
  assert.deepEqual(loader.calls, [["real"], ["unknown"], ["real"]]);
  release();
  assert.equal(await known, "R");
  assert.equal(await unknown, null);
  assert.equal(await queued, null);
  assert.deepEqual(loader.calls.at(-1), ["queued"]);
});

Deno.test("concurrent callers of one key share a load; a failed load caches nothing", async () => {
  let calls = 0;
  let fail = true;
  const cache = new LookupCache<string>(async (keys) => {
    calls++;
    await sleep(5);
    if (fail) throw new Error("database down");
    return new Map(keys.map((key) => [key, key.toUpperCase()]));
  }, { ttlMs: 60_000, batchIntervalMs: 0 });
  const results = await Promise.allSettled([cache.get("a"), cache.get("a"), cache.get("a")]);
  assert.equal(calls, 1);
  assert.ok(results.every((result) => result.status === "rejected"));
  fail = false;
  assert.deepEqual(await Promise.all([cache.get("a"), cache.get("a")]), ["A", "A"]);
  assert.equal(calls, 2);
  assert.deepEqual(cache.sizes, { found: 1, absent: 0 });
});

Deno.test("loadEach loads keys one by one and leaves out nulls", async () => {
  const load = loadEach((key) => Promise.resolve(key === "none" ? null : key.length));
  assert.deepEqual(await load(["ab", "none", "abc"]), new Map([["ab", 2], ["abc", 3]]));
});
