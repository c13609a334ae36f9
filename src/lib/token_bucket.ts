/**
 * A token bucket: `burst` tokens at most, refilled at `perSecond`. The per-tenant rate limit
 * (src/auth/rate_limit.ts) keeps one per tenant; the store A verifier keeps one for certificate
 * chains it has never seen (src/storea/jws.ts).
 *
 * @module
 */

/** Options of {@linkcode TokenBucket}. */
export interface TokenBucketOptions {
  perSecond: number;
  burst: number;
  /** A clock in milliseconds, for tests. Default `performance.now`. */
  now?: () => number;
}

/** One bucket; it starts full. */
export class TokenBucket {
  readonly perSecond: number;
  readonly burst: number;
  #now: () => number;
  #tokens: number;
  #updatedAt: number;

  constructor(options: TokenBucketOptions) {
    this.perSecond = options.perSecond;
    this.burst = options.burst;
    this.#now = options.now ?? (() => performance.now());
    this.#tokens = options.burst;
    this.#updatedAt = this.#now();
  }

  /** Takes a token: 0 when one was there, else the seconds until one will be (none is taken). */
  take(): number {
    const now = this.#now();
    const elapsed = Math.max(0, now - this.#updatedAt) / 1000;
    this.#tokens = Math.min(this.burst, this.#tokens + elapsed * this.perSecond);
    this.#updatedAt = now;
    if (this.#tokens >= 1) {
      this.#tokens -= 1;
      return 0;
    }
    return (1 - this.#tokens) / this.perSecond;
  }
}
