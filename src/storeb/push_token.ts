/**
 * Store B push tokens: Cloud Pub/Sub push sends every Real-time developer notification with a
 * Google-signed OIDC ID token in `Authorization: Bearer`. A token is accepted when all of these
 * hold:
 *
 * - it is an RS256 JWS whose signature verifies with the key its `kid` names in Google's JWKS
 *   (`STOREB_OIDC_CERTS_URL`);
 * - `exp` has not passed and neither `nbf` nor `iat` lies ahead, give or take the clock tolerance;
 * - `iss` is one of `STOREB_OIDC_ISSUERS` and `email_verified` is exactly `true`;
 * - `aud` is the tenant's push audience and `email` is the tenant's push service account
 *   (compared case-insensitively, as email domains are).
 *
 * The signature only proves that Google minted the token. Any Google Cloud project can create a
 * push subscription pointing at our endpoint with the same audience (the endpoint URL, usually),
 * so the audience ties nothing to the tenant: `email`, the service account that only the
 * tenant's own project can make Pub/Sub sign as, is the check that authenticates the sender.
 * Google's own libraries skip `aud` when none is given and never look at `email`: both checks are
 * made here.
 *
 * Failures (docs/relay.md, "How a notification is received"): a token that is absent,
 * malformed, out of its lifetime or from the wrong issuer is `UNAUTHENTICATED`; one signed with a
 * key Google does not publish, or minted for another audience or account, is `SIGNATURE_INVALID`. A
 * JWKS that cannot be loaded while no key is cached is a plain `Error` (a 500), so Pub/Sub retries
 * the delivery later rather than dropping it.
 *
 * Tokens come from anyone, so the JWKS cache is shaped for a hostile sender: a `kid` is only ever
 * looked up, never stored; an unknown one triggers at most one fetch per cooldown, shared by every
 * verification waiting on it; and an answer that is too big, holds too many keys or keys of an
 * unusual size is refused whole, keeping the keys already held.
 *
 * @module
 */
import { decodeJwt, decodeProtectedHeader, errors, importJWK, type JWK, jwtVerify } from "jose";
import { ServiceError } from "../errors.ts";
import { readStreamPrefix } from "../lib/streams.ts";
import { recordCacheLookup } from "../observability/telemetry.ts";

/** How a {@linkcode PushTokenVerifier} finds Google's keys and judges time. */
export interface PushTokenVerifierOptions {
  /** URL of the issuer's JWKS (`STOREB_OIDC_CERTS_URL`). */
  certsUrl: string;
  /** Accepted `iss` values (`STOREB_OIDC_ISSUERS`). */
  issuers: string[];
  /** Slack allowed on `exp`, `nbf` and `iat`, in seconds. Default 30. */
  clockToleranceSeconds?: number;
  /**
   * Minimum time between two JWKS fetches made outside the regular expiry: for a token whose
   * `kid` is unknown, or after a failed fetch (with or without keys cached). Default 30 000 ms.
   */
  refetchCooldownMs?: number;
  /** How long one JWKS fetch may take. Default 5 000 ms. */
  fetchTimeoutMs?: number;
  /** The clock in epoch milliseconds, for tests. Default `Date.now`. */
  now?: () => number;
}

/** What the tenant's configuration expects of a push token. */
export interface PushTokenExpectation {
  /** The tenant's configured push audience; `aud` must equal it. */
  audience: string;
  /** The tenant's configured push service account; `email` must equal it, ignoring case. */
  serviceAccountEmail: string;
}

/** The claims of a push token that passed every check. */
export interface PushTokenClaims {
  iss: string;
  aud: string;
  /** The service account Pub/Sub signed the token for. */
  email: string;
  sub?: string;
  /** Expiry, epoch seconds. */
  exp: number;
  /** Issue time, epoch seconds. */
  iat?: number;
}

const DEFAULT_CACHE_LIFETIME_MS = 3_600_000;
const MIN_CACHE_LIFETIME_MS = 60_000;
const MAX_CACHE_LIFETIME_MS = 86_400_000;
/** A longer JWKS answer is refused, and no more of it is read: Google's is about 2 KB. */
export const MAX_JWKS_BYTES = 64 * 1024;
/** An answer with more usable keys than this is refused: Google publishes two or three. */
export const MAX_JWKS_KEYS = 16;
/** RSA modulus sizes accepted, in bits: Google's are 2048; a huge one makes every check slow. */
const MODULUS_BITS = { min: 2048, max: 4096 };
/** The public exponent's size, in bits (Google's is 65537, 17 bits); a huge one is as slow. */
const MAX_EXPONENT_BITS = 32;

/** RFC 6750 `Bearer b64token`; the scheme is case-insensitive (RFC 7235). */
const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i;

/** The keys of one JWKS answer. */
interface KeySet {
  keys: Map<string, CryptoKey>;
  expiresAt: number;
}

/**
 * Verifies push tokens against one issuer's JWKS. Make one per process and share it: it holds the
 * key cache.
 */
export class PushTokenVerifier {
  readonly #certsUrl: string;
  readonly #issuers: string[];
  readonly #toleranceSeconds: number;
  readonly #cooldownMs: number;
  readonly #fetchTimeoutMs: number;
  readonly #now: () => number;
  /**
   * The cache: the RS256 public keys of the last good JWKS answer, by `kid`. They are kept for
   * the answer's `Cache-Control: max-age` (one hour without it, clamped to 60 s - 24 h), then
   * fetched again. A failed refetch keeps the old keys, because answering 500 to every push while
   * Google's endpoint hiccups is worse than trusting keys it published minutes ago.
   */
  #keySet: KeySet | null = null;
  /** When the last fetch started, good or not, for the cooldown. */
  #lastFetchAt = Number.NEGATIVE_INFINITY;
  /** The fetch in progress, shared by every verification that needs it. */
  #fetching: Promise<void> | null = null;

  constructor(options: PushTokenVerifierOptions) {
    this.#certsUrl = options.certsUrl;
    this.#issuers = options.issuers;
    this.#toleranceSeconds = options.clockToleranceSeconds ?? 30;
    this.#cooldownMs = options.refetchCooldownMs ?? 30_000;
    this.#fetchTimeoutMs = options.fetchTimeoutMs ?? 5_000;
    this.#now = options.now ?? Date.now;
  }

  /**
   * Verifies the token in `authorization` (the raw `Authorization` header, or null) for the
   * tenant described by `expected`. Throws `ServiceError` `UNAUTHENTICATED` or `SIGNATURE_INVALID`
   * when the token is refused, and a plain `Error` when Google's keys cannot be loaded.
   */
  async verify(
    authorization: string | null,
    expected: PushTokenExpectation,
  ): Promise<PushTokenClaims> {
    const token = bearerToken(authorization);
    const kid = readKeyId(token);
    const key = await this.#keyFor(kid);
    if (key === undefined) throw signatureInvalid("token key id is not in the issuer's JWKS");

    let payload;
    try {
      ({ payload } = await jwtVerify(token, key, {
        algorithms: ["RS256"],
        clockTolerance: this.#toleranceSeconds,
        currentDate: new Date(this.#now()),
        requiredClaims: ["exp"],
      }));
    } catch (error) {
      throw refusal(error);
    }

    // jose judges `iat` only against a maximum age; a token from the future is not yet valid.
    const nowSeconds = this.#now() / 1000;
    if (typeof payload.iat === "number" && payload.iat > nowSeconds + this.#toleranceSeconds) {
      throw unauthenticated("token is not yet valid");
    }
    const { iss, aud, email, sub, exp, iat } = payload;
    if (typeof iss !== "string" || !this.#issuers.includes(iss)) {
      throw unauthenticated("token issuer is not accepted");
    }
    if (payload.email_verified !== true) throw unauthenticated("token email is not verified");
    if (typeof email !== "string") throw unauthenticated("token has no email");
    if (aud !== expected.audience) {
      throw signatureInvalid("token audience is not the tenant's push audience");
    }
    if (email.toLowerCase() !== expected.serviceAccountEmail.toLowerCase()) {
      throw signatureInvalid("token email is not the tenant's push service account");
    }
    return {
      iss,
      aud,
      email,
      exp: exp as number,
      ...(typeof sub === "string" ? { sub } : {}),
      ...(typeof iat === "number" ? { iat } : {}),
    };
  }

  /**
   * The key named `kid`. Loads the JWKS when nothing is cached (a failure throws), refreshes it
   * when stale, and looks once more for a `kid` it does not know, since Google may have rotated.
   */
  async #keyFor(kid: string): Promise<CryptoKey | undefined> {
    const fresh = this.#keySet !== null && this.#now() < this.#keySet.expiresAt &&
      this.#keySet.keys.has(kid);
    recordCacheLookup("storeb_jwks", fresh);
    if (this.#keySet === null) {
      // With nothing cached every kid is unknown: after a failed load, the cooldown holds too.
      if (this.#inCooldown()) throw new Error("push token JWKS failed to load; retrying later");
      await this.#fetch();
    } else if (this.#now() >= this.#keySet.expiresAt) {
      await this.#refetch();
    }
    const key = this.#keySet!.keys.get(kid);
    if (key !== undefined) return key;
    await this.#refetch();
    return this.#keySet!.keys.get(kid);
  }

  /**
   * Fetches again unless the last fetch is more recent than the cooldown, so neither a storm of
   * unknown-kid tokens nor an unreachable JWKS makes every verification wait on Google. A
   * failure keeps the cached keys.
   */
  async #refetch(): Promise<void> {
    if (this.#inCooldown()) return;
    try {
      await this.#fetch();
    } catch {
      // Keep the cached keys (see #keySet).
    }
  }

  /** Whether no fetch is in progress and the last one started within the cooldown. */
  #inCooldown(): boolean {
    return this.#fetching === null && this.#now() - this.#lastFetchAt < this.#cooldownMs;
  }

  /** Joins the fetch in progress or starts one. */
  #fetch(): Promise<void> {
    if (this.#fetching === null) {
      this.#lastFetchAt = this.#now();
      this.#fetching = this.#load().finally(() => {
        this.#fetching = null;
      });
    }
    return this.#fetching;
  }

  async #load(): Promise<void> {
    const startedAt = this.#now();
    let response: Response;
    try {
      response = await fetch(this.#certsUrl, {
        headers: { accept: "application/json" },
        signal: AbortSignal.timeout(this.#fetchTimeoutMs),
      });
    } catch (error) {
      throw new Error("push token JWKS could not be fetched", { cause: error });
    }
    if (!response.ok) {
      await response.body?.cancel();
      throw new Error(`push token JWKS answered HTTP ${response.status}`);
    }
    const body = await readJwksBody(response);
    const keys = await importRs256Keys(body);
    if (keys.size === 0) throw new Error("push token JWKS has no usable RS256 key");
    this.#keySet = {
      keys,
      expiresAt: startedAt + cacheLifetimeMs(response.headers.get("cache-control")),
    };
  }
}

/**
 * The token of a `Bearer` Authorization header. Throws `ServiceError` `UNAUTHENTICATED` when the
 * header is missing or is not `Bearer <token>`.
 */
export function bearerToken(authorization: string | null): string {
  if (authorization === null || authorization.trim() === "") {
    throw unauthenticated("Authorization header is missing");
  }
  const token = BEARER.exec(authorization)?.[1];
  if (token === undefined) throw unauthenticated("Authorization header is not a Bearer token");
  return token;
}

/** The `kid` of an RS256 compact JWS whose header and payload decode. */
function readKeyId(token: string): string {
  let header;
  try {
    if (token.split(".").length !== 3) throw new TypeError("not a compact JWS");
    header = decodeProtectedHeader(token);
    decodeJwt(token);
  } catch {
    throw unauthenticated("token is not a decodable JWT");
  }
  if (header.alg !== "RS256") throw unauthenticated("token alg is not RS256");
  // Google always names its key; without a kid no published key can be chosen.
  if (typeof header.kid !== "string") throw signatureInvalid("token has no key id");
  return header.kid;
}

/**
 * The JSON of a JWKS answer of at most {@linkcode MAX_JWKS_BYTES}; reading stops at the limit, so
 * a huge or endless answer costs no more memory than that (and no longer than the fetch timeout).
 */
async function readJwksBody(response: Response): Promise<unknown> {
  const declared = Number(response.headers.get("content-length") ?? NaN);
  if (declared > MAX_JWKS_BYTES) {
    await response.body?.cancel();
    throw new Error(`push token JWKS answer exceeds ${MAX_JWKS_BYTES} bytes`);
  }
  let read;
  try {
    read = await readStreamPrefix(response.body, MAX_JWKS_BYTES);
  } catch (error) {
    throw new Error("push token JWKS answer could not be read", { cause: error });
  }
  if (read.exceeded) throw new Error(`push token JWKS answer exceeds ${MAX_JWKS_BYTES} bytes`);
  try {
    return JSON.parse(new TextDecoder().decode(read.bytes));
  } catch (error) {
    throw new Error("push token JWKS is not JSON", { cause: error });
  }
}

/**
 * The usable keys of a JWKS, by `kid`; an entry that is not an RSA signing key of a usual size is
 * skipped. More than {@linkcode MAX_JWKS_KEYS} usable keys refuses the answer whole, before any
 * is imported.
 */
async function importRs256Keys(body: unknown): Promise<Map<string, CryptoKey>> {
  const list = (body as { keys?: unknown } | null)?.keys;
  if (!Array.isArray(list)) throw new Error("push token JWKS has no keys array");
  const usable = (list as unknown[]).filter(isUsableRs256Key);
  if (usable.length > MAX_JWKS_KEYS) {
    throw new Error(`push token JWKS has more than ${MAX_JWKS_KEYS} keys`);
  }
  const keys = new Map<string, CryptoKey>();
  for (const jwk of usable) {
    try {
      keys.set(jwk.kid, await importJWK(jwk, "RS256") as CryptoKey);
    } catch {
      // A malformed entry must not hide the good ones.
    }
  }
  return keys;
}

/** Whether a JWKS entry is an RSA signing key for RS256 with a modulus and exponent we accept. */
function isUsableRs256Key(entry: unknown): entry is JWK & { kid: string } {
  if (typeof entry !== "object" || entry === null) return false;
  const jwk = entry as JWK;
  if (
    jwk.kty !== "RSA" || typeof jwk.kid !== "string" || typeof jwk.n !== "string" ||
    typeof jwk.e !== "string" || (jwk.use !== undefined && jwk.use !== "sig") ||
    (jwk.alg !== undefined && jwk.alg !== "RS256")
  ) return false;
  const modulusBits = bitLength(jwk.n);
  const exponentBits = bitLength(jwk.e);
  return modulusBits >= MODULUS_BITS.min && modulusBits <= MODULUS_BITS.max &&
    exponentBits >= 2 && exponentBits <= MAX_EXPONENT_BITS;
}

/** The bit length of the unsigned big-endian integer in `base64url`; 0 when it does not decode. */
function bitLength(base64url: string): number {
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.fromBase64(base64url, { alphabet: "base64url" });
  } catch {
    return 0;
  }
  const first = bytes.findIndex((byte) => byte !== 0);
  if (first === -1) return 0;
  return (bytes.length - first - 1) * 8 + (32 - Math.clz32(bytes[first]));
}

/** `max-age` of a Cache-Control value in ms: one hour when absent, clamped to 60 s - 24 h. */
function cacheLifetimeMs(cacheControl: string | null): number {
  const maxAge = /(?:^|[,\s])max-age\s*=\s*"?(\d+)"?/i.exec(cacheControl ?? "")?.[1];
  const lifetime = maxAge === undefined ? DEFAULT_CACHE_LIFETIME_MS : Number(maxAge) * 1000;
  return Math.min(MAX_CACHE_LIFETIME_MS, Math.max(MIN_CACHE_LIFETIME_MS, lifetime));
}

/** The `ServiceError` for a token jose refused; anything that is not jose's is rethrown. */
function refusal(error: unknown): unknown {
  if (error instanceof errors.JWSSignatureVerificationFailed) {
    return signatureInvalid("token signature does not verify");
  }
  if (error instanceof errors.JWTExpired) return unauthenticated("token has expired");
  if (error instanceof errors.JWTClaimValidationFailed) {
    return unauthenticated(
      error.claim === "nbf" ? "token is not yet valid" : `token claim ${error.claim} is invalid`,
    );
  }
  if (error instanceof errors.JOSEError) return unauthenticated("token is not a valid JWT");
  return error;
}

function unauthenticated(message: string): ServiceError {
  return new ServiceError("UNAUTHENTICATED", message);
}

function signatureInvalid(message: string): ServiceError {
  return new ServiceError("SIGNATURE_INVALID", message);
}
