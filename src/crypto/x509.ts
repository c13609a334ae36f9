/**
 * The few fields of an X.509 certificate (RFC 5280) that checking Apple's chain needs, read
 * straight from its DER: the signed bytes, the signature and its algorithm, the names as
 * encoded, the validity, the public key and the extensions.
 *
 * Hand-written rather than `npm:pkijs` (docs/architecture.md, "Why it is built this way"): a
 * chain anyone can post must be refused for less than it costs to make, and pkijs took
 * milliseconds to parse one certificate. Reading is strict DER (definite, minimal lengths; one tag
 * byte; nothing after the certificate), bounded by the input, and interprets nothing it does not
 * need: trust comes from the signatures checked over the exact `tbs` bytes, not from this parse.
 *
 * @module
 */
import { RelayError } from "../errors.ts";
import type { EcdsaCurve, EcdsaHash } from "./es256.ts";

/** A certificate that does not parse, or holds what the service does not accept. */
export class CertificateError extends RelayError {
  constructor(reason: string) {
    super("CERTIFICATE_INVALID", reason);
  }
}

/** What the service reads of a certificate. */
export interface Certificate {
  /** The DER of `tbsCertificate`: the bytes the issuer signed. */
  tbs: Uint8Array;
  /** The hash of the issuer's ECDSA signature. */
  signatureHash: EcdsaHash;
  /** The signature, a DER `ECDSA-Sig-Value`. */
  signature: Uint8Array;
  /** The issuer's name, as encoded (compared byte for byte). */
  issuer: Uint8Array;
  /** The subject's name, as encoded. */
  subject: Uint8Array;
  /** Validity, epoch milliseconds. */
  notBefore: number;
  notAfter: number;
  /** The `subjectPublicKeyInfo` DER, and the curve of its EC key. */
  publicKey: Uint8Array;
  curve: EcdsaCurve;
  /** The extensions' values (the DER inside each `extnValue`), by OID. */
  extensions: Map<string, Uint8Array>;
}

const SIGNATURE_HASHES: Record<string, EcdsaHash> = {
  "1.2.840.10045.4.3.2": "SHA-256", // ecdsa-with-SHA256
  "1.2.840.10045.4.3.3": "SHA-384", // ecdsa-with-SHA384
};
const EC_PUBLIC_KEY = "1.2.840.10045.2.1";
const CURVES: Record<string, EcdsaCurve> = {
  "1.2.840.10045.3.1.7": "P-256",
  "1.3.132.0.34": "P-384",
};
const BASIC_CONSTRAINTS = "2.5.29.19";

const SEQUENCE = 0x30;
const INTEGER = 0x02;
const BIT_STRING = 0x03;
const OCTET_STRING = 0x04;
const OBJECT_IDENTIFIER = 0x06;
const BOOLEAN = 0x01;
const UTC_TIME = 0x17;
const GENERALIZED_TIME = 0x18;
const VERSION_TAG = 0xa0;
const ISSUER_UNIQUE_ID = 0x81;
const SUBJECT_UNIQUE_ID = 0x82;
const EXTENSIONS_TAG = 0xa3;

/** One DER element: its tag, and where its content and the whole element lie in the input. */
interface Element {
  tag: number;
  start: number;
  contentStart: number;
  end: number;
}

/**
 * Reads the certificate in `der`.
 * @throws {CertificateError} when it is not one, or not an ECDSA certificate on P-256 or P-384.
 */
export function readCertificate(der: Uint8Array): Certificate {
  const reader = new DerReader(der);
  const certificate = reader.element(0, der.length, SEQUENCE, "certificate");
  if (certificate.end !== der.length) fail("bytes follow the certificate");
  const tbs = reader.element(certificate.contentStart, certificate.end, SEQUENCE, "tbs");
  const algorithm = reader.element(tbs.end, certificate.end, SEQUENCE, "signatureAlgorithm");
  const signatureBits = reader.element(algorithm.end, certificate.end, BIT_STRING, "signature");
  if (signatureBits.end !== certificate.end) fail("bytes follow the signature");
  const signatureHash = signatureHashOf(reader, algorithm);
  if (signatureBits.end - signatureBits.contentStart < 2 || der[signatureBits.contentStart] !== 0) {
    fail("the signature is not a whole number of bytes");
  }

  let at = tbs.contentStart;
  const next = (tag: number, what: string) => {
    const element = reader.element(at, tbs.end, tag, what);
    at = element.end;
    return element;
  };
  if (reader.peekTag(at, tbs.end) === VERSION_TAG) next(VERSION_TAG, "version");
  next(INTEGER, "serialNumber");
  const innerAlgorithm = next(SEQUENCE, "signature");
  // RFC 5280 4.1.1.2: the algorithm inside what was signed must be the one outside it.
  if (!sameBytes(reader.bytesOf(innerAlgorithm), reader.bytesOf(algorithm))) {
    fail("the signature algorithm differs inside and outside the signed part");
  }
  const issuer = next(SEQUENCE, "issuer");
  const validity = next(SEQUENCE, "validity");
  const subject = next(SEQUENCE, "subject");
  const publicKey = next(SEQUENCE, "subjectPublicKeyInfo");
  if (reader.peekTag(at, tbs.end) === ISSUER_UNIQUE_ID) next(ISSUER_UNIQUE_ID, "issuerUniqueID");
  if (reader.peekTag(at, tbs.end) === SUBJECT_UNIQUE_ID) {
    next(SUBJECT_UNIQUE_ID, "subjectUniqueID");
  }
  const extensions = new Map<string, Uint8Array>();
  if (reader.peekTag(at, tbs.end) === EXTENSIONS_TAG) {
    const wrapper = next(EXTENSIONS_TAG, "extensions");
    readExtensions(reader, wrapper, extensions);
  }
  if (at !== tbs.end) fail("unexpected fields in the signed part");

  const notBefore = reader.element(validity.contentStart, validity.end, null, "notBefore");
  const notAfter = reader.element(notBefore.end, validity.end, null, "notAfter");
  if (notAfter.end !== validity.end) fail("unexpected fields in the validity");

  return {
    tbs: reader.bytesOf(tbs),
    signatureHash,
    signature: der.subarray(signatureBits.contentStart + 1, signatureBits.end),
    issuer: reader.bytesOf(issuer),
    subject: reader.bytesOf(subject),
    notBefore: readTime(reader, notBefore),
    notAfter: readTime(reader, notAfter),
    publicKey: reader.bytesOf(publicKey),
    curve: curveOf(reader, publicKey),
    extensions,
  };
}

/** Whether the certificate says it is a certificate authority (basicConstraints `cA` true). */
export function isCertificateAuthority(certificate: Certificate): boolean {
  const value = certificate.extensions.get(BASIC_CONSTRAINTS);
  if (value === undefined) return false;
  const reader = new DerReader(value);
  const constraints = reader.element(0, value.length, SEQUENCE, "basicConstraints");
  if (constraints.end !== value.length) fail("bytes follow basicConstraints");
  if (reader.peekTag(constraints.contentStart, constraints.end) !== BOOLEAN) return false;
  const cA = reader.element(constraints.contentStart, constraints.end, BOOLEAN, "cA");
  // DER writes TRUE as 0xff, and a FALSE default not at all.
  return cA.end - cA.contentStart === 1 && value[cA.contentStart] === 0xff;
}

/** Whether two byte strings are equal. */
export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function signatureHashOf(reader: DerReader, algorithm: Element): EcdsaHash {
  const oid = reader.element(algorithm.contentStart, algorithm.end, OBJECT_IDENTIFIER, "algorithm");
  // ECDSA's AlgorithmIdentifier has no parameters (RFC 5758 3.2).
  if (oid.end !== algorithm.end) fail("the ECDSA signature algorithm has parameters");
  const hash = SIGNATURE_HASHES[reader.oid(oid)];
  if (hash === undefined) fail("the signature is not ECDSA with SHA-256 or SHA-384");
  return hash;
}

function curveOf(reader: DerReader, publicKey: Element): EcdsaCurve {
  const algorithm = reader.element(publicKey.contentStart, publicKey.end, SEQUENCE, "algorithm");
  const type = reader.element(algorithm.contentStart, algorithm.end, OBJECT_IDENTIFIER, "key");
  if (reader.oid(type) !== EC_PUBLIC_KEY) fail("the public key is not an EC key");
  const named = reader.element(type.end, algorithm.end, OBJECT_IDENTIFIER, "namedCurve");
  const curve = CURVES[reader.oid(named)];
  if (curve === undefined || named.end !== algorithm.end) fail("the key is not on P-256 or P-384");
  return curve;
}

function readExtensions(reader: DerReader, wrapper: Element, into: Map<string, Uint8Array>): void {
  const list = reader.element(wrapper.contentStart, wrapper.end, SEQUENCE, "extensions");
  if (list.end !== wrapper.end) fail("bytes follow the extensions");
  let at = list.contentStart;
  while (at < list.end) {
    const extension = reader.element(at, list.end, SEQUENCE, "extension");
    const id = reader.element(extension.contentStart, extension.end, OBJECT_IDENTIFIER, "extnID");
    let valueAt = id.end;
    if (reader.peekTag(valueAt, extension.end) === BOOLEAN) {
      valueAt = reader.element(valueAt, extension.end, BOOLEAN, "critical").end;
    }
    const value = reader.element(valueAt, extension.end, OCTET_STRING, "extnValue");
    if (value.end !== extension.end) fail("bytes follow an extension's value");
    const oid = reader.oid(id);
    // RFC 5280 4.2: a certificate must not include more than one instance of an extension.
    if (into.has(oid)) fail(`the extension ${oid} appears twice`);
    into.set(oid, reader.contentOf(value));
    at = extension.end;
  }
}

/** UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`), as RFC 5280 4.1.2.5 has them. */
function readTime(reader: DerReader, element: Element): number {
  const text = String.fromCharCode(...reader.contentOf(element));
  let match: RegExpMatchArray | null;
  let year: number;
  if (element.tag === UTC_TIME) {
    match = text.match(/^(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)Z$/);
    if (match === null) fail("a UTCTime is not YYMMDDHHMMSSZ");
    const yy = Number(match[1]);
    year = yy >= 50 ? 1900 + yy : 2000 + yy;
  } else if (element.tag === GENERALIZED_TIME) {
    match = text.match(/^(\d\d\d\d)(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)Z$/);
    if (match === null) fail("a GeneralizedTime is not YYYYMMDDHHMMSSZ");
    year = Number(match[1]);
  } else {
    fail("a validity time is neither UTCTime nor GeneralizedTime");
  }
  const [month, day, hour, minute, second] = match.slice(2).map(Number);
  const time = Date.UTC(year, month - 1, day, hour, minute, second);
  const date = new Date(time);
  // Date.UTC rolls 31 February over into March: refuse what is not a real date.
  if (date.getUTCMonth() !== month - 1 || date.getUTCDate() !== day || hour > 23 || minute > 59) {
    fail("a validity time is not a real date");
  }
  if (second > 59) fail("a validity time is not a real date");
  return time;
}

function fail(reason: string): never {
  throw new CertificateError(reason);
}

/** Strict DER elements over one buffer. */
class DerReader {
  #bytes: Uint8Array;

  constructor(bytes: Uint8Array) {
    this.#bytes = bytes;
  }

  /** The tag at `at`, or null at `end`. */
  peekTag(at: number, end: number): number | null {
    return at < end ? this.#bytes[at] : null;
  }

  /** The element at `at`, which must end by `end` and have `tag` (any tag when null). */
  element(at: number, end: number, tag: number | null, what: string): Element {
    const bytes = this.#bytes;
    if (at + 2 > end) fail(`the ${what} is cut short`);
    const found = bytes[at];
    if (tag !== null && found !== tag) fail(`the ${what} is not where it should be`);
    // Only one-byte tags: every tag of a certificate is one.
    if ((found & 0x1f) === 0x1f) fail(`the ${what} has a multi-byte tag`);
    let length = bytes[at + 1];
    let contentStart = at + 2;
    if (length & 0x80) {
      const count = length & 0x7f;
      // 0x80 is BER's indefinite length; more than 3 length bytes is far beyond any certificate.
      if (count === 0 || count > 3) fail(`the ${what} has a length DER does not allow`);
      if (contentStart + count > end) fail(`the ${what} is cut short`);
      length = 0;
      for (let i = 0; i < count; i++) length = length * 256 + bytes[contentStart + i];
      contentStart += count;
      // DER: the shortest form, with no leading zero byte.
      if (length < 0x80 || bytes[at + 2] === 0) fail(`the ${what} has a length DER does not allow`);
    }
    const elementEnd = contentStart + length;
    if (elementEnd > end) fail(`the ${what} is longer than what holds it`);
    return { tag: found, start: at, contentStart, end: elementEnd };
  }

  /** The whole element's bytes (tag, length and content). */
  bytesOf(element: Element): Uint8Array {
    return this.#bytes.subarray(element.start, element.end);
  }

  /** The element's content. */
  contentOf(element: Element): Uint8Array {
    return this.#bytes.subarray(element.contentStart, element.end);
  }

  /** An OBJECT IDENTIFIER's dotted text. */
  oid(element: Element): string {
    const content = this.contentOf(element);
    if (content.length === 0 || content.length > 64) fail("an object identifier is malformed");
    const arcs: number[] = [];
    let value = 0;
    for (let i = 0; i < content.length; i++) {
      const byte = content[i];
      // A leading 0x80 is not minimal; arcs past 2^42 are not in any identifier read here.
      if (value === 0 && byte === 0x80) fail("an object identifier is malformed");
      value = value * 128 + (byte & 0x7f);
      if (value > 2 ** 42) fail("an object identifier is malformed");
      if (!(byte & 0x80)) {
        arcs.push(value);
        value = 0;
      }
    }
    if (content[content.length - 1] & 0x80) fail("an object identifier is malformed");
    const first = arcs[0];
    const head = first < 40 ? [0, first] : first < 80 ? [1, first - 40] : [2, first - 80];
    return [...head, ...arcs.slice(1)].join(".");
  }
}
