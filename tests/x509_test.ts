/**
 * The X.509 reader of src/crypto/x509.ts against certificates no one here made (Apple's real
 * chain, Apple's library mocks), against pkijs on the simulator's chains, and against broken DER:
 * anything that is not a certificate it accepts is a CertificateError, never another exception.
 */
import assert from "node:assert/strict";
import * as pkijs from "pkijs";
import fc from "fast-check";
import { CertificateError, isCertificateAuthority, readCertificate } from "../src/crypto/x509.ts";
import { createStoreaTestPki } from "../simulators/storea_pki.ts";

const FIXTURES = new URL("./fixtures/storea/", import.meta.url);

async function realChain(): Promise<Uint8Array[]> {
  const jws = (await Deno.readTextFile(new URL("real-sandbox/notification-01.jws", FIXTURES)))
    .trim();
  const header = JSON.parse(
    new TextDecoder().decode(Uint8Array.fromBase64(jws.split(".")[0], { alphabet: "base64url" })),
  );
  return header.x5c.map((text: string) => Uint8Array.fromBase64(text));
}

function hex(bytes: Uint8Array | ArrayBuffer): string {
  return new Uint8Array(bytes).toHex();
}

Deno.test("x509: Apple's real chain reads as Apple describes it", async () => {
  const [leaf, intermediate, root] = (await realChain()).map(readCertificate);
  assert.deepEqual([leaf.curve, intermediate.curve, root.curve], ["P-256", "P-384", "P-384"]);
  assert.deepEqual(
    [leaf.signatureHash, intermediate.signatureHash, root.signatureHash],
    ["SHA-384", "SHA-384", "SHA-384"],
  );
  assert.equal(new Date(leaf.notAfter).toISOString(), "2027-10-13T17:47:23.000Z");
  assert.equal(new Date(root.notBefore).toISOString(), "2014-04-30T18:19:06.000Z");
  assert.ok(leaf.extensions.has("1.2.840.113635.100.6.11.1"));
  assert.ok(intermediate.extensions.has("1.2.840.113635.100.6.2.1"));
  assert.deepEqual(
    [isCertificateAuthority(leaf), isCertificateAuthority(intermediate)],
    [false, true],
  );
  assert.equal(hex(leaf.issuer), hex(intermediate.subject));
  assert.equal(hex(intermediate.issuer), hex(root.subject));
});

Deno.test("x509: every field agrees with pkijs on simulator chains", async () => {
  for (
    const options of [{}, { intermediateIsCa: false }, { leaf: { validTo: 2_600_000_000_000 } }]
  ) {
    const pki = await createStoreaTestPki(options);
    for (const der of Object.values(pki.certificates)) {
      const ours = readCertificate(der);
      const theirs = pkijs.Certificate.fromBER(der);
      assert.equal(hex(ours.tbs), hex(theirs.tbsView));
      assert.equal(hex(ours.issuer), hex(theirs.issuer.toSchema().toBER()));
      assert.equal(hex(ours.subject), hex(theirs.subject.toSchema().toBER()));
      assert.equal(hex(ours.publicKey), hex(theirs.subjectPublicKeyInfo.toSchema().toBER()));
      assert.equal(hex(ours.signature), hex(theirs.signatureValue.valueBlock.valueHexView));
      assert.equal(ours.notBefore, theirs.notBefore.value.getTime());
      assert.equal(ours.notAfter, theirs.notAfter.value.getTime());
      assert.deepEqual(
        [...ours.extensions.keys()].sort(),
        (theirs.extensions ?? []).map((extension) => extension.extnID).sort(),
      );
    }
  }
});

Deno.test("x509: Apple's library mocks read, test CA included", async () => {
  const der = await Deno.readFile(new URL("library-mocks/testCA.der", FIXTURES));
  const root = readCertificate(der);
  assert.equal(root.curve, "P-256");
  assert.equal(root.signatureHash, "SHA-384");
  assert.equal(isCertificateAuthority(root), true);
});

/** `der` with its outer length rewritten: the DER of the same certificate must be refused. */
function withOuterLength(der: Uint8Array, header: number[]): Uint8Array {
  const contentStart = der[1] & 0x80 ? 2 + (der[1] & 0x7f) : 2;
  return new Uint8Array([...header, ...der.subarray(contentStart)]);
}

Deno.test("x509: what is not strict DER of a certificate is refused with a reason", async () => {
  const [leaf] = await realChain();
  const length = leaf.length - 4; // the leaf's outer header is 30 82 xx xx
  const cases: [string, Uint8Array, RegExp][] = [
    ["empty", new Uint8Array(), /cut short/],
    ["truncated", leaf.subarray(0, 500), /longer than what holds it/],
    ["trailing byte", new Uint8Array([...leaf, 0]), /bytes follow the certificate/],
    ["indefinite length", withOuterLength(leaf, [0x30, 0x80]), /length DER does not allow/],
    [
      "non-minimal length",
      withOuterLength(leaf, [0x30, 0x83, 0, length >> 8, length & 0xff]),
      /length DER does not allow/,
    ],
    ["not a sequence", new Uint8Array([0x31, ...leaf.subarray(1)]), /not where it should be/],
  ];
  for (const [what, der, reason] of cases) {
    assert.throws(() => readCertificate(der), (error: unknown) => {
      assert.ok(error instanceof CertificateError, `${what}: ${error}`);
      assert.match(error.message, reason, what);
      return true;
    });
  }
  // An RSA certificate is a certificate, but not one of Apple's chain.
  const rsa = await crypto.subtle.generateKey(
    {
      name: "RSASSA-PKCS1-v1_5",
      modulusLength: 2048,
      publicExponent: new Uint8Array([1, 0, 1]),
      hash: "SHA-256",
    },
    true,
    ["sign", "verify"],
  );
  const certificate = new pkijs.Certificate();
  certificate.serialNumber = new (await import("asn1js")).Integer({ value: 1 });
  certificate.notBefore.value = new Date(0);
  certificate.notAfter.value = new Date(2_000_000_000_000);
  await certificate.subjectPublicKeyInfo.importKey(rsa.publicKey);
  await certificate.sign(rsa.privateKey, "SHA-256");
  assert.throws(
    () => readCertificate(new Uint8Array(certificate.toSchema(true).toBER())),
    /not ECDSA/,
  );
});

Deno.test("x509: any change to a real certificate reads or is refused, never throws otherwise", async () => {
  const chain = await realChain();
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 2 }),
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), {
        minLength: 1,
        maxLength: 4,
      }),
      fc.nat(),
      (which, edits, cut) => {
        const der = chain[which].slice(0, chain[which].length - (cut % 3 === 0 ? cut % 40 : 0));
        for (const [at, value] of edits) der[at % der.length] = value;
        try {
          readCertificate(der);
        } catch (error) {
          if (!(error instanceof CertificateError)) throw error;
        }
      },
    ),
    { numRuns: 3_000 },
  );
});
