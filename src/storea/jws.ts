/**
 * Store A signed data: one verifier for every JWS the App Store signs, whether it arrives in a
 * verify response (`signedTransactionInfo`) or a notification (`signedPayload` and its nested
 * `signedTransactionInfo` / `signedRenewalInfo`).
 *
 * A JWS carries its certificate chain in `x5c`: leaf, intermediate, root. Anyone can post one to
 * a receiver, so a refusal must cost the service less than the JWS cost its sender, and the checks
 * run cheapest first (docs/architecture.md, "The certificate chain check"):
 *
 * 1. a header seen before with a chain that verified: one ES256 check with the cached leaf key,
 *    the payload's decoding and a time check; the header is neither decoded nor hashed again;
 * 2. otherwise the header is decoded, each certificate strictly (canonical base64, size-capped, so
 *    one certificate has one spelling), and the chain is known by the digest of its certificates:
 *    a chain refused before is refused at once, a chain verified before costs its ES256 check;
 * 3. a chain never seen, from anyone (a receiver), spends a token of a small budget, and is
 *    refused before any cryptography when none is left ({@linkcode UnseenChainBudgetError}). A
 *    store's genuine chains are few and stay cached once verified, so the budget never refuses
 *    them; JWS read from the store's own API (verify answers, recovery) spend none;
 * 4. the leaf's ES256 signature of the JWS, then the leaf's certificate against an intermediate
 *    already verified up to a trusted root (its key kept, in a bounded cache filled only after that
 *    check): names, marker, then one native ECDSA check. Only an intermediate never seen is itself
 *    checked against the roots.
 *
 * Verified chains are cached by header text and by digest, refused chains by digest, all bounded.
 * A JWS whose signature fails caches nothing: anyone can put a genuine chain under garbage.
 */
import { createHash } from "node:crypto";
import { decodeUtf8Strict, isJsonObject } from "../lib/json.ts";
import {
  type EcdsaVerifyingKey,
  type Es256Engine,
  type Es256VerifyingKey,
  importEcdsaKey,
  importEs256Key,
} from "../crypto/es256.ts";
import {
  type Certificate,
  CertificateError,
  isCertificateAuthority,
  readCertificate,
  sameBytes,
} from "../crypto/x509.ts";
import { RelayError } from "../errors.ts";
import { recordCacheLookup } from "../observability/telemetry.ts";
import { setBounded } from "../lib/cache.ts";
import { TokenBucket } from "../lib/token_bucket.ts";

/** SHA-256 of Apple Root CA - G3, the built-in trust anchor. */
export const APPLE_ROOT_CA_G3_SHA256 =
  "63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179";

/** Largest certificate accepted in `x5c`, in DER bytes; Apple's are under 1.5 KB. */
export const MAX_CERTIFICATE_BYTES = 8 * 1024;
/** The base64 length of a certificate of {@linkcode MAX_CERTIFICATE_BYTES}. */
const MAX_CERTIFICATE_CHARS = Math.ceil(MAX_CERTIFICATE_BYTES / 3) * 4;
/**
 * Longest protected header accepted, in base64url characters: room for three certificates at
 * the cap (base64 inside JSON inside base64url) and `alg`. Apple's are about 7,000.
 */
export const MAX_HEADER_CHARS = 48 * 1024;
/** Apple's marker extension on the certificate that signs App Store data. */
const LEAF_MARKER_OID = "1.2.840.113635.100.6.11.1";
/** Apple's marker extension on the Worldwide Developer Relations intermediate. */
const INTERMEDIATE_MARKER_OID = "1.2.840.113635.100.6.2.1";
/** Certificate validity is judged at `signedDate`, give or take this much clock skew. */
const VALIDITY_TOLERANCE_MS = 60_000;
/**
 * How many verified chains are remembered; Apple rotates its leaf about once a year. Each entry
 * is a header's text (Apple's are about 7 KB, MAX_HEADER_CHARS at most), a key and two dates, so
 * this bounds the cache's bytes too: 1.5 MB at most. The same bound holds chains by digest.
 */
export const CHAIN_CACHE_LIMIT = 32;
/** How many intermediates verified up to a trusted root are remembered, with their keys. */
export const INTERMEDIATE_CACHE_LIMIT = 8;
/**
 * How many refused chains are remembered (a digest and a reason each): a refusal depends on the
 * chain and the trusted roots alone, which do not change while the process runs.
 */
export const REFUSED_CHAIN_LIMIT = 1_024;
/**
 * Chains never seen before that JWS from anyone may bring, per second and at once
 * (docs/security.md, "Forged certificate chains"). A genuine one is checked once per process
 * and then cached; past the budget an unseen chain is refused before any cryptography.
 */
export const UNSEEN_CHAIN_BUDGET = { perSecond: 2, burst: 10 } as const;
const CERTIFICATE_ROLES = ["leaf", "intermediate", "root"] as const;

const encoder = new TextEncoder();

/** A JWS that does not verify; `reason` says why, for logs (never the JWS itself). */
export class JwsInvalidError extends RelayError {
  constructor(reason: string) {
    super("SIGNATURE_INVALID", reason);
  }
}

/**
 * A JWS from anyone whose certificate chain was never seen, refused unchecked because the
 * budget of such chains is spent; it may be sent again after `retryAfterSeconds`.
 */
export class UnseenChainBudgetError extends RelayError {
  readonly retryAfterSeconds: number;

  constructor(retryAfterSeconds: number) {
    super(
      "RATE_LIMITED",
      "too many notifications signed by certificate chains this service has not verified yet; " +
        "retry later",
    );
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

/** What the verifier trusts. */
export interface StoreaJwsVerifierOptions {
  /**
   * DER certificates to trust as roots instead of the built-in pin (`STOREA_ROOT_CERTS`).
   * Empty or absent keeps the pin of Apple Root CA - G3.
   */
  rootCertificates?: Uint8Array[];
  /** The clock, for tests; used only when a payload has no `signedDate`. */
  now?: () => number;
  /** What checks the ES256 signatures (`selectEs256Engine`); WebCrypto when absent. */
  engine?: Es256Engine;
  /** The budget of unseen chains from anyone; {@linkcode UNSEEN_CHAIN_BUDGET} when absent. */
  unseenChainBudget?: { perSecond: number; burst: number; now?: () => number };
}

/** Where a JWS came from, which decides what its chain may cost. */
export interface JwsVerifyOptions {
  /**
   * `anyone` (the default): posted to a receiver, so an unseen chain spends the budget. `store`:
   * read from the store's own API over TLS with the tenant's credentials, or nested in a JWS
   * that verified: only the store could have sent it.
   */
  from?: "anyone" | "store";
}

/** A chain that verified, reduced to what each JWS needs. */
interface VerifiedChain {
  leafKey: Es256VerifyingKey;
  /** The window in which every certificate of the chain is valid, epoch ms. */
  notBefore: number;
  notAfter: number;
}

/** An intermediate that verified against a trusted root, reduced to what a leaf check needs. */
interface TrustedIntermediate {
  subject: Uint8Array;
  key: EcdsaVerifyingKey;
  /** The window in which the intermediate and its root are both valid, epoch ms. */
  notBefore: number;
  notAfter: number;
}

/** A trusted root, read once. */
interface Anchor {
  certificate: Certificate;
  key: () => Promise<EcdsaVerifyingKey>;
}

/** Verifies store A JWS strings and returns their payloads. */
export class StoreaJwsVerifier {
  #roots: Anchor[];
  #now: () => number;
  #engine: Es256Engine;
  #budget: TokenBucket;
  /**
   * Verified chains by the text of the header that carried them; insertion order is recency order
   * (a hit moves to the end).
   */
  #chains = new Map<string, VerifiedChain>();
  /** Verified chains by digest, for a header spelled anew around a known chain. */
  #chainsByDigest = new Map<string, VerifiedChain>();
  /** Intermediates that verified up to a trusted root, by the digest of their DER. */
  #intermediates = new Map<string, Promise<TrustedIntermediate>>();
  /** Chain checks in flight, shared by concurrent JWS whose signatures already verified. */
  #checking = new Map<string, Promise<VerifiedChain>>();
  /**
   * Unseen chains whose token is spent and whose first JWS is being verified: the same chain
   * meanwhile spends none. Bounded by the budget: each entry took a token, and leaves when its
   * JWS is done.
   */
  #admitted = new Set<string>();
  /** Why each refused chain was refused, by digest; insertion order is age order. */
  #refused = new Map<string, string>();
  #chainChecks = 0;
  #intermediateChecks = 0;
  #unseenRefused = 0;

  constructor(options: StoreaJwsVerifierOptions = {}) {
    this.#engine = options.engine ?? "webcrypto";
    this.#roots = (options.rootCertificates ?? []).map((der) => this.#anchor(der, "root"));
    this.#now = options.now ?? Date.now;
    this.#budget = new TokenBucket(options.unseenChainBudget ?? UNSEEN_CHAIN_BUDGET);
  }

  /** How many verified chains are cached (for tests). */
  get cachedChains(): number {
    return this.#chains.size;
  }

  /** How many chains have been checked, certificates' signatures included (for tests). */
  get chainChecks(): number {
    return this.#chainChecks;
  }

  /** How many intermediates have been checked against the roots (for tests). */
  get intermediateChecks(): number {
    return this.#intermediateChecks;
  }

  /** How many JWS were refused over the budget of unseen chains, since the verifier was made. */
  get unseenChainsRefused(): number {
    return this.#unseenRefused;
  }

  /**
   * Verifies `jws` and returns its decoded payload.
   * @throws {JwsInvalidError} when anything about it is wrong.
   * @throws {UnseenChainBudgetError} when it came from anyone with a chain never seen, and the
   * budget of such chains is spent.
   */
  async verify(jws: string, options: JwsVerifyOptions = {}): Promise<Record<string, unknown>> {
    const parts = jws.split(".");
    if (parts.length !== 3 || parts.some((part) => part.length === 0)) {
      throw new JwsInvalidError("not a compact JWS");
    }
    if (parts[0].length > MAX_HEADER_CHARS) {
      throw new JwsInvalidError(`the header is longer than ${MAX_HEADER_CHARS} characters`);
    }
    let chain = this.#chains.get(parts[0]);
    recordCacheLookup("storea_chains", chain !== undefined);
    if (chain) await checkSignature(chain.leafKey, parts);
    else chain = await this.#verifyWithNewHeader(parts, options.from ?? "anyone");
    // Newest last: the least recently used chain is the first dropped.
    setBounded(this.#chains, parts[0], chain, CHAIN_CACHE_LIMIT);

    const payload = decodeSegment(parts[1], "payload");
    const signedAt = typeof payload.signedDate === "number" ? payload.signedDate : this.#now();
    if (
      signedAt < chain.notBefore - VALIDITY_TOLERANCE_MS ||
      signedAt > chain.notAfter + VALIDITY_TOLERANCE_MS
    ) {
      throw new JwsInvalidError("a certificate of the chain was not valid at signedDate");
    }
    return payload;
  }

  /** A JWS whose header is not cached: the steps 2 to 4 of this module's description. */
  async #verifyWithNewHeader(parts: string[], from: "anyone" | "store"): Promise<VerifiedChain> {
    const header = decodeSegment(parts[0], "header");
    if (header.alg !== "ES256") throw new JwsInvalidError(`alg must be ES256, not ${header.alg}`);
    const x5c = header.x5c;
    if (!Array.isArray(x5c) || x5c.length !== 3 || !x5c.every((c) => typeof c === "string")) {
      throw new JwsInvalidError("x5c must hold exactly 3 certificates");
    }
    const ders = x5c.map((text: string, i) => decodeCertificate(text, CERTIFICATE_ROLES[i]));
    const digest = chainDigest(ders);
    const refused = this.#refused.get(digest);
    if (refused !== undefined) throw new JwsInvalidError(refused);
    const known = this.#chainsByDigest.get(digest);
    if (known !== undefined) {
      await checkSignature(known.leafKey, parts);
      return known;
    }
    // One token per unseen chain, not per JWS: a burst under one new chain (the store's first
    // notifications after a restart, sent at once) waits for the one check in flight.
    const admitted = from === "anyone" && !this.#admitted.has(digest);
    if (admitted) {
      const wait = this.#budget.take();
      if (wait > 0) {
        this.#unseenRefused++;
        throw new UnseenChainBudgetError(wait);
      }
      this.#admitted.add(digest);
    }
    try {
      const leaf = certificateOf(ders[0], "leaf");
      const leafKey = await this.#leafKeyOf(leaf);
      // The signature first: a chain is checked, and cached, only for a leaf that just signed.
      await checkSignature(leafKey, parts);
      return await this.#checkedChain(digest, ders, leaf, leafKey);
    } finally {
      if (admitted) this.#admitted.delete(digest);
    }
  }

  async #leafKeyOf(leaf: Certificate): Promise<Es256VerifyingKey> {
    try {
      return await importEs256Key(leaf.publicKey, this.#engine);
    } catch {
      throw new JwsInvalidError("the leaf key is not usable for ES256");
    }
  }

  /**
   * The chain checked now, or by a concurrent caller, or by one that finished while this caller
   * checked its signature; a refusal is remembered by the chain's digest, since anyone can wrap
   * their own chain in headers spelled anew. A check's outcome is cached before it leaves
   * `#checking`, so a chain is checked once however its callers interleave.
   */
  #checkedChain(
    digest: string,
    ders: Uint8Array[],
    leaf: Certificate,
    leafKey: Es256VerifyingKey,
  ): Promise<VerifiedChain> {
    const known = this.#chainsByDigest.get(digest);
    if (known !== undefined) return Promise.resolve(known);
    const refused = this.#refused.get(digest);
    if (refused !== undefined) return Promise.reject(new JwsInvalidError(refused));
    let checking = this.#checking.get(digest);
    if (!checking) {
      checking = this.#checkChain(ders, leaf, leafKey).then((chain) => {
        setBounded(this.#chainsByDigest, digest, chain, CHAIN_CACHE_LIMIT);
        return chain;
      }, (error) => {
        if (error instanceof JwsInvalidError) {
          setBounded(this.#refused, digest, error.message, REFUSED_CHAIN_LIMIT);
        }
        throw error;
      }).finally(() => this.#checking.delete(digest));
      this.#checking.set(digest, checking);
    }
    return checking;
  }

  async #checkChain(
    ders: Uint8Array[],
    leaf: Certificate,
    leafKey: Es256VerifyingKey,
  ): Promise<VerifiedChain> {
    this.#chainChecks++;
    // The pin is on the certificate presented as the root: a hash, before anything else.
    if (this.#roots.length === 0) pinnedRoot(ders[2]);
    const intermediate = await this.#trustedIntermediate(ders[1], ders[2]);
    // What needs no signature first: a forged leaf fails here for the price of comparing bytes.
    if (!sameBytes(leaf.issuer, intermediate.subject)) {
      throw new JwsInvalidError("the leaf is not signed by the intermediate");
    }
    if (!leaf.extensions.has(LEAF_MARKER_OID)) {
      throw new JwsInvalidError("the leaf lacks Apple's App Store signing marker");
    }
    if (!await intermediate.key.verify(leaf.signature, leaf.tbs, leaf.signatureHash)) {
      throw new JwsInvalidError("the leaf is not signed by the intermediate");
    }
    return {
      leafKey,
      notBefore: Math.max(leaf.notBefore, intermediate.notBefore),
      notAfter: Math.min(leaf.notAfter, intermediate.notAfter),
    };
  }

  /**
   * The intermediate `der`, verified up to a trusted root (the configured roots, or `rootDer`
   * under the pin) once, then kept with its key. Only a verified one is kept.
   */
  #trustedIntermediate(der: Uint8Array, rootDer: Uint8Array): Promise<TrustedIntermediate> {
    const key = createHash("sha256").update(der).digest("hex");
    const cached = this.#intermediates.get(key);
    if (cached !== undefined) return cached;
    const checking = this.#checkIntermediate(der, rootDer);
    this.#intermediates.set(key, checking);
    checking.then(
      () => setBounded(this.#intermediates, key, checking, INTERMEDIATE_CACHE_LIMIT),
      () => this.#intermediates.delete(key),
    );
    return checking;
  }

  async #checkIntermediate(der: Uint8Array, rootDer: Uint8Array): Promise<TrustedIntermediate> {
    this.#intermediateChecks++;
    const intermediate = certificateOf(der, "intermediate");
    if (!isCertificateAuthorityOf(intermediate)) {
      throw new JwsInvalidError("the intermediate is not a certificate authority");
    }
    if (!intermediate.extensions.has(INTERMEDIATE_MARKER_OID)) {
      throw new JwsInvalidError("the intermediate lacks Apple's WWDR marker");
    }
    const anchors = this.#roots.length > 0 ? this.#roots : [this.#anchor(rootDer, "root")];
    for (const anchor of anchors) {
      if (!sameBytes(intermediate.issuer, anchor.certificate.subject)) continue;
      const rootKey = await anchor.key().catch(() => null);
      if (rootKey === null) continue;
      const { signature, tbs, signatureHash } = intermediate;
      if (!await rootKey.verify(signature, tbs, signatureHash)) continue;
      let key: EcdsaVerifyingKey;
      try {
        key = await importEcdsaKey(intermediate.publicKey, intermediate.curve, this.#engine);
      } catch {
        throw new JwsInvalidError("the intermediate's key is not usable");
      }
      return {
        subject: intermediate.subject,
        key,
        notBefore: Math.max(intermediate.notBefore, anchor.certificate.notBefore),
        notAfter: Math.min(intermediate.notAfter, anchor.certificate.notAfter),
      };
    }
    throw new JwsInvalidError("the intermediate is not signed by a trusted root");
  }

  /** A root read from its DER; its key is imported on first use. */
  #anchor(der: Uint8Array, which: string): Anchor {
    const certificate = certificateOf(der, which);
    let key: Promise<EcdsaVerifyingKey> | undefined;
    return {
      certificate,
      key: () => key ??= importEcdsaKey(certificate.publicKey, certificate.curve, this.#engine),
    };
  }
}

/**
 * Reads root certificates for `STOREA_ROOT_CERTS`: each file holds one DER certificate or one
 * or more PEM certificates.
 */
export async function readRootCertificates(paths: string[]): Promise<Uint8Array[]> {
  const roots: Uint8Array[] = [];
  for (const path of paths) {
    const bytes = await Deno.readFile(path);
    const text = new TextDecoder().decode(bytes);
    if (text.includes("-----BEGIN CERTIFICATE-----")) {
      const blocks = text.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g);
      for (const block of blocks ?? []) {
        roots.push(decodePem(block, path));
      }
    } else {
      roots.push(bytes);
    }
    // Fail at boot, not at the first notification.
    certificateOf(roots[roots.length - 1], `root in ${path}`);
  }
  return roots;
}

/** The DER inside one PEM block (an operator's file: line breaks are expected). */
function decodePem(block: string, path: string): Uint8Array {
  try {
    return Uint8Array.fromBase64(block.replace(/-----[A-Z ]+-----/g, ""), { alphabet: "base64" });
  } catch {
    throw new JwsInvalidError(`the root in ${path} is not valid base64`);
  }
}

/** Refuses a presented root that is not Apple Root CA - G3 byte for byte. */
function pinnedRoot(der: Uint8Array): void {
  const sha256 = createHash("sha256").update(der).digest("hex");
  if (sha256 !== APPLE_ROOT_CA_G3_SHA256) {
    throw new JwsInvalidError("the chain does not end in Apple Root CA - G3");
  }
}

function certificateOf(der: Uint8Array, which: string): Certificate {
  try {
    return readCertificate(der);
  } catch (error) {
    if (!(error instanceof CertificateError)) throw error;
    throw new JwsInvalidError(`the ${which} certificate does not parse: ${error.message}`);
  }
}

function isCertificateAuthorityOf(certificate: Certificate): boolean {
  try {
    return isCertificateAuthority(certificate);
  } catch {
    return false;
  }
}

/** ES256 (RFC 7518 3.4): a 64-byte r || s signature over the ASCII of `header.payload`. */
async function checkSignature(key: Es256VerifyingKey, parts: string[]): Promise<void> {
  const signature = decodeBase64url(parts[2], "signature");
  // OpenSSL's check reads its input before it returns, so the input can be written where the last
  // one was; WebCrypto's runs later.
  const input = key.engine === "openssl" ? signingInputInScratch(parts) : signingInput(parts);
  if (!await key.verify(signature, input)) {
    throw new JwsInvalidError("signature does not verify");
  }
}

function signingInput(parts: string[]): Uint8Array {
  return encoder.encode(`${parts[0]}.${parts[1]}`);
}

/** Room for the signing input of the JWS Apple signs (about 19 KB for a notification's). */
const scratch = new Uint8Array(64 * 1024);

/**
 * `<header>.<payload>` as the bytes that were signed, written into one buffer kept for the purpose
 * instead of a new string and a new array for each JWS, three times per notification. A larger
 * input gets an array of its own.
 */
function signingInputInScratch(parts: string[]): Uint8Array {
  // At most three bytes per character; base64url is one.
  if ((parts[0].length + parts[1].length) * 3 + 1 > scratch.length) return signingInput(parts);
  const header = encoder.encodeInto(parts[0], scratch).written;
  scratch[header] = 0x2e; // "."
  const payload = encoder.encodeInto(parts[1], scratch.subarray(header + 1)).written;
  return scratch.subarray(0, header + 1 + payload);
}

/** A JWS segment's JSON object: base64url, strict UTF-8, JSON (exported for bench/storea_jws.ts). */
export function decodeSegment(segment: string, which: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(decodeUtf8Strict(decodeBase64url(segment, which)));
  } catch {
    throw new JwsInvalidError(`the ${which} is not base64url JSON`);
  }
  if (!isJsonObject(value)) throw new JwsInvalidError(`the ${which} is not a JSON object`);
  return value;
}

/**
 * Decodes a JWS segment; padding is optional. Tolerance costs nothing here: the signature covers
 * the segments' exact text, and nothing is cached by them.
 */
function decodeBase64url(text: string, which: string): Uint8Array<ArrayBuffer> {
  try {
    return Uint8Array.fromBase64(text, { alphabet: "base64url" });
  } catch {
    throw new JwsInvalidError(`the ${which} is not base64url`);
  }
}

/**
 * Decodes one `x5c` certificate (RFC 7515 4.1.6: standard base64 of the DER): canonical base64
 * only (whitespace, a missing pad or stray bits refused), at most MAX_CERTIFICATE_BYTES.
 */
function decodeCertificate(text: string, which: string): Uint8Array<ArrayBuffer> {
  const tooLarge = () =>
    new JwsInvalidError(`the ${which} certificate is larger than ${MAX_CERTIFICATE_BYTES} bytes`);
  if (text.length > MAX_CERTIFICATE_CHARS) throw tooLarge();
  let der: Uint8Array<ArrayBuffer>;
  try {
    // Strict: the final padding must be there and its spare bits zero.
    der = Uint8Array.fromBase64(text, { alphabet: "base64", lastChunkHandling: "strict" });
  } catch {
    throw new JwsInvalidError(`the ${which} certificate is not canonical base64`);
  }
  // The decoder skips ASCII whitespace; the canonical spelling of `der` has none.
  if (text.length !== Math.ceil(der.length / 3) * 4) {
    throw new JwsInvalidError(`the ${which} certificate is not canonical base64`);
  }
  if (der.length > MAX_CERTIFICATE_BYTES) throw tooLarge();
  return der;
}

/** SHA-256 over the certificates, each preceded by its length so that no two chains share one. */
function chainDigest(ders: Uint8Array[]): string {
  const hash = createHash("sha256");
  const length = new DataView(new ArrayBuffer(4));
  for (const der of ders) {
    length.setUint32(0, der.length);
    hash.update(new Uint8Array(length.buffer));
    hash.update(der);
  }
  return hash.digest("hex");
}
