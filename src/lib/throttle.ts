/**
 * Lets one event per key through per interval: for log lines that a sender can repeat at will, so
 * that a flood of requests cannot turn into a flood of lines.
 *
 * @module
 */

/** Options of {@linkcode Throttle}. */
export interface ThrottleOptions {
  /** How long a key stays closed after an event got through, in ms. */
  intervalMs: number;
  /** How many keys are remembered; past that, the oldest are forgotten. Default 10 000. */
  maxKeys?: number;
  /** The clock in epoch milliseconds, for tests. Default `Date.now`. */
  now?: () => number;
}

/**
 * One event per key per interval. Holds at most `maxKeys` keys: when full, the keys whose
 * interval has passed are dropped, then, if it is still full, the oldest ones; a forgotten key
 * lets its next event through early, which is the safe side for a log line.
 */
export class Throttle {
  readonly #intervalMs: number;
  readonly #maxKeys: number;
  readonly #now: () => number;
  /** When each key last let an event through; insertion order is that time's order. */
  readonly #passedAt = new Map<string, number>();

  constructor(options: ThrottleOptions) {
    this.#intervalMs = options.intervalMs;
    this.#maxKeys = options.maxKeys ?? 10_000;
    this.#now = options.now ?? Date.now;
  }

  /** Whether an event for `key` may go through now; if so, the key closes for the interval. */
  allow(key: string): boolean {
    const now = this.#now();
    const last = this.#passedAt.get(key);
    if (last !== undefined && now - last < this.#intervalMs) return false;
    this.#passedAt.delete(key);
    if (this.#passedAt.size >= this.#maxKeys) this.#forget(now);
    this.#passedAt.set(key, now);
    return true;
  }

  /** How many keys are remembered. */
  get size(): number {
    return this.#passedAt.size;
  }

  /** Drops the keys whose interval has passed, and the oldest until there is room for one. */
  #forget(now: number): void {
    for (const [key, at] of this.#passedAt) {
      if (now - at >= this.#intervalMs || this.#passedAt.size >= this.#maxKeys) {
        this.#passedAt.delete(key);
      } else {
        break;
      }
    }
  }
}
