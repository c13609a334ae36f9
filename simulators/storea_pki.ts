/**
 * A test PKI shaped like the one Apple signs App Store JWS with: a P-384 root, a P-384 intermediate
 * carrying Apple's WWDR marker OID, and a P-256 leaf carrying Apple's receipt-signing marker OID,
 * each signed with ecdsa-with-SHA384 as Apple's are.
 *
 * Options break the chain in one chosen way at a time, for negative tests of a verifier.
 *
 * @module
 */
import { derToPem } from "./pem.ts";
import * as asn1js from "asn1js";
import * as pkijs from "pkijs";

/** Re-exported: the root certificate is handed out as PEM (`rootPem`, `STOREA_ROOT_CERTS`). */
export { derToPem } from "./pem.ts";

pkijs.setEngine("deno", new pkijs.CryptoEngine({ name: "deno", crypto }));

/** OID Apple puts in the WWDR intermediate certificate (value DER NULL). */
export const STOREA_INTERMEDIATE_MARKER_OID = "1.2.840.113635.100.6.2.1";
/** OID Apple puts in the receipt-signing leaf certificate (value DER NULL). */
export const STOREA_LEAF_MARKER_OID = "1.2.840.113635.100.6.11.1";

/** Subject common names of the three test certificates. */
export const STOREA_TEST_NAMES = {
  root: "Purchase Relay Test Root CA",
  intermediate: "Purchase Relay Test Intermediate CA",
  leaf: "Purchase Relay Test Store Signing",
} as const;

const ORGANIZATION = "Purchase Relay Simulator";
const DAY_MS = 86_400_000;

/** A validity window; a `number` is epoch milliseconds. */
export interface CertificateValidity {
  /** Start of validity (notBefore). */
  validFrom?: Date | number;
  /** End of validity (notAfter). */
  validTo?: Date | number;
}

/** Options of {@link createStoreaTestPki}. The defaults give a chain a verifier accepts. */
export interface StoreaTestPkiOptions extends CertificateValidity {
  /**
   * `validFrom`/`validTo` at the top level apply to all three certificates; these apply to
   * one certificate and win over the top level. Defaults: every certificate is valid from
   * 30 days ago; the root until 20 years, the intermediate 10 years, the leaf 2 years from now.
   */
  root?: CertificateValidity;
  /** Validity of the intermediate; see {@link StoreaTestPkiOptions.root}. */
  intermediate?: CertificateValidity;
  /** Validity of the leaf, e.g. `{ validTo: Date.now() - 1000 }` for an expired leaf. */
  leaf?: CertificateValidity;
  /** `false` omits OID 1.2.840.113635.100.6.11.1 from the leaf. Default `true`. */
  leafMarker?: boolean;
  /** `false` omits OID 1.2.840.113635.100.6.2.1 from the intermediate. Default `true`. */
  intermediateMarker?: boolean;
  /** `false` issues the intermediate with basicConstraints CA:FALSE. Default `true`. */
  intermediateIsCa?: boolean;
  /**
   * `"root"` signs the leaf with the root key (its issuer name and authority key id then
   * name the root), so the leaf's signature does not verify with the intermediate's key.
   * `"stranger"` names the intermediate as the leaf's issuer, as a forger would, but signs the
   * leaf with a key of its own. Default `"intermediate"`.
   */
  leafSignedBy?: "intermediate" | "root" | "stranger";
  /**
   * Writes this common name as the leaf's issuer while still signing it with the
   * intermediate key: a chain whose signatures verify but whose names do not chain.
   */
  leafIssuerCommonName?: string;
}

/** DER of each certificate of a {@link StoreaTestPki}. */
export interface StoreaTestCertificates {
  /** The P-256 signing certificate (x5c[0]). */
  leaf: Uint8Array<ArrayBuffer>;
  /** The P-384 intermediate CA (x5c[1]). */
  intermediate: Uint8Array<ArrayBuffer>;
  /** The self-signed P-384 root CA (x5c[2]). */
  root: Uint8Array<ArrayBuffer>;
}

/** A generated test PKI: what a JWS signer needs and what a verifier must trust. */
export interface StoreaTestPki {
  /** DER of the root certificate, the trust anchor. */
  rootDer: Uint8Array<ArrayBuffer>;
  /** The root certificate as PEM, for `STOREA_ROOT_CERTS`. */
  rootPem: string;
  /** Standard base64 of each DER, leaf first: the `x5c` header of a JWS. */
  x5c: [leaf: string, intermediate: string, root: string];
  /** ECDSA P-256 private key of the leaf certificate; signs ES256 JWS. */
  leafPrivateKey: CryptoKey;
  /** ECDSA P-256 public key of the leaf certificate. */
  leafPublicKey: CryptoKey;
  /** DER of every certificate. */
  certificates: StoreaTestCertificates;
}

/**
 * Creates a fresh root, intermediate and leaf. Each call makes new keys, so two PKIs never
 * trust each other's chains.
 *
 * @example
 * ```ts
 * const pki = await createStoreaTestPki();
 * const expired = await createStoreaTestPki({ leaf: { validTo: Date.now() - 60_000 } });
 * ```
 */
export async function createStoreaTestPki(
  options: StoreaTestPkiOptions = {},
): Promise<StoreaTestPki> {
  const [rootKeys, intermediateKeys, leafKeys] = await Promise.all([
    generateEcKeyPair("P-384"),
    generateEcKeyPair("P-384"),
    generateEcKeyPair("P-256"),
  ]);
  const rootName = distinguishedName(STOREA_TEST_NAMES.root);
  const intermediateName = distinguishedName(STOREA_TEST_NAMES.intermediate);

  const root = await issueCertificate({
    subject: rootName,
    issuer: rootName,
    validity: validityOf(options, options.root, 20 * 365 * DAY_MS),
    subjectKeys: rootKeys,
    issuerKeys: rootKeys,
    ca: { pathLength: null },
    keyUsage: KEY_USAGE_CERT_SIGN,
    markerOid: null,
  });
  const intermediate = await issueCertificate({
    subject: intermediateName,
    issuer: rootName,
    validity: validityOf(options, options.intermediate, 10 * 365 * DAY_MS),
    subjectKeys: intermediateKeys,
    issuerKeys: rootKeys,
    // Apple's WWDR G6 is CA:TRUE, pathlen:0.
    ca: options.intermediateIsCa === false ? null : { pathLength: 0 },
    keyUsage: KEY_USAGE_CERT_SIGN,
    markerOid: options.intermediateMarker === false ? null : STOREA_INTERMEDIATE_MARKER_OID,
  });
  const leafByRoot = options.leafSignedBy === "root";
  const strangerKeys = options.leafSignedBy === "stranger"
    ? await generateEcKeyPair("P-384")
    : null;
  const leafIssuerName = options.leafIssuerCommonName !== undefined
    ? distinguishedName(options.leafIssuerCommonName)
    : leafByRoot
    ? rootName
    : intermediateName;
  const leaf = await issueCertificate({
    subject: distinguishedName(STOREA_TEST_NAMES.leaf),
    issuer: leafIssuerName,
    validity: validityOf(options, options.leaf, 2 * 365 * DAY_MS),
    subjectKeys: leafKeys,
    issuerKeys: strangerKeys ?? (leafByRoot ? rootKeys : intermediateKeys),
    ca: null,
    keyUsage: KEY_USAGE_DIGITAL_SIGNATURE,
    markerOid: options.leafMarker === false ? null : STOREA_LEAF_MARKER_OID,
  });

  return {
    rootDer: root,
    rootPem: derToPem(root),
    x5c: [leaf.toBase64(), intermediate.toBase64(), root.toBase64()],
    leafPrivateKey: leafKeys.privateKey,
    leafPublicKey: leafKeys.publicKey,
    certificates: { leaf, intermediate, root },
  };
}

/** A leaf made by {@linkcode forgeStoreaLeaf}, and the key that signs JWS under it. */
export interface ForgedStoreaLeaf {
  /** Standard base64 of the leaf's DER, for `x5c[0]`. */
  x5c: string;
  /** The P-256 key of the leaf, which signs JWS that then verify with the leaf's key. */
  privateKey: CryptoKey;
}

/**
 * A leaf anyone can make, for tests and benchmarks of the verifier's refusals: it names the
 * certificate `intermediateDer` (Apple's real intermediate, say) as its issuer, byte for byte, and
 * carries Apple's leaf marker, but it is signed with its own key, so it does not verify with the
 * intermediate's. A JWS signed with `privateKey` verifies with the leaf's key.
 */
export async function forgeStoreaLeaf(intermediateDer: Uint8Array): Promise<ForgedStoreaLeaf> {
  const keys = await generateEcKeyPair("P-256");
  const intermediate = pkijs.Certificate.fromBER(intermediateDer as Uint8Array<ArrayBuffer>);
  const leaf = await issueCertificate({
    subject: distinguishedName(STOREA_TEST_NAMES.leaf),
    issuer: intermediate.subject,
    validity: validityOf({}, undefined, 2 * 365 * DAY_MS),
    subjectKeys: keys,
    issuerKeys: keys,
    ca: null,
    keyUsage: KEY_USAGE_DIGITAL_SIGNATURE,
    markerOid: STOREA_LEAF_MARKER_OID,
    authorityKeyIdentifier: false,
  });
  return { x5c: leaf.toBase64(), privateKey: keys.privateKey };
}

/**
 * Writes the PKI's root certificate as PEM to `path` and returns `path`, ready to be
 * named in `STOREA_ROOT_CERTS`.
 */
export async function writeStoreaRootPem(pki: StoreaTestPki, path: string): Promise<string> {
  await Deno.writeTextFile(path, pki.rootPem);
  return path;
}

/** keyUsage BIT STRING DER: keyCertSign | cRLSign (bits 5, 6; one unused trailing bit). */
const KEY_USAGE_CERT_SIGN = new Uint8Array([0x03, 0x02, 0x01, 0x06]);
/** keyUsage BIT STRING DER: digitalSignature (bit 0; seven unused trailing bits). */
const KEY_USAGE_DIGITAL_SIGNATURE = new Uint8Array([0x03, 0x02, 0x07, 0x80]);
/** DER NULL, the value Apple gives its marker extensions. */
const DER_NULL = new Uint8Array([0x05, 0x00]);

interface CertificateRequest {
  subject: pkijs.RelativeDistinguishedNames;
  issuer: pkijs.RelativeDistinguishedNames;
  validity: { notBefore: Date; notAfter: Date };
  subjectKeys: CryptoKeyPair;
  issuerKeys: CryptoKeyPair;
  /** `null`: CA:FALSE; `pathLength: null`: no path length constraint. */
  ca: { pathLength: number | null } | null;
  keyUsage: Uint8Array;
  markerOid: string | null;
  /** `false` leaves out the authority key identifier; default: present unless self-signed. */
  authorityKeyIdentifier?: boolean;
}

/** Builds, signs (ECDSA with SHA-384, like Apple) and DER-encodes one certificate. */
async function issueCertificate(request: CertificateRequest): Promise<Uint8Array<ArrayBuffer>> {
  const cert = new pkijs.Certificate();
  cert.version = 2; // X.509 v3
  cert.serialNumber = new asn1js.Integer({ valueHex: randomSerial() });
  cert.issuer = request.issuer;
  cert.subject = request.subject;
  cert.notBefore = timeOf(request.validity.notBefore);
  cert.notAfter = timeOf(request.validity.notAfter);
  await cert.subjectPublicKeyInfo.importKey(request.subjectKeys.publicKey);

  // pkijs writes pathLenConstraint 0 when the key is present at all, even as undefined.
  const basicConstraints = request.ca === null
    ? new pkijs.BasicConstraints({ cA: false })
    : request.ca.pathLength === null
    ? new pkijs.BasicConstraints({ cA: true })
    : new pkijs.BasicConstraints({ cA: true, pathLenConstraint: request.ca.pathLength });
  const extensions = [
    extension("2.5.29.19", true, toBytes(basicConstraints.toSchema().toBER())),
    extension("2.5.29.15", true, request.keyUsage),
    extension("2.5.29.14", false, octetString(await keyIdentifier(request.subjectKeys))),
  ];
  if (request.issuerKeys !== request.subjectKeys && request.authorityKeyIdentifier !== false) {
    const authorityKeyId = new pkijs.AuthorityKeyIdentifier({
      keyIdentifier: new asn1js.OctetString({ valueHex: await keyIdentifier(request.issuerKeys) }),
    });
    extensions.push(
      extension("2.5.29.35", false, toBytes(authorityKeyId.toSchema().toBER())),
    );
  }
  if (request.markerOid !== null) extensions.push(extension(request.markerOid, false, DER_NULL));
  cert.extensions = extensions;

  await cert.sign(request.issuerKeys.privateKey, "SHA-384");
  return toBytes(cert.toSchema(true).toBER());
}

function extension(extnID: string, critical: boolean, value: Uint8Array): pkijs.Extension {
  return new pkijs.Extension({ extnID, critical, extnValue: toArrayBuffer(value) });
}

function octetString(value: Uint8Array): Uint8Array {
  return toBytes(new asn1js.OctetString({ valueHex: value }).toBER());
}

/** RFC 5280 4.2.1.2 method 1: SHA-1 of the subjectPublicKey bits. */
async function keyIdentifier(keys: CryptoKeyPair): Promise<Uint8Array> {
  const raw = await crypto.subtle.exportKey("raw", keys.publicKey);
  return new Uint8Array(await crypto.subtle.digest("SHA-1", raw));
}

/**
 * CN, O, C as three single-valued RDNs, as Apple's names are. pkijs would put every
 * attribute of a RelativeDistinguishedNames into one multi-valued RDN, so the Name is
 * encoded here and parsed back.
 */
function distinguishedName(commonName: string): pkijs.RelativeDistinguishedNames {
  const attributes: [string, asn1js.Utf8String | asn1js.PrintableString][] = [
    ["2.5.4.3", new asn1js.Utf8String({ value: commonName })],
    ["2.5.4.10", new asn1js.Utf8String({ value: ORGANIZATION })],
    ["2.5.4.6", new asn1js.PrintableString({ value: "US" })],
  ];
  const name = new asn1js.Sequence({
    value: attributes.map(([type, value]) =>
      new asn1js.Set({
        value: [new pkijs.AttributeTypeAndValue({ type, value }).toSchema()],
      })
    ),
  });
  return pkijs.RelativeDistinguishedNames.fromBER(name.toBER());
}

/** Resolves one certificate's window: its own option, then the top-level one, then defaults. */
function validityOf(
  all: CertificateValidity,
  own: CertificateValidity | undefined,
  defaultLifetimeMs: number,
): { notBefore: Date; notAfter: Date } {
  const now = Date.now();
  const from = own?.validFrom ?? all.validFrom ?? now - 30 * DAY_MS;
  const to = own?.validTo ?? all.validTo ?? now + defaultLifetimeMs;
  return { notBefore: new Date(from), notAfter: new Date(to) };
}

/** RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050. */
function timeOf(date: Date): pkijs.Time {
  const type = date.getUTCFullYear() < 2050
    ? pkijs.TimeType.UTCTime
    : pkijs.TimeType.GeneralizedTime;
  return new pkijs.Time({ type, value: date });
}

/** A positive, non-zero 64-bit serial (RFC 5280 4.1.2.2). */
function randomSerial(): ArrayBuffer {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  bytes[0] = (bytes[0] & 0x7f) | 0x01;
  return toArrayBuffer(bytes);
}

function generateEcKeyPair(namedCurve: "P-256" | "P-384"): Promise<CryptoKeyPair> {
  return crypto.subtle.generateKey({ name: "ECDSA", namedCurve }, true, ["sign", "verify"]);
}

function toBytes(buffer: ArrayBuffer): Uint8Array<ArrayBuffer> {
  return new Uint8Array(buffer);
}

function toArrayBuffer(bytes: Uint8Array): ArrayBuffer {
  return bytes.slice().buffer;
}
