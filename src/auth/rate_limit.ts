/**
 * The per-tenant token bucket (docs/configuration.md, "Rate limiting"): refill
 * `RATE_LIMIT_PER_SECOND`, capacity `RATE_LIMIT_BURST`, per process.
 */
import { rateLimited } from "../errors.ts";
import { TokenBucket, type TokenBucketOptions } from "../lib/token_bucket.ts";

/** Options of {@linkcode RateLimiter}. */
export type RateLimiterOptions = TokenBucketOptions;

/** Token buckets, one per tenant. */
export class RateLimiter {
  #options: RateLimiterOptions;
  #buckets = new Map<string, TokenBucket>();

  constructor(options: RateLimiterOptions) {
    this.#options = options;
  }

  /** Takes one token for `tenantId`, or throws 429 `RATE_LIMITED` with the wait in seconds. */
  take(tenantId: string): void {
    let bucket = this.#buckets.get(tenantId);
    if (!bucket) {
      bucket = new TokenBucket(this.#options);
      this.#buckets.set(tenantId, bucket);
    }
    const wait = bucket.take();
    if (wait === 0) return;
    throw rateLimited(`rate limit of ${bucket.perSecond} requests per second exceeded`, wait);
  }
}
