/**
 * The store A JWS verifier against material no one here made: real Apple-signed Sandbox
 * notifications (built-in pin only) and Apple's library mocks (their test CA as the root).
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import {
  APPLE_ROOT_CA_G3_SHA256,
  CHAIN_CACHE_LIMIT,
  JwsInvalidError,
  MAX_CERTIFICATE_BYTES,
  MAX_HEADER_CHARS,
  readRootCertificates,
  StoreaJwsVerifier,
  UnseenChainBudgetError,
} from "../src/storea/jws.ts";
import { createHash } from "node:crypto";
import {
  createStoreaTestPki,
  forgeStoreaLeaf,
  type StoreaTestPkiOptions,
} from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import type { Es256Engine } from "../src/crypto/es256.ts";

/** Every test that checks a signature runs on both ES256 engines. */
const ENGINES: Es256Engine[] = ["openssl", "webcrypto"];

const VECTORS = fileURLToPath(new URL("./fixtures/storea/", import.meta.url));

interface IndexEntry {
  file: string;
  notificationType: string;
  subtype: string | null;
  notificationUUID: string;
  bundleId: string;
  originalTransactionId: string;
  transactionId: string;
  productId: string;
  hasRenewalInfo: boolean;
}

async function vector(path: string): Promise<string> {
  return (await Deno.readTextFile(`${VECTORS}${path}`)).trim();
}

function encodeSegment(value: unknown): string {
  return btoa(JSON.stringify(value)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

function decodeSegment(segment: string): Record<string, unknown> {
  return JSON.parse(atob(segment.replaceAll("-", "+").replaceAll("_", "/")));
}

async function rejects(verifier: StoreaJwsVerifier, jws: string, reason: RegExp): Promise<void> {
  await assert.rejects(verifier.verify(jws), (error: unknown) => {
    assert.ok(error instanceof JwsInvalidError, `expected JwsInvalidError, got ${error}`);
    assert.match(error.message, reason);
    return true;
  });
}

Deno.test({
  name: "real Apple notifications and their nested JWS verify with the built-in pin alone",
  fn: async () => {
    for (const engine of ENGINES) await verifyRealVectors(new StoreaJwsVerifier({ engine }));
  },
});

async function verifyRealVectors(verifier: StoreaJwsVerifier): Promise<void> {
  const index: IndexEntry[] = JSON.parse(await vector("real-sandbox/index.json"));
  assert.equal(index.length, 14);
  {
    for (const entry of index) {
      const payload = await verifier.verify(await vector(`real-sandbox/${entry.file}`));
      assert.equal(payload.notificationType, entry.notificationType, entry.file);
      assert.equal(payload.subtype ?? null, entry.subtype, entry.file);
      assert.equal(payload.notificationUUID, entry.notificationUUID, entry.file);
      const data = payload.data as Record<string, unknown>;
      assert.equal(data.bundleId, entry.bundleId);
      const transaction = await verifier.verify(data.signedTransactionInfo as string);
      assert.equal(transaction.transactionId, entry.transactionId, entry.file);
      assert.equal(transaction.originalTransactionId, entry.originalTransactionId, entry.file);
      assert.equal(transaction.productId, entry.productId, entry.file);
      assert.equal(typeof data.signedRenewalInfo === "string", entry.hasRenewalInfo, entry.file);
      if (entry.hasRenewalInfo) {
        const renewal = await verifier.verify(data.signedRenewalInfo as string);
        assert.equal(renewal.originalTransactionId, entry.originalTransactionId, entry.file);
      }
    }
  }
}

Deno.test({
  name: "the pin is Apple Root CA - G3: the shipped root file has the pinned SHA-256",
  fn: async () => {
    const der = await Deno.readFile(`${VECTORS}roots/AppleRootCA-G3.cer`);
    assert.equal(createHash("sha256").update(der).digest("hex"), APPLE_ROOT_CA_G3_SHA256);
  },
});

Deno.test({
  name: "a real notification changed by one field or one signature byte is rejected",
  fn: async () => {
    for (const engine of ENGINES) await rejectTamperedVector(new StoreaJwsVerifier({ engine }));
  },
});

async function rejectTamperedVector(verifier: StoreaJwsVerifier): Promise<void> {
  {
    const jws = await vector("real-sandbox/notification-01.jws");
    await verifier.verify(jws); // the chain is now cached: the rejections below are signatures
    const [header, payload, signature] = jws.split(".");

    const decoded = decodeSegment(payload);
    decoded.notificationType = "REFUND";
    await rejects(verifier, `${header}.${encodeSegment(decoded)}.${signature}`, /signature/);

    const sigChars = signature.split("");
    sigChars[10] = sigChars[10] === "A" ? "B" : "A";
    await rejects(verifier, `${header}.${payload}.${sigChars.join("")}`, /signature/);

    const headerObject = decodeSegment(header);
    await rejects(
      verifier,
      `${encodeSegment({ ...headerObject, alg: "ES384" })}.${payload}.${signature}`,
      /alg must be ES256/,
    );
    await rejects(
      verifier,
      `${encodeSegment({ ...headerObject, alg: "none" })}.${payload}.`,
      /not a compact JWS/,
    );
    const x5c = headerObject.x5c as string[];
    await rejects(
      verifier,
      `${encodeSegment({ ...headerObject, x5c: x5c.slice(0, 2) })}.${payload}.${signature}`,
      /exactly 3 certificates/,
    );
  }
}

Deno.test({
  name: "a chain ending in another root is refused by the pin; with that root configured it passes",
  fn: async () => {
    const mock = await vector("library-mocks/testNotification");
    await rejects(new StoreaJwsVerifier(), mock, /Apple Root CA - G3/);

    const roots = await readRootCertificates([`${VECTORS}library-mocks/testCA.der`]);
    const payload = await new StoreaJwsVerifier({ rootCertificates: roots }).verify(mock);
    assert.equal(payload.notificationType, "TEST");
  },
});

Deno.test({
  name: "Apple's library mocks verify with testCA.der as the root, and only with it",
  fn: async () => {
    const roots = await readRootCertificates([`${VECTORS}library-mocks/testCA.der`]);
    const verifier = new StoreaJwsVerifier({ rootCertificates: roots });

    const transaction = await verifier.verify(await vector("library-mocks/transactionInfo"));
    assert.equal(transaction.bundleId, "com.example");
    const renewal = await verifier.verify(await vector("library-mocks/renewalInfo"));
    assert.deepEqual(renewal, { environment: "Sandbox", signedDate: 1672956154000 });
    // Cryptographically fine; the bundle is checked by the caller, not here.
    const wrong = await verifier.verify(await vector("library-mocks/wrongBundleId"));
    assert.equal((wrong.data as Record<string, unknown>).bundleId, "com.example.wrong");
    await rejects(verifier, await vector("library-mocks/missingX5CHeaderClaim"), /x5c/);

    // Custom roots replace the pin: a real Apple chain is no longer trusted.
    await rejects(
      verifier,
      await vector("real-sandbox/notification-01.jws"),
      /not signed by a trusted root/,
    );
  },
});

Deno.test({
  name: "STOREA_ROOT_CERTS files may be DER or PEM; anything else stops the boot",
  fn: async () => {
    const der = await Deno.readFile(`${VECTORS}roots/AppleRootCA-G3.cer`);
    const dir = await Deno.makeTempDir();
    try {
      const pem = `-----BEGIN CERTIFICATE-----\n${
        btoa(String.fromCharCode(...der)).replace(/(.{64})/g, "$1\n")
      }\n-----END CERTIFICATE-----\n`;
      await Deno.writeTextFile(`${dir}/root.pem`, pem);
      const [fromPem] = await readRootCertificates([`${dir}/root.pem`]);
      assert.deepEqual(fromPem, der);
      const verifier = new StoreaJwsVerifier({ rootCertificates: [fromPem] });
      await verifier.verify(await vector("real-sandbox/notification-02.jws"));

      await Deno.writeTextFile(`${dir}/garbage.pem`, "not a certificate");
      await assert.rejects(readRootCertificates([`${dir}/garbage.pem`]), /does not parse/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("malformed input is rejected with a reason, never thrown as something else", async () => {
  const verifier = new StoreaJwsVerifier();
  await rejects(verifier, "", /not a compact JWS/);
  await rejects(verifier, "a.b", /not a compact JWS/);
  await rejects(verifier, "!!!.e30.sig", /header/);
  await rejects(verifier, `${encodeSegment([1])}.e30.sig`, /header is not a JSON object/);
  await rejects(verifier, `${encodeSegment({ alg: "ES256" })}.e30.sig`, /x5c/);
  await rejects(
    verifier,
    `${encodeSegment({ alg: "ES256", x5c: ["AAAA", "AAAA", "AAAA"] })}.e30.sig`,
    /does not parse/,
  );
});

/** A verifier trusting `pki`'s root, and a JWS of a sample transaction signed by it. */
async function signedWith(
  options: StoreaTestPkiOptions = {},
  payload: Record<string, unknown> = {},
  engine: Es256Engine = "openssl",
) {
  const pki = await createStoreaTestPki(options);
  const signer = new StoreaSigner(pki);
  const jws = await signer.signRaw({ ...signer.sampleTransaction(), ...payload });
  const verifier = new StoreaJwsVerifier({ rootCertificates: [pki.rootDer], engine });
  return { pki, signer, jws, verifier };
}

Deno.test("a simulator chain verifies with its root configured, and the chain is cached", async () => {
  for (const engine of ENGINES) {
    const { signer, jws, verifier } = await signedWith({}, {}, engine);
    const payload = await verifier.verify(jws);
    assert.equal(payload.bundleId, signer.sampleTransaction().bundleId);
    // Another JWS on the same chain: the cached chain still demands a valid signature.
    const other = await signer.signRaw({ ...signer.sampleTransaction(), transactionId: "42" });
    assert.equal((await verifier.verify(other)).transactionId, "42");
    const [header, , signature] = jws.split(".");
    const [, otherPayload] = other.split(".");
    await rejects(verifier, `${header}.${otherPayload}.${signature}`, /signature/);
  }
});

Deno.test("signing inputs of every size are checked as signed, one after another", async () => {
  for (const engine of ENGINES) {
    const { signer, jws, verifier } = await signedWith({}, {}, engine);
    await verifier.verify(jws);
    // Larger than the buffer signing inputs are written into, then smaller again: each is checked
    // against its own bytes, none against what the one before left behind.
    const large = await signer.signRaw({
      ...signer.sampleTransaction(),
      note: "x".repeat(100_000),
    });
    const small = await signer.signRaw({ ...signer.sampleTransaction(), transactionId: "7" });
    assert.equal((await verifier.verify(large)).note, "x".repeat(100_000));
    assert.equal((await verifier.verify(small)).transactionId, "7");
    const [header, smallPayload, smallSignature] = small.split(".");
    const [, largePayload, largeSignature] = large.split(".");
    await rejects(verifier, `${header}.${largePayload}.${smallSignature}`, /signature/);
    await rejects(verifier, `${header}.${smallPayload}.${largeSignature}`, /signature/);
    assert.equal((await verifier.verify(small)).transactionId, "7");
  }
});

Deno.test("a cached header still has its validity window and its signer checked", async () => {
  const validTo = Date.now() + 3_600_000;
  const { pki, signer, jws, verifier } = await signedWith({ leaf: { validTo } });
  await verifier.verify(jws);
  const [header] = jws.split(".");
  // Same header, so the cached chain: signed after the leaf expired, it is refused all the same.
  const late = await signer.signRaw({
    ...signer.sampleTransaction(),
    signedDate: validTo + 90_000,
  });
  assert.equal(late.split(".")[0], header);
  await rejects(verifier, late, /not valid at signedDate/);
  // Same header, signed by another key: the cached chain's leaf key decides, and refuses it.
  const impostor = new StoreaSigner({ ...await createStoreaTestPki(), x5c: pki.x5c });
  const forged = await impostor.signRaw(impostor.sampleTransaction());
  assert.equal(forged.split(".")[0], header);
  await rejects(verifier, forged, /signature does not verify/);
  assert.equal(verifier.chainChecks, 1);
});

Deno.test("every broken chain is rejected with its reason", async () => {
  const cases: [StoreaTestPkiOptions, RegExp][] = [
    [{ leafMarker: false }, /leaf lacks Apple's App Store signing marker/],
    [{ intermediateMarker: false }, /intermediate lacks Apple's WWDR marker/],
    [{ intermediateIsCa: false }, /not a certificate authority/],
    [{ leafSignedBy: "root" }, /leaf is not signed by the intermediate/],
    [{ leafIssuerCommonName: "Someone Else" }, /leaf is not signed by the intermediate/],
    [{ leaf: { validTo: Date.now() - 3_600_000 } }, /not valid at signedDate/],
    [{ intermediate: { validFrom: Date.now() + 3_600_000 } }, /not valid at signedDate/],
    // The trusted root's own validity counts too, though it is configured, not presented.
    [{ root: { validTo: Date.now() - 3_600_000 } }, /not valid at signedDate/],
    [{ root: { validFrom: Date.now() + 3_600_000 } }, /not valid at signedDate/],
    [{ leafSignedBy: "stranger" }, /leaf is not signed by the intermediate/],
  ];
  for (const [options, reason] of cases) {
    const { jws, verifier } = await signedWith(options);
    await rejects(verifier, jws, reason);
  }
});

Deno.test("a forged chain under a valid signature has its certificates checked once", async () => {
  // An attacker's own leaf naming the real intermediate as its issuer, signed with its own key:
  // its JWS's signature verifies, so the chain is checked. Sent again and again, it used to cost
  // the certificates' signature checks every time.
  const forged = await signedWith({ leafSignedBy: "root" });
  const other = await signedWith({ leafMarker: false });
  const honest = await signedWith();
  const verifier = new StoreaJwsVerifier({
    rootCertificates: [forged.pki.rootDer, other.pki.rootDer, honest.pki.rootDer],
    engine: "openssl",
  });
  for (let i = 0; i < 20; i++) {
    await rejects(verifier, forged.jws, /leaf is not signed by the intermediate/);
  }
  // Respelled headers around the same chain, each signed anew: still the one check.
  for (let i = 0; i < 5; i++) {
    const respelled = await forged.signer.signRaw(forged.signer.sampleTransaction(), {
      kid: `${i}`,
    });
    await rejects(verifier, respelled, /leaf is not signed by the intermediate/);
  }
  assert.equal(verifier.chainChecks, 1);
  assert.equal(verifier.cachedChains, 0);
  // A refusal is the chain's own: another chain is checked on its own account.
  for (let i = 0; i < 3; i++) {
    await rejects(verifier, other.jws, /lacks Apple's App Store signing marker/);
  }
  assert.equal(verifier.chainChecks, 2);
  // On the same verifier, with refusals remembered, an honest chain still verifies, and is
  // cached: checked once, however often it comes.
  for (let i = 0; i < 3; i++) await verifier.verify(honest.jws);
  assert.equal(verifier.chainChecks, 3);
  assert.equal(verifier.cachedChains, 1);
});

Deno.test("validity is judged at signedDate, with 60 s of tolerance", async () => {
  const now = Date.now();
  const { jws: expiredButSignedBefore, verifier } = await signedWith(
    { leaf: { validFrom: now - 10 * 86_400_000, validTo: now - 86_400_000 } },
    { signedDate: now - 2 * 86_400_000 },
  );
  await verifier.verify(expiredButSignedBefore);

  const validTo = now - 86_400_000;
  const inTolerance = await signedWith({ leaf: { validTo } }, { signedDate: validTo + 30_000 });
  await inTolerance.verifier.verify(inTolerance.jws);
  const beyond = await signedWith({ leaf: { validTo } }, { signedDate: validTo + 90_000 });
  await rejects(beyond.verifier, beyond.jws, /not valid at signedDate/);
});

Deno.test("a chain from an untrusted root is rejected even if it is well formed", async () => {
  const { jws } = await signedWith();
  const stranger = await createStoreaTestPki();
  await rejects(
    new StoreaJwsVerifier({ rootCertificates: [stranger.rootDer] }),
    jws,
    /not signed by a trusted root/,
  );
  // The built-in pin refuses any root that is not Apple's, whatever x5c[2] claims.
  await rejects(new StoreaJwsVerifier(), jws, /Apple Root CA - G3/);
});

Deno.test("x5c is decoded strictly, even under a valid signature", async () => {
  // A chain with a padded certificate, for the last check: a fresh chain has none about one time
  // in 27 (each certificate's length is a multiple of 3 one time in 3).
  let chain = await signedWith();
  for (let tries = 1; !chain.pki.x5c.some((text) => text.endsWith("=")); tries++) {
    assert.ok(tries < 20, "20 fresh chains without a padded certificate");
    chain = await signedWith();
  }
  const { pki, signer, verifier } = chain;
  const [leaf, intermediate, root] = pki.x5c;
  const variants: [string, string[]][] = [
    ["a line break", [leaf.slice(0, 64) + "\n" + leaf.slice(64), intermediate, root]],
    ["a trailing space", [leaf, intermediate + " ", root]],
    ["padding removed", [leaf, intermediate, root.replace(/=+$/, "")]],
    ["the URL alphabet", [leaf.replaceAll("+", "-").replaceAll("/", "_"), intermediate, root]],
  ];
  for (const [what, x5c] of variants) {
    if (x5c.every((text, i) => text === pki.x5c[i])) continue; // nothing to change in this chain
    const jws = await signer.signRaw(signer.sampleTransaction(), { x5c });
    await rejects(verifier, jws, /not canonical base64/);
    assert.equal(verifier.cachedChains, 0, what);
  }
  // Non-zero bits in the last character before the padding: another spelling of the same bytes.
  const padded = [leaf, intermediate, root].find((text) => text.endsWith("="))!;
  const stem = padded.replace(/=+$/, "");
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const last = alphabet.indexOf(stem.at(-1)!);
  const respelled = stem.slice(0, -1) + alphabet[last + 1] + padded.slice(stem.length);
  const x5c = pki.x5c.map((text) => text === padded ? respelled : text);
  await rejects(verifier, await signer.signRaw({}, { x5c }), /not canonical base64/);

  assert.ok(await verifier.verify(await signer.signRaw(signer.sampleTransaction())));
});

Deno.test("oversized certificates and headers are refused before anything is parsed", async () => {
  const { pki, signer, verifier } = await signedWith();
  const big = new Uint8Array(MAX_CERTIFICATE_BYTES + 1).toBase64();
  await rejects(
    verifier,
    await signer.signRaw({}, { x5c: [big, pki.x5c[1], pki.x5c[2]] }),
    new RegExp(`leaf certificate is larger than ${MAX_CERTIFICATE_BYTES} bytes`),
  );
  const longHeader = await signer.signRaw({}, { filler: "x".repeat(MAX_HEADER_CHARS) });
  await rejects(verifier, longHeader, /header is longer than/);
});

Deno.test("the signature is checked before the chain, and only a signing leaf's chain is cached", async () => {
  for (const engine of ENGINES) {
    // A chain that would fail its checks, under a signature that fails: the signature is named.
    const broken = await signedWith({ leafMarker: false }, {}, engine);
    const [header, payload, signature] = broken.jws.split(".");
    const flipped = signature.slice(0, 10) + (signature[10] === "A" ? "B" : "A") +
      signature.slice(11);
    await rejects(broken.verifier, `${header}.${payload}.${flipped}`, /signature does not verify/);
    await rejects(broken.verifier, broken.jws, /lacks Apple's App Store signing marker/);
    assert.equal(broken.verifier.cachedChains, 0);

    // Apple's real chain under garbage signatures: refused, and nothing is cached.
    const verifier = new StoreaJwsVerifier({ engine });
    const real = await vector("real-sandbox/notification-01.jws");
    const [realHeader, realPayload] = real.split(".");
    for (let i = 0; i < 5; i++) {
      const garbage = crypto.getRandomValues(new Uint8Array(64)).toBase64({
        alphabet: "base64url",
        omitPadding: true,
      });
      await rejects(verifier, `${realHeader}.${realPayload}.${garbage}`, /signature/);
    }
    assert.equal(verifier.cachedChains, 0);
    await verifier.verify(real);
    assert.equal(verifier.cachedChains, 1);
  }
});

Deno.test("the chain cache keeps at most CHAIN_CACHE_LIMIT chains, the most recently used", async () => {
  const first = await signedWith();
  const verifier = first.verifier;
  await verifier.verify(first.jws);
  const roots = [first.pki.rootDer];
  const signers = [];
  for (let i = 0; i < CHAIN_CACHE_LIMIT + 4; i++) {
    const pki = await createStoreaTestPki();
    roots.push(pki.rootDer);
    signers.push(new StoreaSigner(pki));
  }
  const all = new StoreaJwsVerifier({ rootCertificates: roots });
  for (const signer of signers) {
    // From the store: so many new chains at once would spend the budget of chains from anyone.
    await all.verify(await signer.signRaw(signer.sampleTransaction()), { from: "store" });
    // The first chain is used all along, so it is never the least recently used.
    await all.verify(first.jws);
  }
  assert.equal(all.cachedChains, CHAIN_CACHE_LIMIT);
});

/** A JWS of `signer`'s sample transaction under a leaf forged against `pki`'s intermediate. */
async function forgedJws(pki: Awaited<ReturnType<typeof createStoreaTestPki>>): Promise<string> {
  const forged = await forgeStoreaLeaf(pki.certificates.intermediate);
  const signer = new StoreaSigner({
    ...pki,
    x5c: [forged.x5c, pki.x5c[1], pki.x5c[2]],
    leafPrivateKey: forged.privateKey,
  });
  return await signer.signRaw(signer.sampleTransaction());
}

Deno.test("a forged leaf under a verified intermediate is refused by the kept intermediate", async () => {
  for (const engine of ENGINES) {
    const honest = await signedWith({}, {}, engine);
    const { pki, verifier } = honest;
    await verifier.verify(honest.jws);
    // Leaves anyone can make: Apple's marker, the intermediate named byte for byte as the issuer,
    // signed with their own keys. Each JWS verifies with its leaf, so each chain is checked, but
    // against the intermediate already verified: its key decides, the roots are not asked again.
    for (let i = 0; i < 4; i++) {
      await rejects(verifier, await forgedJws(pki), /leaf is not signed by the intermediate/);
    }
    assert.equal(verifier.chainChecks, 5);
    assert.equal(verifier.intermediateChecks, 1, engine);
    assert.equal(verifier.cachedChains, 1);
  }
});

Deno.test("unseen chains from anyone are refused past the budget, never a verified one", async () => {
  let now = 0;
  const honest = await signedWith();
  const other = await createStoreaTestPki();
  const otherSigner = new StoreaSigner(other);
  const verifier = new StoreaJwsVerifier({
    rootCertificates: [honest.pki.rootDer, other.rootDer],
    engine: "openssl",
    unseenChainBudget: { perSecond: 1, burst: 3, now: () => now },
  });
  await verifier.verify(honest.jws);
  const forgeries = await Promise.all(Array.from({ length: 8 }, () => forgedJws(honest.pki)));
  // Two tokens left: two forged chains are checked and refused for what they are...
  for (const jws of forgeries.slice(0, 2)) {
    await rejects(verifier, jws, /leaf is not signed by the intermediate/);
  }
  // ...the rest are refused unchecked, with the wait for the next token.
  for (const jws of forgeries.slice(2)) {
    await assert.rejects(verifier.verify(jws), (error: unknown) => {
      assert.ok(error instanceof UnseenChainBudgetError, `got ${error}`);
      assert.ok(error.retryAfterSeconds > 0 && error.retryAfterSeconds <= 1);
      return true;
    });
  }
  assert.equal(verifier.chainChecks, 3);
  assert.equal(verifier.unseenChainsRefused, 6);
  // A chain refused before is known by its digest, budget or not: refused for what it is.
  await rejects(verifier, forgeries[0], /leaf is not signed by the intermediate/);

  // With the budget spent, what verified before still verifies: the same header, and the same
  // chain under a header spelled anew.
  await verifier.verify(honest.jws);
  const respelled = await honest.signer.signRaw(honest.signer.sampleTransaction(), { kid: "x" });
  assert.notEqual(respelled.split(".")[0], honest.jws.split(".")[0]);
  await verifier.verify(respelled);
  // A genuine chain never seen waits for the budget when anyone posts it; read from the store's
  // own API it is checked at once.
  const fresh = await otherSigner.signRaw(otherSigner.sampleTransaction());
  await assert.rejects(verifier.verify(fresh), UnseenChainBudgetError);
  await verifier.verify(fresh, { from: "store" });
  await verifier.verify(fresh);
  // The budget refills with time.
  now += 1_000;
  await rejects(verifier, forgeries[7], /leaf is not signed by the intermediate/);
  await assert.rejects(verifier.verify(forgeries[6]), UnseenChainBudgetError);
});

Deno.test("a burst of JWS under one unseen chain spends one token of the budget", async () => {
  // Apple's first notifications after a restart come at once, all under the same new chain: they
  // are one chain to check, not one each. Before, all but the budget's burst were refused 429.
  const honest = await signedWith();
  const verifier = new StoreaJwsVerifier({
    rootCertificates: [honest.pki.rootDer],
    engine: "openssl",
    unseenChainBudget: { perSecond: 0.001, burst: 1, now: () => 0 },
  });
  const burst = await Promise.all(
    Array.from({ length: 20 }, () => honest.signer.signRaw(honest.signer.sampleTransaction())),
  );
  const results = await Promise.allSettled(burst.map((jws) => verifier.verify(jws)));
  assert.deepEqual(results.filter((r) => r.status === "rejected"), []);
  assert.equal(verifier.unseenChainsRefused, 0);
  assert.equal(verifier.chainChecks, 1);
  // The token is spent: another unseen chain waits for the budget.
  const forged = await forgedJws(honest.pki);
  await assert.rejects(verifier.verify(forged), UnseenChainBudgetError);
});
