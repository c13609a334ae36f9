/**
 * Store A signed data (decisions.md 7): one verifier for every JWS the App Store signs, whether
 * it arrives in a verify response (`signedTransactionInfo`) or a notification (`signedPayload`
 * and its nested `signedTransactionInfo` / `signedRenewalInfo`).
 *
 * A JWS carries its certificate chain in `x5c`: leaf, intermediate, root. The chain is checked
 * once and cached by the hash of its certificates; after that a JWS costs one ES256
 * verification and a time check against the chain's validity window.
 */
import * as pkijs from "pkijs";
import { createHash } from "node:crypto";
import { type Es256Engine, type Es256VerifyingKey, importEs256Key } from "../crypto/es256.ts";

pkijs.setEngine("deno", new pkijs.CryptoEngine({ name: "deno", crypto }));

/** SHA-256 of Apple Root CA - G3, the built-in trust anchor. */
export const APPLE_ROOT_CA_G3_SHA256 =
  "63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179";

/** Apple's marker extension on the certificate that signs App Store data. */
const LEAF_MARKER_OID = "1.2.840.113635.100.6.11.1";
/** Apple's marker extension on the Worldwide Developer Relations intermediate. */
const INTERMEDIATE_MARKER_OID = "1.2.840.113635.100.6.2.1";
const BASIC_CONSTRAINTS_OID = "2.5.29.19";
/** Certificate validity is judged at `signedDate`, give or take this much clock skew. */
const VALIDITY_TOLERANCE_MS = 60_000;
/** How many verified chains are remembered; Apple rotates its leaf about once a year. */
const CHAIN_CACHE_LIMIT = 256;

const encoder = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** A JWS that does not verify; `reason` says why, for logs (never the JWS itself). */
export class JwsInvalidError extends Error {
  readonly code = "SIGNATURE_INVALID";
  constructor(reason: string) {
    super(reason);
    this.name = "JwsInvalidError";
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
  #chains = new Map<string, Promise<VerifiedChain>>();

  constructor(options: StoreaJwsVerifierOptions = {}) {
    this.#roots = (options.rootCertificates ?? []).map((der) => parseCertificate(der, "root"));
    this.#now = options.now ?? Date.now;
    this.#engine = options.engine ?? "webcrypto";
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
    const header = decodeSegment(parts[0], "header");
    if (header.alg !== "ES256") throw new JwsInvalidError(`alg must be ES256, not ${header.alg}`);
    const x5c = header.x5c;
    if (!Array.isArray(x5c) || x5c.length !== 3 || !x5c.every((c) => typeof c === "string")) {
      throw new JwsInvalidError("x5c must hold exactly 3 certificates");
    }
    const payload = decodeSegment(parts[1], "payload");

    const chain = await this.#chainOf(x5c as string[]);
    const signedAt = typeof payload.signedDate === "number" ? payload.signedDate : this.#now();
    if (
      signedAt < chain.notBefore - VALIDITY_TOLERANCE_MS ||
      signedAt > chain.notAfter + VALIDITY_TOLERANCE_MS
    ) {
      throw new JwsInvalidError("a certificate of the chain was not valid at signedDate");
    }
    // ES256 (RFC 7518 3.4): a 64-byte r || s signature over the ASCII of `header.payload`.
    const signature = decodeBase64(parts[2], "base64url");
    const signingInput = encoder.encode(`${parts[0]}.${parts[1]}`);
    const valid = await chain.leafKey.verify(signature, signingInput);
    if (!valid) throw new JwsInvalidError("signature does not verify");
    return payload;
  }

  /** The verified chain of `x5c`, from the cache or checked now. Failures are not cached. */
  #chainOf(x5c: string[]): Promise<VerifiedChain> {
    // The certificates themselves are the key: a few KB, compared only on a hash collision.
    const key = x5c.join(".");
    let chain = this.#chains.get(key);
    if (!chain) {
      chain = this.#verifyChain(x5c);
      chain.catch(() => this.#chains.delete(key));
      if (this.#chains.size >= CHAIN_CACHE_LIMIT) {
        // Forget the oldest chain; Map iterates in insertion order.
        this.#chains.delete(this.#chains.keys().next().value!);
      }
      this.#chains.set(key, chain);
    }
    return chain;
  }

  async #verifyChain(x5c: string[]): Promise<VerifiedChain> {
    const ders = x5c.map((text) => decodeBase64(text, "base64"));
    const [leaf, intermediate, presentedRoot] = ders.map((der, i) =>
      parseCertificate(der, ["leaf", "intermediate", "root"][i])
    );

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
    if (!leaf.issuer.isEqual(intermediate.subject) || !await verifiedBy(leaf, intermediate)) {
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

    let leafKey: Es256VerifyingKey;
    try {
      const spki = new Uint8Array(leaf.subjectPublicKeyInfo.toSchema().toBER(false));
      leafKey = await importEs256Key(spki, this.#engine);
    } catch {
      throw new JwsInvalidError("the leaf key is not usable for ES256");
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
        roots.push(decodeBase64(block.replace(/-----[A-Z ]+-----|\s/g, ""), "base64"));
      }
    } else {
      roots.push(bytes);
    }
    // Fail at boot, not at the first notification.
    parseCertificate(roots[roots.length - 1], `root in ${path}`);
  }
  return roots;
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

function decodeSegment(segment: string, which: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(strictUtf8.decode(decodeBase64(segment, "base64url")));
  } catch {
    throw new JwsInvalidError(`the ${which} is not base64url JSON`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new JwsInvalidError(`the ${which} is not a JSON object`);
  }
  return value as Record<string, unknown>;
}

/** Decodes base64 (x5c) or base64url (JWS segments); padding is optional. */
function decodeBase64(text: string, alphabet: "base64" | "base64url"): Uint8Array<ArrayBuffer> {
  try {
    return Uint8Array.fromBase64(text, { alphabet });
  } catch {
    throw new JwsInvalidError(`invalid ${alphabet}`);
  }
}
