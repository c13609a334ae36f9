/**
 * Coalescing: identical calls in flight at the same time share one execution (identical verify
 * requests share one store call).
 * Nothing is cached; the entry is gone as soon as the call settles.
 */

/** Runs at most one call per key at a time and hands its result to every caller. */
export class SingleFlight {
  #pending = new Map<string, Promise<unknown>>();

  /** The running call for `key`, or a new one made by `call`. */
  run<T>(key: string, call: () => Promise<T>): Promise<T> {
    let pending = this.#pending.get(key) as Promise<T> | undefined;
    if (!pending) {
      pending = call().finally(() => this.#pending.delete(key));
      this.#pending.set(key, pending);
    }
    return pending;
  }

  /** How many distinct calls are in flight. */
  get size(): number {
    return this.#pending.size;
  }
}
