/** The store A simulators are trustworthy: real chains, real signatures, Apple's API rules. */
import assert from "node:assert/strict";
import * as pkijs from "pkijs";
import {
  compactVerify,
  decodeProtectedHeader,
  exportSPKI,
  generateKeyPair,
  importPKCS8,
  importX509,
  type JWTPayload,
  SignJWT,
} from "jose";
import {
  createStoreaTestPki,
  derToPem,
  STOREA_INTERMEDIATE_MARKER_OID,
  STOREA_LEAF_MARKER_OID,
  type StoreaTestPki,
  writeStoreaRootPem,
} from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  STOREA_API_ERRORS,
  type StoreaApiSimulator,
  storeaRateLimitedAnswer,
} from "../simulators/storea_api.ts";
import { TEST_ISSUER_ID, writeStoreaKeyFile } from "./helpers/fixtures.ts";

const ECDSA_WITH_SHA384 = "1.2.840.10045.4.3.3";
const KEY_ID = "ABC123DEFG";
const BUNDLE_ID = "com.example.app";

function parse(der: Uint8Array<ArrayBuffer>): pkijs.Certificate {
  return pkijs.Certificate.fromBER(der);
}

function chainOf(pki: StoreaTestPki) {
  const { leaf, intermediate, root } = pki.certificates;
  return { leaf: parse(leaf), intermediate: parse(intermediate), root: parse(root) };
}

function extensionIds(cert: pkijs.Certificate): string[] {
  return (cert.extensions ?? []).map((extension) => extension.extnID);
}

function isCa(cert: pkijs.Certificate): boolean | undefined {
  const extension = cert.extensions?.find((e) => e.extnID === "2.5.29.19");
  return (extension?.parsedValue as pkijs.BasicConstraints | undefined)?.cA;
}

function curveOf(cert: pkijs.Certificate): string | undefined {
  return (cert.subjectPublicKeyInfo.toJSON() as JsonWebKey).crv;
}

Deno.test("storea pki: leaf <- intermediate <- root verify, Apple-like algorithms and names", async () => {
  const pki = await createStoreaTestPki();
  const { leaf, intermediate, root } = chainOf(pki);

  assert.equal(await leaf.verify(intermediate), true);
  assert.equal(await intermediate.verify(root), true);
  assert.equal(await root.verify(root), true);
  // The leaf is not signed by the root: a check that verify() can say no.
  assert.equal(await leaf.verify(root), false);

  assert.ok(leaf.issuer.isEqual(intermediate.subject));
  assert.ok(intermediate.issuer.isEqual(root.subject));
  assert.ok(root.issuer.isEqual(root.subject));
  assert.equal(
    root.subject.typesAndValues.map((t) => `${t.type}=${t.value.valueBlock.value}`).join(", "),
    "2.5.4.3=Purchase Relay Test Root CA, 2.5.4.10=Purchase Relay Simulator, 2.5.4.6=US",
  );
  for (const cert of [leaf, intermediate, root]) {
    assert.equal(cert.version, 2);
    assert.equal(cert.signatureAlgorithm.algorithmId, ECDSA_WITH_SHA384);
  }
  assert.equal(curveOf(root), "P-384");
  assert.equal(curveOf(intermediate), "P-384");
  assert.equal(curveOf(leaf), "P-256");
  assert.equal(isCa(root), true);
  assert.equal(isCa(intermediate), true);
  assert.equal(isCa(leaf), false);
  assert.ok(extensionIds(leaf).includes(STOREA_LEAF_MARKER_OID));
  assert.ok(!extensionIds(leaf).includes(STOREA_INTERMEDIATE_MARKER_OID));
  assert.ok(extensionIds(intermediate).includes(STOREA_INTERMEDIATE_MARKER_OID));
  const marker = leaf.extensions?.find((e) => e.extnID === STOREA_LEAF_MARKER_OID);
  assert.deepEqual([...marker!.extnValue.valueBlock.valueHexView], [0x05, 0x00]);
  const now = new Date();
  for (const cert of [leaf, intermediate, root]) {
    assert.ok(cert.notBefore.value < now && now < cert.notAfter.value);
  }
});

Deno.test("storea pki: x5c, PEM and the root file carry the same DER", async () => {
  const pki = await createStoreaTestPki();
  const fromBase64 = (b64: string) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  assert.equal(pki.x5c.length, 3);
  assert.deepEqual(fromBase64(pki.x5c[0]), pki.certificates.leaf);
  assert.deepEqual(fromBase64(pki.x5c[1]), pki.certificates.intermediate);
  assert.deepEqual(fromBase64(pki.x5c[2]), pki.rootDer);
  assert.deepEqual(pki.certificates.root, pki.rootDer);

  const dir = await Deno.makeTempDir();
  try {
    const path = await writeStoreaRootPem(pki, `${dir}/root.pem`);
    const pem = await Deno.readTextFile(path);
    assert.equal(pem, derToPem(pki.rootDer));
    assert.match(
      pem,
      /^-----BEGIN CERTIFICATE-----\n([A-Za-z0-9+/=]{1,64}\n)+-----END CERTIFICATE-----\n$/,
    );
    const body = pem.replace(/-----[A-Z ]+-----/g, "").replaceAll("\n", "");
    assert.deepEqual(fromBase64(body), pki.rootDer);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("storea pki: options break the chain in the asked way only", async () => {
  const noLeafMarker = chainOf(await createStoreaTestPki({ leafMarker: false }));
  assert.ok(!extensionIds(noLeafMarker.leaf).includes(STOREA_LEAF_MARKER_OID));
  assert.ok(extensionIds(noLeafMarker.intermediate).includes(STOREA_INTERMEDIATE_MARKER_OID));
  assert.equal(await noLeafMarker.leaf.verify(noLeafMarker.intermediate), true);

  const noIntermediateMarker = chainOf(await createStoreaTestPki({ intermediateMarker: false }));
  assert.ok(
    !extensionIds(noIntermediateMarker.intermediate).includes(STOREA_INTERMEDIATE_MARKER_OID),
  );
  assert.ok(extensionIds(noIntermediateMarker.leaf).includes(STOREA_LEAF_MARKER_OID));

  const notCa = chainOf(await createStoreaTestPki({ intermediateIsCa: false }));
  assert.equal(isCa(notCa.intermediate), false);
  assert.equal(await notCa.intermediate.verify(notCa.root), true);

  const byRoot = chainOf(await createStoreaTestPki({ leafSignedBy: "root" }));
  assert.equal(await byRoot.leaf.verify(byRoot.intermediate), false);
  assert.equal(await byRoot.leaf.verify(byRoot.root), true);
  assert.ok(byRoot.leaf.issuer.isEqual(byRoot.root.subject));

  const badName = chainOf(await createStoreaTestPki({ leafIssuerCommonName: "Someone Else" }));
  assert.equal(await badName.leaf.verify(badName.intermediate), true);
  assert.ok(!badName.leaf.issuer.isEqual(badName.intermediate.subject));

  const expiredAt = Date.now() - 60_000;
  const expired = chainOf(await createStoreaTestPki({ leaf: { validTo: expiredAt } }));
  assert.equal(expired.leaf.notAfter.value.getTime(), Math.floor(expiredAt / 1000) * 1000);
  assert.ok(expired.intermediate.notAfter.value.getTime() > Date.now());

  const from = new Date("2020-01-01T00:00:00Z");
  const to = new Date("2060-01-01T00:00:00Z");
  const all = chainOf(await createStoreaTestPki({ validFrom: from, validTo: to }));
  for (const cert of [all.leaf, all.intermediate, all.root]) {
    assert.equal(cert.notBefore.value.getTime(), from.getTime());
    assert.equal(cert.notAfter.value.getTime(), to.getTime()); // GeneralizedTime after 2049
  }
});

Deno.test("storea signer: ES256 JWS with the 3-certificate x5c, verifiable with the leaf's key", async () => {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki);
  const leafKey = await importX509(derToPem(pki.certificates.leaf), "ES256");
  const otherLeafKey = await importX509(
    derToPem((await createStoreaTestPki()).certificates.leaf),
    "ES256",
  );

  const transaction = signer.sampleTransaction({ transactionId: "2000000000000042" });
  const jws = await signer.signTransaction(transaction);
  const { payload, protectedHeader } = await compactVerify(jws, leafKey, {
    algorithms: ["ES256"],
  });
  assert.deepEqual(protectedHeader, { alg: "ES256", x5c: pki.x5c });
  assert.deepEqual(JSON.parse(new TextDecoder().decode(payload)), transaction);
  await assert.rejects(compactVerify(jws, otherLeafKey), {
    code: "ERR_JWS_SIGNATURE_VERIFICATION_FAILED",
  });

  // One changed payload byte breaks the signature.
  const [h, p, s] = jws.split(".");
  const tampered = `${h}.${p.slice(0, 10)}${p[10] === "A" ? "B" : "A"}${p.slice(11)}.${s}`;
  await assert.rejects(compactVerify(tampered, leafKey));
});

Deno.test("storea signer: sample payloads have Apple's shape", async () => {
  const signer = new StoreaSigner(await createStoreaTestPki(), { environment: "Sandbox" });
  const before = Date.now();
  const transaction = signer.sampleTransaction({ transactionId: "2000000000000007" });
  assert.equal(transaction.transactionId, "2000000000000007");
  assert.equal(transaction.originalTransactionId, "2000000000000007");
  assert.equal(transaction.bundleId, BUNDLE_ID);
  assert.equal(transaction.type, "Auto-Renewable Subscription");
  assert.equal(transaction.environment, "Sandbox");
  assert.equal(transaction.currency, "USD");
  assert.equal(transaction.price, 9990);
  assert.equal(transaction.inAppOwnershipType, "PURCHASED");
  assert.equal(typeof transaction.expiresDate, "number");
  assert.match(transaction.webOrderLineItemId!, /^\d{16}$/);
  assert.match(transaction.appAccountToken!, /^[0-9a-f-]{36}$/);
  assert.ok(transaction.signedDate >= before && transaction.signedDate <= Date.now());

  const consumable = signer.sampleTransaction({ type: "Consumable", appAccountToken: undefined });
  assert.match(consumable.transactionId, /^\d{16}$/);
  for (const field of ["expiresDate", "webOrderLineItemId", "appAccountToken"]) {
    assert.ok(!(field in consumable), field);
  }

  const renewal = signer.sampleRenewalInfo({ originalTransactionId: "2000000000000007" });
  assert.equal(renewal.originalTransactionId, "2000000000000007");
  assert.equal(renewal.autoRenewStatus, 1);
  assert.equal(renewal.autoRenewProductId, renewal.productId);
  assert.equal(renewal.environment, "Sandbox");
});

Deno.test("storea signer: notifications nest signed transaction and renewal info", async () => {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki);
  const leafKey = await importX509(derToPem(pki.certificates.leaf), "ES256");
  const transaction = signer.sampleTransaction();
  const renewalInfo = signer.sampleRenewalInfo({
    originalTransactionId: transaction.originalTransactionId,
  });
  const decoded = await signer.notificationPayload({
    notificationType: "DID_RENEW",
    subtype: "BILLING_RECOVERY",
    transaction,
    renewalInfo,
    appAppleId: 1234,
    status: 1,
  });
  assert.equal(decoded.version, "2.0");
  assert.match(
    decoded.notificationUUID,
    /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
  );
  assert.equal(decoded.data.bundleId, BUNDLE_ID);
  assert.equal(decoded.data.environment, "Production");
  assert.equal(decoded.data.appAppleId, 1234);
  assert.equal(decoded.data.status, 1);
  const nestedTransaction = await compactVerify(decoded.data.signedTransactionInfo!, leafKey);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(nestedTransaction.payload)), transaction);
  const nestedRenewal = await compactVerify(decoded.data.signedRenewalInfo!, leafKey);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(nestedRenewal.payload)), renewalInfo);

  const signedPayload = await signer.signNotification(decoded);
  const outer = await compactVerify(signedPayload, leafKey);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(outer.payload)), decoded);

  const test = await signer.notificationPayload({ notificationType: "TEST" });
  assert.ok(!("subtype" in test));
  assert.ok(!("signedTransactionInfo" in test.data));
  assert.ok(!("appAppleId" in test.data));
  assert.notEqual(test.notificationUUID, decoded.notificationUUID);
});

Deno.test("storea signer: signRaw sets any header and still signs with the leaf key", async () => {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki);
  const leafKey = await importX509(derToPem(pki.certificates.leaf), "ES256");

  const es384 = await signer.signRaw({ a: 1 }, { alg: "ES384" });
  assert.deepEqual(decodeProtectedHeader(es384), { alg: "ES384", x5c: pki.x5c });
  await assert.rejects(compactVerify(es384, leafKey, { algorithms: ["ES256"] }));

  const noX5c = await signer.signRaw({ a: 1 }, { x5c: undefined });
  assert.deepEqual(decodeProtectedHeader(noX5c), { alg: "ES256" });
  await compactVerify(noX5c, leafKey); // the signature itself is good

  const twoCerts = await signer.signRaw({ a: 1 }, { x5c: pki.x5c.slice(0, 2) });
  assert.equal(decodeProtectedHeader(twoCerts).x5c?.length, 2);

  const rawBytes = await signer.signRaw(new TextEncoder().encode("not json"));
  const { payload } = await compactVerify(rawBytes, leafKey);
  assert.equal(new TextDecoder().decode(payload), "not json");
});

interface ApiFixture {
  api: StoreaApiSimulator;
  signer: StoreaSigner;
  privateKey: CryptoKey;
  privateKeyPem: string;
  cleanup(): Promise<void>;
}

async function startApi(options: { productionUnauthorized?: boolean } = {}): Promise<ApiFixture> {
  const dir = await Deno.makeTempDir();
  const privateKeyPem = await Deno.readTextFile(await writeStoreaKeyFile(dir));
  const signer = new StoreaSigner(await createStoreaTestPki());
  const api = await startStoreaApiSimulator({ signer, ...options });
  await api.addKey({ issuerId: TEST_ISSUER_ID, keyId: KEY_ID, bundleId: BUNDLE_ID, privateKeyPem });
  return {
    api,
    signer,
    privateKey: await importPKCS8(privateKeyPem, "ES256"),
    privateKeyPem,
    async cleanup() {
      await api.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** A token as the service must make it; `claims`/`header` change or (undefined) drop fields. */
function apiToken(
  key: CryptoKey,
  claims: JWTPayload = {},
  header: Record<string, unknown> = {},
): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({
    iss: TEST_ISSUER_ID,
    iat: now,
    exp: now + 1800,
    aud: "appstoreconnect-v1",
    bid: BUNDLE_ID,
    ...claims,
  })
    .setProtectedHeader({ alg: "ES256", kid: KEY_ID, typ: "JWT", ...header })
    .sign(key);
}

async function getTransaction(
  baseUrl: string,
  transactionId: string,
  token: string,
): Promise<{ status: number; headers: Headers; text: string }> {
  const response = await fetch(`${baseUrl}/inApps/v1/transactions/${transactionId}`, {
    headers: { Authorization: `Bearer ${token}` },
  });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

Deno.test("storea api: a good token gets the transaction signed by the simulator's PKI", async () => {
  const { api, signer, privateKey, cleanup } = await startApi();
  try {
    assert.match(api.productionUrl, /^http:\/\/127\.0\.0\.1:\d+\/production$/);
    assert.match(api.sandboxUrl, /^http:\/\/127\.0\.0\.1:\d+\/sandbox$/);
    const transaction = signer.sampleTransaction({ transactionId: "2000000000000001" });
    await api.addTransaction("sandbox", transaction);

    const token = await apiToken(privateKey);
    const found = await getTransaction(api.sandboxUrl, "2000000000000001", token);
    assert.equal(found.status, 200);
    assert.match(found.headers.get("content-type") ?? "", /^application\/json/);
    const { signedTransactionInfo } = JSON.parse(found.text);
    const leafKey = await importX509(derToPem(signer.pki.certificates.leaf), "ES256");
    const verified = await compactVerify(signedTransactionInfo, leafKey);
    assert.deepEqual(verified.protectedHeader.x5c, signer.pki.x5c);
    const decoded = JSON.parse(new TextDecoder().decode(verified.payload));
    assert.equal(decoded.transactionId, "2000000000000001");
    assert.equal(decoded.environment, "Sandbox"); // set to where it was stored

    // The same id is unknown in the other environment.
    const missing = await getTransaction(api.productionUrl, "2000000000000001", token);
    assert.equal(missing.status, 404);
    assert.deepEqual(JSON.parse(missing.text), {
      errorCode: 4040010,
      errorMessage: "Transaction id not found.",
    });
    const invalid = await getTransaction(api.productionUrl, "abc", token);
    assert.equal(invalid.status, 400);
    assert.deepEqual(JSON.parse(invalid.text), STOREA_API_ERRORS.invalidTransactionId);

    assert.deepEqual(
      api.requests.map(({ environment, transactionId, status }) => ({
        environment,
        transactionId,
        status,
      })),
      [
        { environment: "sandbox", transactionId: "2000000000000001", status: 200 },
        { environment: "production", transactionId: "2000000000000001", status: 404 },
        { environment: "production", transactionId: "abc", status: 400 },
      ],
    );
    assert.equal(api.tokensSeen, 1);
    await assert.rejects(
      api.addTransaction("production", { ...transaction, transactionId: "tx-1" }),
    );
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: every bad token is refused with 401 and an empty body", async () => {
  const { api, signer, privateKey, privateKeyPem, cleanup } = await startApi();
  try {
    await api.addTransaction(
      "production",
      signer.sampleTransaction({ transactionId: "2000000000000002" }),
    );
    const now = Math.floor(Date.now() / 1000);
    const otherKey = (await generateKeyPair("ES256")).privateKey;
    const cases: [string, Promise<string>, RegExp][] = [
      ["wrong key", apiToken(otherKey), /signature/],
      ["wrong aud", apiToken(privateKey, { aud: "appstoreconnect-v2" }), /^aud/],
      ["wrong bid", apiToken(privateKey, { bid: "com.example.other" }), /^bid/],
      ["wrong iss", apiToken(privateKey, { iss: "00000000-0000-0000-0000-000000000000" }), /^iss/],
      ["lifetime over 60 min", apiToken(privateKey, { iat: now, exp: now + 3601 }), /60 minutes/],
      ["expired", apiToken(privateKey, { iat: now - 1200, exp: now - 1 }), /expired/],
      ["iat in the future", apiToken(privateKey, { iat: now + 300, exp: now + 900 }), /future/],
      ["no typ", apiToken(privateKey, {}, { typ: undefined }), /typ/],
      ["unknown kid", apiToken(privateKey, {}, { kid: "ZZZ999ZZZZ" }), /kid/],
      ["no bid", apiToken(privateKey, { bid: undefined }), /^bid/],
    ];
    for (const [name, tokenPromise, reason] of cases) {
      const answer = await getTransaction(
        api.productionUrl,
        "2000000000000002",
        await tokenPromise,
      );
      assert.equal(answer.status, 401, name);
      assert.equal(answer.text, "", name);
      assert.match(api.requests.at(-1)?.authFailure ?? "", reason, name);
    }
    const missing = await fetch(`${api.productionUrl}/inApps/v1/transactions/2000000000000002`);
    assert.equal(missing.status, 401);
    await missing.body?.cancel();

    // Exactly 60 minutes is allowed, and the key also registers from SPKI or a CryptoKey.
    const good = await getTransaction(
      api.productionUrl,
      "2000000000000002",
      await apiToken(privateKey, { iat: now, exp: now + 3600 }),
    );
    assert.equal(good.status, 200);
    const spki = await exportSPKI(await publicHalf(privateKeyPem));
    await api.addKey({
      issuerId: TEST_ISSUER_ID,
      keyId: "SPKI000001",
      bundleId: BUNDLE_ID,
      publicKey: spki,
    });
    const bySpki = await apiToken(privateKey, {}, { kid: "SPKI000001" });
    assert.equal((await getTransaction(api.productionUrl, "2000000000000002", bySpki)).status, 200);
    const { publicKey, privateKey: otherPrivate } = await generateKeyPair("ES256");
    await api.addKey({
      issuerId: TEST_ISSUER_ID,
      keyId: "CRYPTOKEY1",
      bundleId: BUNDLE_ID,
      publicKey,
    });
    const byCryptoKey = await apiToken(otherPrivate, {}, { kid: "CRYPTOKEY1" });
    assert.equal(
      (await getTransaction(api.productionUrl, "2000000000000002", byCryptoKey)).status,
      200,
    );
  } finally {
    await cleanup();
  }
});

/** The public key of a PKCS#8 PEM, derived independently of the simulator (via node:crypto). */
async function publicHalf(privateKeyPem: string): Promise<CryptoKey> {
  const { createPrivateKey, createPublicKey } = await import("node:crypto");
  const spki = createPublicKey(createPrivateKey(privateKeyPem)).export({
    type: "spki",
    format: "der",
  });
  return await crypto.subtle.importKey(
    "spki",
    new Uint8Array(spki),
    { name: "ECDSA", namedCurve: "P-256" },
    true,
    ["verify"],
  );
}

Deno.test("storea api: production can answer 401 for an app never released", async () => {
  const { api, signer, privateKey, cleanup } = await startApi({ productionUnauthorized: true });
  try {
    const transaction = signer.sampleTransaction({ transactionId: "2000000000000003" });
    await api.addTransaction("production", transaction);
    await api.addTransaction("sandbox", transaction);
    const token = await apiToken(privateKey);
    const production = await getTransaction(api.productionUrl, "2000000000000003", token);
    assert.equal(production.status, 401);
    assert.equal(production.text, "");
    assert.equal((await getTransaction(api.sandboxUrl, "2000000000000003", token)).status, 200);
    api.productionUnauthorized = false;
    assert.equal((await getTransaction(api.productionUrl, "2000000000000003", token)).status, 200);
    assert.deepEqual(api.requests.map((r) => [r.environment, r.status]), [
      ["production", 401],
      ["sandbox", 200],
      ["production", 200],
    ]);
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: scripted answers apply to the next calls of one environment, in order", async () => {
  const { api, signer, privateKey, cleanup } = await startApi();
  try {
    await api.addTransaction(
      "production",
      signer.sampleTransaction({ transactionId: "2000000000000004" }),
    );
    const token = await apiToken(privateKey);
    const retryAt = Date.now() + 5000;
    api.script("production", storeaRateLimitedAnswer({ retryAt, times: 2 }));
    api.script("production", { status: 500, body: STOREA_API_ERRORS.generalInternalRetryable });

    for (let i = 0; i < 2; i++) {
      const limited = await getTransaction(api.productionUrl, "2000000000000004", token);
      assert.equal(limited.status, 429);
      // Apple's Retry-After is a UNIX time in milliseconds, not seconds.
      assert.equal(limited.headers.get("retry-after"), String(retryAt));
      assert.ok(Number(limited.headers.get("retry-after")) > 1e12);
      assert.deepEqual(JSON.parse(limited.text), {
        errorCode: 4290000,
        errorMessage: "Rate limit exceeded.",
      });
    }
    // Sandbox is not affected by production's script.
    assert.equal((await getTransaction(api.sandboxUrl, "2000000000000004", token)).status, 404);
    const failed = await getTransaction(api.productionUrl, "2000000000000004", token);
    assert.equal(failed.status, 500);
    assert.deepEqual(JSON.parse(failed.text), {
      errorCode: 5000001,
      errorMessage: "An unknown error occurred. Please try again.",
    });
    assert.equal((await getTransaction(api.productionUrl, "2000000000000004", token)).status, 200);
    assert.deepEqual(api.requests.map((r) => [r.environment, r.status]), [
      ["production", 429],
      ["production", 429],
      ["sandbox", 404],
      ["production", 500],
      ["production", 200],
    ]);
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: a scripted reset makes fetch reject; a delay slows the answer", async () => {
  const { api, signer, privateKey, cleanup } = await startApi();
  try {
    await api.addTransaction(
      "production",
      signer.sampleTransaction({ transactionId: "2000000000000005" }),
    );
    const token = await apiToken(privateKey);

    // After a normal call, so that a client reusing its connection would be caught retrying.
    assert.equal((await getTransaction(api.productionUrl, "2000000000000005", token)).status, 200);
    api.script("production", { reset: true });
    await assert.rejects(
      fetch(`${api.productionUrl}/inApps/v1/transactions/2000000000000005`, {
        headers: { Authorization: `Bearer ${token}` },
      }),
      TypeError,
    );
    assert.equal(api.requests.at(-1)?.status, null);

    api.script("production", { delayMs: 300 });
    const started = performance.now();
    const slow = await getTransaction(api.productionUrl, "2000000000000005", token);
    assert.equal(slow.status, 200);
    assert.ok(performance.now() - started >= 290, "answer came too early");

    // A client that gives up during a delay is recorded as unanswered.
    api.script("production", { delayMs: 5000, status: 500 });
    await assert.rejects(
      fetch(`${api.productionUrl}/inApps/v1/transactions/2000000000000005`, {
        headers: { Authorization: `Bearer ${token}` },
        signal: AbortSignal.timeout(100),
      }),
    );
    await waitFor(() => api.requests.length === 4);
    assert.deepEqual(api.requests.map((r) => r.status), [200, null, 200, null]);

    api.script("production", { status: 500, times: 3 });
    api.clearScripts("sandbox");
    assert.equal((await getTransaction(api.productionUrl, "2000000000000005", token)).status, 500);
    api.clearScripts();
    assert.equal((await getTransaction(api.productionUrl, "2000000000000005", token)).status, 200);
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: close cuts a pending delay short", async () => {
  const { api, privateKey, cleanup } = await startApi();
  api.script("sandbox", { delayMs: 10_000, status: 500 });
  const pending = fetch(`${api.sandboxUrl}/inApps/v1/transactions/2000000000000006`, {
    headers: { Authorization: `Bearer ${await apiToken(privateKey)}` },
  }).then((r) => r.body?.cancel(), (e: unknown) => e);
  await waitFor(() => api.tokensSeen === 1);
  const started = performance.now();
  await cleanup();
  assert.ok(performance.now() - started < 2000, "close waited for the delay");
  assert.ok((await pending) instanceof TypeError);
});

async function waitFor(condition: () => boolean, timeoutMs = 2000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
