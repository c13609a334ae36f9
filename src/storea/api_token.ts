/**
 * The bearer token of the App Store Server API (docs/configuration.md, "How the service talks to the
 * App Store"): an ES256 JWT signed with the tenant's In-App Purchase key. Signing costs an ECDSA
 * signature, so a token is reused for most of its lifetime.
 */
import { importPKCS8, SignJWT } from "jose";
import { createHash } from "node:crypto";
import type { StoreaCredentials } from "./credentials.ts";

/** Apple refuses tokens that live longer than 60 minutes. */
const TOKEN_LIFETIME_S = 60 * 60;
/** `iat` is set this far back so a server clock slightly ahead of Apple's is not refused. */
const CLOCK_SKEW_S = 5;
/** A cached token is replaced when less than this much of its life is left. */
const RENEW_BEFORE_S = 10 * 60;
/** Tokens kept at most; one per tenant key in practice. */
const CACHE_LIMIT = 10_000;

interface CachedToken {
  token: string;
  /** Epoch seconds after which the token is not handed out any more. */
  renewAt: number;
}

/** Signs and caches App Store Server API tokens, one per tenant key. */
export class StoreaTokenSigner {
  #tokens = new Map<string, CachedToken>();
  #keys = new Map<string, Promise<CryptoKey>>();
  #identities = new WeakMap<StoreaCredentials, { cacheKey: string; keyHash: string }>();
  #now: () => number;

  constructor(options: { now?: () => number } = {}) {
    this.#now = options.now ?? Date.now;
  }

  /** A valid bearer token for `credentials`. */
  async tokenFor(credentials: StoreaCredentials): Promise<string> {
    const { cacheKey, keyHash } = this.#identify(credentials);
    const now = Math.floor(this.#now() / 1000);
    const cached = this.#tokens.get(cacheKey);
    if (cached && cached.renewAt > now) return cached.token;

    const key = await this.#importKey(keyHash, credentials.privateKeyPem);
    const issuedAt = now - CLOCK_SKEW_S;
    const token = await new SignJWT({ bid: credentials.bundleId })
      .setProtectedHeader({ alg: "ES256", kid: credentials.keyId, typ: "JWT" })
      .setIssuer(credentials.issuerId)
      .setIssuedAt(issuedAt)
      .setExpirationTime(issuedAt + TOKEN_LIFETIME_S)
      .setAudience("appstoreconnect-v1")
      .sign(key);
    if (this.#tokens.size >= CACHE_LIMIT) this.#tokens.clear();
    this.#tokens.set(cacheKey, { token, renewAt: issuedAt + TOKEN_LIFETIME_S - RENEW_BEFORE_S });
    return token;
  }

  /**
   * The cache keys of `credentials`, computed once per credentials object: the verify path
   * reuses one object until its tenant's credentials are loaded again, so the key is not
   * hashed on every request.
   */
  #identify(credentials: StoreaCredentials): { cacheKey: string; keyHash: string } {
    let identity = this.#identities.get(credentials);
    if (!identity) {
      const keyHash = createHash("sha256").update(credentials.privateKeyPem).digest("base64");
      identity = {
        keyHash,
        cacheKey:
          `${credentials.issuerId}\0${credentials.keyId}\0${credentials.bundleId}\0${keyHash}`,
      };
      this.#identities.set(credentials, identity);
    }
    return identity;
  }

  #importKey(keyHash: string, pem: string): Promise<CryptoKey> {
    let key = this.#keys.get(keyHash);
    if (!key) {
      key = importPKCS8(pem, "ES256");
      key.catch(() => this.#keys.delete(keyHash));
      if (this.#keys.size >= CACHE_LIMIT) this.#keys.clear();
      this.#keys.set(keyHash, key);
    }
    return key;
  }
}
