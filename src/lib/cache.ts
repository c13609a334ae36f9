/**
 * A cache for lookups whose keys come from requests (API key hashes, tenant ids in URL paths), so
 * that what anyone can send neither grows memory, nor pushes out what real callers use, nor costs
 * a database query each:
 *
 * - Found values are kept in a least-recently-used map of at most `limit` entries and trusted for
 *   `ttlMs`. Past that a value is stale: its key is still known, and is looked up again on its
 *   own, ahead of unknown keys.
 * - Absences are kept apart, at most `absentLimit` of them for `ttlMs`, oldest dropped first, so
 *   misses never evict found values.
 * - Keys never seen (nor remembered as absent) are looked up together: one batch query at a time,
 *   started at most once per `batchIntervalMs`, with at most `batchLimit` keys. A flood of
 *   distinct unknown keys therefore costs a bounded number of queries per second, whatever its
 *   rate, and holds at most one database connection.
 * - Concurrent callers of one key share one load; a failed load caches nothing.
 */

/**
 * Sets `key` to `value` as the newest entry of `map` (insertion order is age order), then drops the
 * oldest entries past `limit`: the bound on every map here that untrusted input can fill.
 */
export function setBounded<K, V>(map: Map<K, V>, key: K, value: V, limit: number): void {
  map.delete(key);
  map.set(key, value);
  while (map.size > limit) map.delete(map.keys().next().value!);
}

/** Loads the values of `keys`; a key missing from the result is absent. */
export type BatchLoader<T> = (keys: string[]) => Promise<Map<string, T>>;

/**
 * A {@linkcode BatchLoader} that loads each key on its own, all at once, for lookups whose keys a
 * request cannot choose freely (the credentials of a tenant that was found).
 */
export function loadEach<T>(load: (key: string) => Promise<T | null>): BatchLoader<T> {
  return async (keys) => {
    const values = await Promise.all(keys.map(load));
    const found = new Map<string, T>();
    keys.forEach((key, i) => {
      if (values[i] !== null) found.set(key, values[i]);
    });
    return found;
  };
}

/** Options of {@linkcode LookupCache}. */
export interface LookupCacheOptions {
  /** How long a found value or an absence is trusted, in milliseconds. */
  ttlMs: number;
  /** Found values kept at most (least recently used dropped first); 10,000 by default. */
  limit?: number;
  /** Absences kept at most (oldest dropped first); 10,000 by default. */
  absentLimit?: number;
  /** Least time between the starts of two batches of unknown keys; 20 ms by default. */
  batchIntervalMs?: number;
  /** Unknown keys looked up in one batch at most; 1,000 by default. */
  batchLimit?: number;
  /** Told of every lookup, whether it was answered from the cache (telemetry counts them). */
  onLookup?: (hit: boolean) => void;
}

interface FoundEntry<T> {
  value: T;
  expiresAt: number;
}

/** Caches the values of a {@linkcode BatchLoader} by string key; `null` means absent. */
export class LookupCache<T> {
  #load: BatchLoader<T>;
  #ttlMs: number;
  #limit: number;
  #absentLimit: number;
  #batchIntervalMs: number;
  #batchLimit: number;
  /** Insertion order is recency order: a hit moves its key to the end. */
  #found = new Map<string, FoundEntry<T>>();
  /** Insertion order is expiry order, since every absence is kept for the same time. */
  #absent = new Map<string, number>();
  #loading = new Map<string, Promise<T | null>>();
  #queue = new Map<string, PromiseWithResolvers<T | null>>();
  #batchRunning = false;
  #batchTimer: ReturnType<typeof setTimeout> | undefined;
  #lastBatchAt = -Infinity;
  #onLookup: (hit: boolean) => void;

  constructor(load: BatchLoader<T>, options: LookupCacheOptions) {
    this.#load = load;
    this.#ttlMs = options.ttlMs;
    this.#limit = options.limit ?? 10_000;
    this.#absentLimit = options.absentLimit ?? 10_000;
    this.#batchIntervalMs = options.batchIntervalMs ?? 20;
    this.#batchLimit = options.batchLimit ?? 1_000;
    this.#onLookup = options.onLookup ?? (() => {});
  }

  /** The value of `key`, `null` when absent: from the cache, a shared load, or the next batch. */
  get(key: string): Promise<T | null> {
    const now = performance.now();
    const found = this.#found.get(key);
    if (found && found.expiresAt > now) {
      this.#found.delete(key);
      this.#found.set(key, found);
      this.#onLookup(true);
      return Promise.resolve(found.value);
    }
    const absentUntil = this.#absent.get(key);
    if (absentUntil !== undefined && absentUntil > now) {
      this.#onLookup(true);
      return Promise.resolve(null);
    }
    this.#onLookup(false);
    const pending = this.#loading.get(key);
    if (pending) return pending;

    let loading: Promise<T | null>;
    if (found) {
      // A key found before is looked up again on its own: a flood of unknown keys cannot delay
      // it. A key found absent before is unknown again: it could be anyone's.
      loading = this.#loadOne(key);
    } else {
      const waiter = Promise.withResolvers<T | null>();
      this.#queue.set(key, waiter);
      loading = waiter.promise;
      this.#scheduleBatch();
    }
    this.#loading.set(key, loading);
    return loading;
  }

  /** How many found values and absences are held, fresh or stale (for tests). */
  get sizes(): { found: number; absent: number } {
    return { found: this.#found.size, absent: this.#absent.size };
  }

  async #loadOne(key: string): Promise<T | null> {
    try {
      const values = await this.#load([key]);
      return this.#settle(key, values.get(key) ?? null);
    } catch (error) {
      this.#loading.delete(key);
      throw error;
    }
  }

  #settle(key: string, value: T | null): T | null {
    this.#loading.delete(key);
    const expiresAt = performance.now() + this.#ttlMs;
    if (value === null) {
      this.#found.delete(key);
      setBounded(this.#absent, key, expiresAt, this.#absentLimit);
    } else {
      this.#absent.delete(key);
      setBounded(this.#found, key, { value, expiresAt }, this.#limit);
    }
    return value;
  }

  #scheduleBatch(): void {
    if (this.#batchRunning || this.#batchTimer !== undefined || this.#queue.size === 0) return;
    const wait = this.#lastBatchAt + this.#batchIntervalMs - performance.now();
    if (wait <= 0) {
      void this.#runBatch();
    } else {
      this.#batchTimer = setTimeout(() => {
        this.#batchTimer = undefined;
        void this.#runBatch();
      }, wait);
    }
  }

  async #runBatch(): Promise<void> {
    const batch = new Map<string, PromiseWithResolvers<T | null>>();
    for (const [key, waiter] of this.#queue) {
      if (batch.size === this.#batchLimit) break;
      batch.set(key, waiter);
    }
    for (const key of batch.keys()) this.#queue.delete(key);
    this.#batchRunning = true;
    this.#lastBatchAt = performance.now();
    try {
      const values = await this.#load([...batch.keys()]);
      for (const [key, waiter] of batch) waiter.resolve(this.#settle(key, values.get(key) ?? null));
    } catch (error) {
      for (const [key, waiter] of batch) {
        this.#loading.delete(key);
        waiter.reject(error);
      }
    } finally {
      this.#batchRunning = false;
      this.#scheduleBatch();
    }
  }
}
