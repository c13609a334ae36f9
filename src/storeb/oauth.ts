/**
 * Store B access tokens (docs/configuration.md, "How the service talks to Google Play"): a service
 * account signs an RS256 assertion and trades it for an access token with the JWT-bearer grant
 * (RFC 7523) at `STOREB_TOKEN_URL`.
 *
 * Not npm:google-auth-library: its gtoken module hard-codes https://oauth2.googleapis.com/token
 * as both the POST target and the assertion's `aud`, so it cannot honour `STOREB_TOKEN_URL` (the
 * simulator, a proxy), and it pulls in gaxios and gcp-metadata for nothing we use.
 */
import { createHash } from "node:crypto";
import { importPKCS8, SignJWT } from "jose";
import { timeoutSignal, untilAborted } from "../lib/abort.ts";
import { googleApiError, parseJsonBody, requestUpstream, UpstreamUnreachable } from "./upstream.ts";
import { objectOrEmpty } from "../lib/json.ts";
import { RelayError } from "../errors.ts";

/** The only scope the service asks for. */
export const ANDROIDPUBLISHER_SCOPE = "https://www.googleapis.com/auth/androidpublisher";
/** Google refuses assertions that live longer than an hour. */
const ASSERTION_LIFETIME_SECONDS = 3600;
/** A cached token is replaced this long before it expires, so none is used as it runs out. */
const REFRESH_MARGIN_MS = 5 * 60_000;
/** Entries per cache; one per service account in use, so this is only a guard. */
const CACHE_LIMIT = 10_000;

/** What the service uses of a service-account JSON file. */
export interface ServiceAccount {
  clientEmail: string;
  /** PKCS#8 PEM of the RSA key. */
  privateKeyPem: string;
  /** Sent as the assertion's `kid` when the file has one. */
  privateKeyId: string | null;
  /** `client_email` plus a hash of the key: a rotated key never reuses the old key's token. */
  cacheKey: string;
}

/** A service-account file that cannot be used; its message never quotes the file. */
export class ServiceAccountError extends RelayError {
  constructor(message: string) {
    super("INVALID_SERVICE_ACCOUNT", message);
  }
}

/** Reads the fields the token grant needs from a service-account JSON text. */
export function parseServiceAccount(json: string): ServiceAccount {
  let file: unknown;
  try {
    file = JSON.parse(json);
  } catch {
    throw new ServiceAccountError("the tenant's service-account file is not JSON");
  }
  const fields = objectOrEmpty(file);
  const { client_email: clientEmail, private_key: privateKeyPem, private_key_id: keyId } = fields;
  if (typeof clientEmail !== "string" || clientEmail === "") {
    throw new ServiceAccountError("the tenant's service-account file has no client_email");
  }
  if (typeof privateKeyPem !== "string" || privateKeyPem === "") {
    throw new ServiceAccountError("the tenant's service-account file has no private_key");
  }
  const keyHash = createHash("sha256").update(privateKeyPem).digest("base64url");
  return {
    clientEmail,
    privateKeyPem,
    privateKeyId: typeof keyId === "string" && keyId !== "" ? keyId : null,
    cacheKey: `${clientEmail} ${keyHash}`,
  };
}

/** Options of {@linkcode AccessTokenSource}. */
export interface AccessTokenSourceOptions {
  /** `STOREB_TOKEN_URL`: where tokens are asked for, and the assertion's `aud`. */
  tokenUrl: string;
  /** How long one token request may take (default 10 s). */
  timeoutMs?: number;
}

/** Options of {@linkcode AccessTokenSource.accessToken}. */
export interface AccessTokenOptions {
  /** The caller stops waiting when this aborts; a shared token request goes on for others. */
  signal?: AbortSignal;
}

/**
 * Access tokens per service account. Caches: each account's token until 5 minutes before it
 * expires, and each imported private key (importing is slow) for the life of the process.
 * Concurrent callers that miss the cache share one token request.
 */
export class AccessTokenSource {
  #tokenUrl: string;
  #timeoutMs: number;
  #tokens = new Map<string, { token: string; refreshAt: number }>();
  #requests = new Map<string, Promise<string>>();
  #keys = new Map<string, Promise<CryptoKey>>();

  constructor(options: AccessTokenSourceOptions) {
    this.#tokenUrl = options.tokenUrl;
    this.#timeoutMs = options.timeoutMs ?? 10_000;
  }

  /** A valid access token for `account`, from the cache or a token request. */
  accessToken(account: ServiceAccount, options: AccessTokenOptions = {}): Promise<string> {
    const cached = this.#tokens.get(account.cacheKey);
    if (cached && cached.refreshAt > performance.now()) return Promise.resolve(cached.token);
    let request = this.#requests.get(account.cacheKey);
    if (!request) {
      request = this.#requestToken(account).finally(() => {
        this.#requests.delete(account.cacheKey);
      });
      // Callers may all have given up by the time it fails; that is not an unhandled error.
      request.catch(() => {});
      this.#requests.set(account.cacheKey, request);
    }
    return options.signal ? untilAborted(request, options.signal) : request;
  }

  /**
   * Drops `rejected` after the API refused it (401). Only that exact token is dropped, so when
   * several calls are refused at once the first one causes a refresh and the others use it.
   */
  invalidate(account: ServiceAccount, rejected: string): void {
    if (this.#tokens.get(account.cacheKey)?.token === rejected) {
      this.#tokens.delete(account.cacheKey);
    }
  }

  async #requestToken(account: ServiceAccount): Promise<string> {
    const assertion = await this.#assertion(account);
    const { signal: deadline, clear } = timeoutSignal(this.#timeoutMs);
    let response;
    try {
      response = await requestUpstream(this.#tokenUrl, {
        method: "POST",
        headers: {
          "content-type": "application/x-www-form-urlencoded",
          accept: "application/json",
        },
        body: new URLSearchParams({
          grant_type: "urn:ietf:params:oauth:grant-type:jwt-bearer",
          assertion,
        }),
      }, deadline);
    } catch (error) {
      if (!(error instanceof UpstreamUnreachable)) throw error;
      const what = error.timedOut
        ? `did not answer within ${this.#timeoutMs} ms`
        : "was unreachable";
      throw googleApiError(`the store B token endpoint ${what}`, {
        status: null,
        upstreamCode: null,
        cause: error,
      });
    } finally {
      clear();
    }
    const body = parseJsonBody(response.text);
    const fields = objectOrEmpty(body);
    if (response.status !== 200) {
      // The OAuth error code (RFC 6749 5.2), e.g. invalid_grant for a refused assertion.
      const upstreamCode = typeof fields.error === "string" ? fields.error : null;
      const refused = response.status === 400 || response.status === 401
        ? ": the assertion was refused (is the key current and the account enabled?)"
        : "";
      throw googleApiError(
        `the store B token endpoint answered HTTP ${response.status}` +
          `${upstreamCode ? ` (${upstreamCode})` : ""}${refused}`,
        { status: response.status, upstreamCode },
      );
    }
    const { access_token: token, expires_in: expiresIn } = fields;
    if (typeof token !== "string" || token === "" || typeof expiresIn !== "number") {
      throw googleApiError("the store B token endpoint answered without an access token", {
        status: response.status,
        upstreamCode: null,
      });
    }
    const refreshAt = performance.now() + expiresIn * 1000 - REFRESH_MARGIN_MS;
    // A token that expires within the margin is used for this call but never cached.
    if (refreshAt > performance.now()) {
      if (this.#tokens.size >= CACHE_LIMIT) this.#tokens.clear();
      this.#tokens.set(account.cacheKey, { token, refreshAt });
    }
    return token;
  }

  async #assertion(account: ServiceAccount): Promise<string> {
    const key = await this.#privateKey(account);
    const issuedAt = Math.floor(Date.now() / 1000);
    return await new SignJWT({ scope: ANDROIDPUBLISHER_SCOPE })
      .setProtectedHeader(
        account.privateKeyId === null
          ? { alg: "RS256", typ: "JWT" }
          : { alg: "RS256", typ: "JWT", kid: account.privateKeyId },
      )
      .setIssuer(account.clientEmail)
      .setAudience(this.#tokenUrl)
      .setIssuedAt(issuedAt)
      .setExpirationTime(issuedAt + ASSERTION_LIFETIME_SECONDS)
      .sign(key);
  }

  #privateKey(account: ServiceAccount): Promise<CryptoKey> {
    let key = this.#keys.get(account.cacheKey);
    if (!key) {
      key = importPKCS8(account.privateKeyPem, "RS256").catch(() => {
        this.#keys.delete(account.cacheKey);
        // jose's message does not quote the key, but say it in our own words anyway.
        throw new ServiceAccountError(
          "the tenant's service-account private_key is not an RSA PKCS#8 key",
        );
      });
      if (this.#keys.size >= CACHE_LIMIT) this.#keys.clear();
      this.#keys.set(account.cacheKey, key);
    }
    return key;
  }
}
