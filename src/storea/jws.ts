/**
 * Store A signed data: one verifier for every JWS the App Store signs, whether it arrives in a
 * verify response (`signedTransactionInfo`) or a notification (`signedPayload` and its nested
 * `signedTransactionInfo` / `signedRenewalInfo`).
 *
 * A JWS carries its certificate chain in `x5c`: leaf, intermediate, root. Anyone can post one to
 * a receiver, so the work done before its signature verifies is small and bounded: the header
 * and each certificate are size-capped and decoded strictly (canonical base64, no whitespace, so
 * one certificate has one spelling), and the signature is checked with the leaf's key (one ES256
 * verification) before the chain is. Only then is the chain checked, once, and cached under the
 * exact text of the protected header that carried it, in a small LRU whose entries hold a key and
 * two dates, not the certificates. After that a JWS with the same header costs one ES256
 * verification, the payload's decoding and a time check against the chain's validity window: its
 * header is neither decoded nor hashed again, since the same text decodes to the same chain. A JWS
 * whose signature fails caches nothing.
 *
 * Anyone can also make a leaf of their own, name Apple's intermediate as its issuer, and sign
 * with its key: the signature then verifies and the chain is checked. The chain's checks that need
 * no signature (names, markers, the CA flag) come first, and a chain whose checks failed is
 * remembered, by digest, in a bounded cache of its own: the same forged chain sent again costs its
 * ES256 verification only, not the certificates' signatures again.
 */
import * as pkijs from "pkijs";
import { createHash } from "node:crypto";
import { decodeUtf8Strict, isJsonObject } from "../json.ts";
import { type Es256Engine, type Es256VerifyingKey, importEs256Key } from "../crypto/es256.ts";
import { RelayError } from "../errors.ts";
import { recordCacheLookup } from "../telemetry.ts";
import { setBounded } from "../cache.ts";

pkijs.setEngine("deno", new pkijs.CryptoEngine({ name: "deno", crypto }));

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
const BASIC_CONSTRAINTS_OID = "2.5.29.19";
/** Certificate validity is judged at `signedDate`, give or take this much clock skew. */
const VALIDITY_TOLERANCE_MS = 60_000;
/**
 * How many verified chains are remembered; Apple rotates its leaf about once a year. Each entry
 * is a header's text (Apple's are about 7 KB, MAX_HEADER_CHARS at most), a key and two dates, so
 * this bounds the cache's bytes too: 1.5 MB at most.
 */
export const CHAIN_CACHE_LIMIT = 32;
/**
 * How many refused chains are remembered (a digest and a reason each): a refusal depends on the
 * chain and the trusted roots alone, which do not change while the process runs.
 */
export const REFUSED_CHAIN_LIMIT = 1_024;
const CERTIFICATE_ROLES = ["leaf", "intermediate", "root"] as const;

const encoder = new TextEncoder();

/** A JWS that does not verify; `reason` says why, for logs (never the JWS itself). */
export class JwsInvalidError extends RelayError {
  constructor(reason: string) {
    super("SIGNATURE_INVALID", reason);
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
}

/** A chain that verified, reduced to what each JWS needs. */
interface VerifiedChain {
  leafKey: Es256VerifyingKey;
  /** The window in which every certificate of the chain is valid, epoch ms. */
  notBefore: number;
  notAfter: number;
}

/** Verifies store A JWS strings and returns their payloads. */
export class StoreaJwsVerifier {
  #roots: pkijs.Certificate[];
  #now: () => number;
  #engine: Es256Engine;
  /**
   * Verified chains by the text of the header that carried them; insertion order is recency order
   * (a hit moves to the end).
   */
  #chains = new Map<string, VerifiedChain>();
  /** Chain checks in flight, shared by concurrent JWS whose signatures already verified. */
  #checking = new Map<string, Promise<VerifiedChain>>();
  /** Why each refused chain was refused, by digest; insertion order is age order. */
  #refused = new Map<string, string>();
  #chainChecks = 0;

  constructor(options: StoreaJwsVerifierOptions = {}) {
    this.#roots = (options.rootCertificates ?? []).map((der) => parseCertificate(der, "root"));
    this.#now = options.now ?? Date.now;
    this.#engine = options.engine ?? "webcrypto";
  }

  /** How many verified chains are cached (for tests). */
  get cachedChains(): number {
    return this.#chains.size;
  }

  /** How many chains have been checked, their certificates' signatures included (for tests). */
  get chainChecks(): number {
    return this.#chainChecks;
  }

  /**
   * Verifies `jws` and returns its decoded payload.
   * @throws {JwsInvalidError} when anything about it is wrong.
   */
  async verify(jws: string): Promise<Record<string, unknown>> {
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
    else chain = await this.#verifyWithNewHeader(parts);
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

  /**
   * The signature and then the chain of a JWS whose header is not cached. The signature first: a
   * chain is checked, and cached, only for a leaf that just signed.
   */
  async #verifyWithNewHeader(parts: string[]): Promise<VerifiedChain> {
    const header = decodeSegment(parts[0], "header");
    if (header.alg !== "ES256") throw new JwsInvalidError(`alg must be ES256, not ${header.alg}`);
    const x5c = header.x5c;
    if (!Array.isArray(x5c) || x5c.length !== 3 || !x5c.every((c) => typeof c === "string")) {
      throw new JwsInvalidError("x5c must hold exactly 3 certificates");
    }
    const ders = x5c.map((text: string, i) => decodeCertificate(text, CERTIFICATE_ROLES[i]));
    const leaf = parseCertificate(ders[0], "leaf");
    const leafKey = await this.#leafKeyOf(leaf);
    await checkSignature(leafKey, parts);
    return await this.#checkedChain(chainDigest(ders), ders, leaf, leafKey);
  }

  async #leafKeyOf(leaf: pkijs.Certificate): Promise<Es256VerifyingKey> {
    try {
      const spki = new Uint8Array(leaf.subjectPublicKeyInfo.toSchema().toBER(false));
      return await importEs256Key(spki, this.#engine);
    } catch {
      throw new JwsInvalidError("the leaf key is not usable for ES256");
    }
  }

  /**
   * The chain checked now, or by a concurrent caller; a refusal is remembered by the chain's
   * digest, since anyone can wrap their own chain in headers spelled anew.
   */
  #checkedChain(
    digest: string,
    ders: Uint8Array[],
    leaf: pkijs.Certificate,
    leafKey: Es256VerifyingKey,
  ): Promise<VerifiedChain> {
    const refused = this.#refused.get(digest);
    if (refused !== undefined) return Promise.reject(new JwsInvalidError(refused));
    let checking = this.#checking.get(digest);
    if (!checking) {
      checking = this.#checkChain(ders, leaf, leafKey).catch((error) => {
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
    leaf: pkijs.Certificate,
    leafKey: Es256VerifyingKey,
  ): Promise<VerifiedChain> {
    this.#chainChecks++;
    const intermediate = parseCertificate(ders[1], "intermediate");
    // What needs no signature first: a forged chain fails here at the cost of parsing it.
    if (!leaf.issuer.isEqual(intermediate.subject)) {
      throw new JwsInvalidError("the leaf is not signed by the intermediate");
    }
    if (!isCertificateAuthority(intermediate)) {
      throw new JwsInvalidError("the intermediate is not a certificate authority");
    }
    if (!hasExtension(leaf, LEAF_MARKER_OID)) {
      throw new JwsInvalidError("the leaf lacks Apple's App Store signing marker");
    }
    if (!hasExtension(intermediate, INTERMEDIATE_MARKER_OID)) {
      throw new JwsInvalidError("the intermediate lacks Apple's WWDR marker");
    }
    const presentedRoot = parseCertificate(ders[2], "root");
    const anchors = this.#roots.length > 0 ? this.#roots : pinnedRoot(ders[2], presentedRoot);
    let anchor: pkijs.Certificate | undefined;
    for (const candidate of anchors) {
      if (
        intermediate.issuer.isEqual(candidate.subject) &&
        await verifiedBy(intermediate, candidate)
      ) {
        anchor = candidate;
        break;
      }
    }
    if (!anchor) throw new JwsInvalidError("the intermediate is not signed by a trusted root");
    if (!await verifiedBy(leaf, intermediate)) {
      throw new JwsInvalidError("the leaf is not signed by the intermediate");
    }
    const chain = [leaf, intermediate, anchor];
    return {
      leafKey,
      notBefore: Math.max(...chain.map((cert) => cert.notBefore.value.getTime())),
      notAfter: Math.min(...chain.map((cert) => cert.notAfter.value.getTime())),
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
    parseCertificate(roots[roots.length - 1], `root in ${path}`);
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

/** The presented root, when it is Apple Root CA - G3 byte for byte. */
function pinnedRoot(der: Uint8Array, root: pkijs.Certificate): pkijs.Certificate[] {
  const sha256 = createHash("sha256").update(der).digest("hex");
  if (sha256 !== APPLE_ROOT_CA_G3_SHA256) {
    throw new JwsInvalidError("the chain does not end in Apple Root CA - G3");
  }
  return [root];
}

async function verifiedBy(cert: pkijs.Certificate, issuer: pkijs.Certificate): Promise<boolean> {
  try {
    return await cert.verify(issuer);
  } catch {
    return false;
  }
}

function isCertificateAuthority(cert: pkijs.Certificate): boolean {
  const extension = cert.extensions?.find((e) => e.extnID === BASIC_CONSTRAINTS_OID);
  const parsed = extension?.parsedValue;
  return parsed instanceof pkijs.BasicConstraints && parsed.cA === true;
}

function hasExtension(cert: pkijs.Certificate, oid: string): boolean {
  return cert.extensions?.some((extension) => extension.extnID === oid) ?? false;
}

function parseCertificate(der: Uint8Array, which: string): pkijs.Certificate {
  try {
    return pkijs.Certificate.fromBER(der as Uint8Array<ArrayBuffer>);
  } catch {
    throw new JwsInvalidError(`the ${which} certificate does not parse`);
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
