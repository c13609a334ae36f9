/**
 * A throwaway certificate authority and one server certificate for the given DNS names, made in
 * memory with pkijs and WebCrypto (no openssl binary needed), for TLS callbacks on loopback.
 */
import * as asn1js from "asn1js";
import * as pkijs from "pkijs";
import { derToPem } from "./pem.ts";

/** PEM texts: the CA to trust (`DENO_CERT`), and the server's certificate and key. */
export interface TlsTestCertificates {
  caPem: string;
  certPem: string;
  keyPem: string;
}

const DAY_MS = 86_400_000;

/** Creates a CA and a certificate it signs for `dnsNames`, valid from yesterday for a week. */
export async function createTlsTestCertificates(
  dnsNames: string[],
): Promise<TlsTestCertificates> {
  const algorithm = { name: "ECDSA", namedCurve: "P-256" };
  const [caKeys, serverKeys] = await Promise.all([
    crypto.subtle.generateKey(algorithm, true, ["sign", "verify"]),
    crypto.subtle.generateKey(algorithm, true, ["sign", "verify"]),
  ]);
  const caName = commonName("Purchase Relay test CA");
  const ca = await issue({
    subject: caName,
    issuer: caName,
    subjectKeys: caKeys,
    issuerKeys: caKeys,
    extensions: [
      extension("2.5.29.19", true, new pkijs.BasicConstraints({ cA: true }).toSchema().toBER()),
      extension("2.5.29.15", true, new Uint8Array([0x03, 0x02, 0x01, 0x06]).buffer), // certSign
    ],
  });
  const altNames = new pkijs.AltName({
    altNames: dnsNames.map((value) => new pkijs.GeneralName({ type: 2, value })),
  });
  const serverAuth = new asn1js.Sequence({
    value: [new asn1js.ObjectIdentifier({ value: "1.3.6.1.5.5.7.3.1" })],
  });
  const server = await issue({
    subject: commonName(dnsNames[0]),
    issuer: caName,
    subjectKeys: serverKeys,
    issuerKeys: caKeys,
    extensions: [
      extension("2.5.29.19", true, new pkijs.BasicConstraints({ cA: false }).toSchema().toBER()),
      extension("2.5.29.17", false, altNames.toSchema().toBER()),
      extension("2.5.29.37", false, serverAuth.toBER()),
    ],
  });
  const pkcs8 = new Uint8Array(await crypto.subtle.exportKey("pkcs8", serverKeys.privateKey));
  return {
    caPem: derToPem(ca),
    certPem: derToPem(server),
    keyPem: derToPem(pkcs8, "PRIVATE KEY"),
  };
}

interface Issue {
  subject: pkijs.RelativeDistinguishedNames;
  issuer: pkijs.RelativeDistinguishedNames;
  subjectKeys: CryptoKeyPair;
  issuerKeys: CryptoKeyPair;
  extensions: pkijs.Extension[];
}

async function issue(request: Issue): Promise<Uint8Array> {
  const cert = new pkijs.Certificate();
  cert.version = 2;
  const serial = crypto.getRandomValues(new Uint8Array(8));
  serial[0] = (serial[0] & 0x7f) | 0x01;
  cert.serialNumber = new asn1js.Integer({ valueHex: serial.buffer });
  cert.issuer = request.issuer;
  cert.subject = request.subject;
  cert.notBefore = new pkijs.Time({
    type: pkijs.TimeType.UTCTime,
    value: new Date(Date.now() - DAY_MS),
  });
  cert.notAfter = new pkijs.Time({
    type: pkijs.TimeType.UTCTime,
    value: new Date(Date.now() + 7 * DAY_MS),
  });
  await cert.subjectPublicKeyInfo.importKey(request.subjectKeys.publicKey);
  cert.extensions = request.extensions;
  await cert.sign(request.issuerKeys.privateKey, "SHA-256");
  return new Uint8Array(cert.toSchema(true).toBER());
}

function extension(extnID: string, critical: boolean, value: ArrayBuffer): pkijs.Extension {
  return new pkijs.Extension({ extnID, critical, extnValue: value });
}

function commonName(value: string): pkijs.RelativeDistinguishedNames {
  return new pkijs.RelativeDistinguishedNames({
    typesAndValues: [
      new pkijs.AttributeTypeAndValue({ type: "2.5.4.3", value: new asn1js.Utf8String({ value }) }),
    ],
  });
}
