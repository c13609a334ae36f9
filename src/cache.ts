/**
 * A small time-limited cache with single-flight loading: concurrent misses for one key share a
 * load, and a failed load is not cached.
 */

/** Caches values by string key for `ttlMs`. */
export class TtlCache<T> {
  #ttlMs: number;
  #limit: number;
  #entries = new Map<string, { value: T; expiresAt: number }>();
  #loading = new Map<string, Promise<T>>();

  constructor(ttlMs: number, limit = 10_000) {
    this.#ttlMs = ttlMs;
    this.#limit = limit;
  }

  /** The cached value for `key`, or the result of `load` (shared by concurrent callers). */
  get(key: string, load: () => Promise<T>): Promise<T> {
    const entry = this.#entries.get(key);
    if (entry && entry.expiresAt > performance.now()) return Promise.resolve(entry.value);
    let pending = this.#loading.get(key);
    if (!pending) {
      pending = load().then((value) => {
        if (this.#entries.size >= this.#limit) this.#entries.clear();
        this.#entries.set(key, { value, expiresAt: performance.now() + this.#ttlMs });
        return value;
      }).finally(() => this.#loading.delete(key));
      this.#loading.set(key, pending);
    }
    return pending;
  }
}
