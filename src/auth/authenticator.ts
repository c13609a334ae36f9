/**
 * Authenticates API keys on the request path without waiting on database writes.
 *
 * Cache: the owner of a key hash (or its absence) is kept for {@linkcode KEY_CACHE_TTL_MS}, so a
 * revocation or a deactivation is refused by every replica within a second. Anyone can send a
 * well-formed key, so the cache is a {@linkcode LookupCache}: owners in a bounded LRU that misses
 * cannot evict, misses in a bounded negative cache, and hashes never seen looked up in shared
 * batches, so a flood of random keys costs a bounded number of queries per second. Concurrent
 * lookups of one hash share a query. `lastUsedAt` is collected in memory and written in batches.
 */
import { ServiceError } from "../errors.ts";
import { findKeyOwners, type KeyOwner, recordKeyUse } from "../db/api_keys.ts";
import type { Sql } from "../db/connect.ts";
import { LookupCache } from "../lib/cache.ts";
import { recordCacheLookup } from "../observability/telemetry.ts";
import { hashApiKey, parseBearerKey } from "./api_key.ts";

/** Below one second, leaving room for the lookup itself: a revoked key is refused within 1 s. */
export const KEY_CACHE_TTL_MS = 750;
const USE_FLUSH_INTERVAL_MS = 5_000;

/** Options of {@linkcode Authenticator}. */
export interface AuthenticatorOptions {
  /** Called when a batch of `lastUsedAt` updates fails; the batch is retried next time. */
  onFlushError?: (error: unknown) => void;
}

/** Resolves `Authorization` headers to the tenant and key they belong to. */
export class Authenticator {
  #sql: Sql;
  #owners: LookupCache<KeyOwner>;
  #uses = new Map<string, Date>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #onFlushError: (error: unknown) => void;

  constructor(sql: Sql, options: AuthenticatorOptions = {}) {
    this.#sql = sql;
    this.#owners = new LookupCache((hashes) => findKeyOwners(sql, hashes), {
      ttlMs: KEY_CACHE_TTL_MS,
      onLookup: (hit) => recordCacheLookup("api_keys", hit),
    });
    this.#onFlushError = options.onFlushError ?? (() => {});
  }

  /** Starts the background writer of `lastUsedAt`. */
  start(): void {
    this.#timer = setInterval(() => void this.flushUses(), USE_FLUSH_INTERVAL_MS);
  }

  /** Stops the background writer and writes what is pending. */
  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.flushUses();
  }

  /** The key's owner; throws 401 `UNAUTHENTICATED` for a missing, malformed, unknown or revoked key. */
  async authenticate(authorization: string | null): Promise<KeyOwner> {
    const token = parseBearerKey(authorization);
    if (token === null) {
      throw new ServiceError(
        "UNAUTHENTICATED",
        authorization === null
          ? "missing Authorization header"
          : "the Authorization header does not hold a valid API key",
      );
    }
    const hash = hashApiKey(token);
    const owner = await this.#owners.get(hash);
    if (owner === null) throw new ServiceError("UNAUTHENTICATED", "unknown or revoked API key");
    this.#uses.set(owner.keyId, new Date());
    return owner;
  }

  /** Writes the collected `lastUsedAt` times in one statement. */
  async flushUses(): Promise<void> {
    if (this.#uses.size === 0) return;
    const batch = this.#uses;
    this.#uses = new Map();
    try {
      await recordKeyUse(this.#sql, batch);
    } catch (error) {
      for (const [id, at] of batch) if (!this.#uses.has(id)) this.#uses.set(id, at);
      this.#onFlushError(error);
    }
  }
}
