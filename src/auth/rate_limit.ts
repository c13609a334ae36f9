/**
 * The per-tenant token bucket (docs/operations.md, "Rate limiting"): refill
 * `RATE_LIMIT_PER_SECOND`, capacity `RATE_LIMIT_BURST`, per process.
 */
import { rateLimited } from "../errors.ts";

interface Bucket {
  tokens: number;
  updatedAt: number;
}

/** Options of {@linkcode RateLimiter}. */
export interface RateLimiterOptions {
  perSecond: number;
  burst: number;
  /** A clock in milliseconds, for tests. */
  now?: () => number;
}

/** Token buckets, one per tenant. */
export class RateLimiter {
  #perSecond: number;
  #burst: number;
  #now: () => number;
  #buckets = new Map<string, Bucket>();

  constructor(options: RateLimiterOptions) {
    this.#perSecond = options.perSecond;
    this.#burst = options.burst;
    this.#now = options.now ?? (() => performance.now());
  }

  /** Takes one token for `tenantId`, or throws 429 `RATE_LIMITED` with the wait in seconds. */
  take(tenantId: string): void {
    const now = this.#now();
    let bucket = this.#buckets.get(tenantId);
    if (!bucket) {
      bucket = { tokens: this.#burst, updatedAt: now };
      this.#buckets.set(tenantId, bucket);
    }
    const elapsed = Math.max(0, now - bucket.updatedAt) / 1000;
    bucket.tokens = Math.min(this.#burst, bucket.tokens + elapsed * this.#perSecond);
    bucket.updatedAt = now;
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return;
    }
    throw rateLimited(
      `rate limit of ${this.#perSecond} requests per second exceeded`,
      (1 - bucket.tokens) / this.#perSecond,
    );
  }
}
