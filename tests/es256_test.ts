/**
 * The two ES256 engines (src/crypto/es256.ts): OpenSSL through FFI must give the same answer as
 * WebCrypto for valid, tampered and malformed signatures, and both refuse keys that are not
 * P-256.
 */
import assert from "node:assert/strict";
import { createECDH, createPublicKey } from "node:crypto";
import {
  derSignature,
  type EcdsaCurve,
  type EcdsaHash,
  type Es256Engine,
  Es256EngineError,
  importEcdsaKey,
  importEs256Key,
  rawSignature,
  selectEs256Engine,
} from "../src/crypto/es256.ts";

const ENGINES: Es256Engine[] = ["openssl", "webcrypto"];
const ES256 = { name: "ECDSA", hash: "SHA-256" } as const;
/** The order of P-256's base point. */
const N = 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n;

async function keyPair() {
  const pair = await crypto.subtle.generateKey(
    { name: "ECDSA", namedCurve: "P-256" },
    true,
    ["sign", "verify"],
  );
  const spki = new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey));
  return { pair, spki };
}

function toBigInt(bytes: Uint8Array): bigint {
  return BigInt(`0x${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("") || "0"}`);
}

function toBytes(value: bigint): Uint8Array {
  return Uint8Array.from(
    value.toString(16).padStart(64, "0").match(/../g)!,
    (h) => parseInt(h, 16),
  );
}

Deno.test("es256: OpenSSL is available here, and auto picks it", async () => {
  assert.equal(await selectEs256Engine("openssl"), "openssl");
  assert.equal(await selectEs256Engine("auto"), "openssl");
  assert.equal(await selectEs256Engine("webcrypto"), "webcrypto");
});

Deno.test("es256: both engines agree on valid, tampered and malformed signatures", async () => {
  for (let round = 0; round < 20; round++) {
    const { pair, spki } = await keyPair();
    const keys = await Promise.all(ENGINES.map((engine) => importEs256Key(spki, engine)));
    assert.deepEqual(keys.map((key) => key.engine), ENGINES);
    const data = crypto.getRandomValues(new Uint8Array(1 + round * 200));
    const signature = new Uint8Array(await crypto.subtle.sign(ES256, pair.privateKey, data));
    const r = toBigInt(signature.subarray(0, 32));
    const s = toBigInt(signature.subarray(32));

    const flippedData = data.slice();
    flippedData[round % data.length] ^= 0x40;
    const flippedR = signature.slice();
    flippedR[round % 32] ^= 1;
    const flippedS = signature.slice();
    flippedS[32 + (round % 32)] ^= 0x80;
    const cases: [string, Uint8Array, Uint8Array, boolean][] = [
      ["valid", signature, data, true],
      ["other data", signature, flippedData, false],
      ["r changed", flippedR, data, false],
      ["s changed", flippedS, data, false],
      ["r = 0", new Uint8Array([...toBytes(0n), ...toBytes(s)]), data, false],
      ["s = 0", new Uint8Array([...toBytes(r), ...toBytes(0n)]), data, false],
      ["r + n", new Uint8Array([...toBytes((r + N) % 2n ** 256n), ...toBytes(s)]), data, false],
      ["all ones", new Uint8Array(64).fill(0xff), data, false],
      ["63 bytes", signature.subarray(0, 63), data, false],
      ["65 bytes", new Uint8Array([...signature, 0]), data, false],
      ["empty", new Uint8Array(0), data, false],
    ];
    for (const [name, sig, input, expected] of cases) {
      for (const key of keys) {
        assert.equal(await key.verify(sig, input), expected, `${name} with ${key.engine}`);
      }
    }
    // n - s is as valid as s in ECDSA; the engines must at least agree on it.
    const highS = new Uint8Array([...toBytes(r), ...toBytes(N - s)]);
    const answers = await Promise.all(keys.map((key) => key.verify(highS, data)));
    assert.equal(answers[0], answers[1], "engines disagree on n - s");
  }
});

Deno.test("es256: a key of another curve or type is refused by both engines", async () => {
  const p384 = await crypto.subtle.generateKey(
    { name: "ECDSA", namedCurve: "P-384" },
    true,
    ["sign", "verify"],
  );
  const p384Spki = new Uint8Array(await crypto.subtle.exportKey("spki", p384.publicKey));
  const k1 = createECDH("secp256k1");
  k1.generateKeys();
  const k1Spki = new Uint8Array(
    createPublicKey({
      key: {
        kty: "EC",
        crv: "secp256k1",
        x: k1.getPublicKey().subarray(1, 33).toString("base64url"),
        y: k1.getPublicKey().subarray(33).toString("base64url"),
      },
      format: "jwk",
    }).export({ type: "spki", format: "der" }),
  );
  for (const engine of ENGINES) {
    await assert.rejects(importEs256Key(p384Spki, engine), `P-384 with ${engine}`);
    await assert.rejects(importEs256Key(k1Spki, engine), `secp256k1 with ${engine}`);
    await assert.rejects(importEs256Key(new Uint8Array([0x30, 0x00]), engine), "garbage");
  }
});

Deno.test("es256: derSignature writes minimal DER integers", () => {
  const raw = new Uint8Array(64);
  raw[31] = 5; // r = 5
  raw[32] = 0x80; // s has its top bit set
  assert.deepEqual(
    Array.from(derSignature(raw)),
    [0x30, 0x26, 0x02, 0x01, 0x05, 0x02, 0x21, 0x00, 0x80, ...new Array(31).fill(0)],
  );
  assert.deepEqual(Array.from(derSignature(new Uint8Array(64))), [
    0x30,
    0x06,
    0x02,
    0x01,
    0x00,
    0x02,
    0x01,
    0x00,
  ]);
});

Deno.test("es256: without --allow-ffi, auto falls back to WebCrypto and openssl is refused", async () => {
  const script = `
    import { selectEs256Engine } from ${
    JSON.stringify(new URL("../src/crypto/es256.ts", import.meta.url).href)
  };
    const auto = await selectEs256Engine("auto");
    let refused = "";
    try { await selectEs256Engine("openssl"); } catch (error) { refused = error.code + ": " + error.message; }
    console.log(JSON.stringify({ auto, refused }));
  `;
  const file = await Deno.makeTempFile({ suffix: ".ts" });
  await Deno.writeTextFile(file, script);
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-check", "--allow-read", file],
    stdout: "piped",
    stderr: "piped",
  }).output();
  await Deno.remove(file);
  const text = new TextDecoder().decode(output.stdout);
  assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
  assert.deepEqual(JSON.parse(text), {
    auto: "webcrypto",
    refused: "CRYPTO_ENGINE_UNAVAILABLE: FFI is not permitted (--allow-ffi)",
  });
  assert.ok(new Es256EngineError("x") instanceof Error);
});

/** r || s of `size` bytes each as a DER `ECDSA-Sig-Value`, as certificates carry signatures. */
function derOf(raw: Uint8Array, size: number): Uint8Array {
  const integer = (bytes: Uint8Array) => {
    let start = 0;
    while (start < bytes.length - 1 && bytes[start] === 0) start++;
    const value = bytes.subarray(start);
    const pad = value[0] & 0x80 ? [0] : [];
    return [0x02, pad.length + value.length, ...pad, ...value];
  };
  const body = [...integer(raw.subarray(0, size)), ...integer(raw.subarray(size))];
  return new Uint8Array([0x30, body.length, ...body]);
}

Deno.test("ecdsa: certificate signatures on P-256 and P-384, with SHA-256 and SHA-384", async () => {
  const cases: [EcdsaCurve, EcdsaHash, number][] = [
    ["P-256", "SHA-256", 32],
    ["P-256", "SHA-384", 32],
    ["P-384", "SHA-384", 48],
    ["P-384", "SHA-256", 48],
  ];
  for (const [curve, hash, size] of cases) {
    const pair = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: curve }, true, [
      "sign",
      "verify",
    ]);
    const spki = new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey));
    const keys = await Promise.all(ENGINES.map((engine) => importEcdsaKey(spki, curve, engine)));
    for (let round = 0; round < 5; round++) {
      const data = crypto.getRandomValues(new Uint8Array(100 + round * 300));
      const raw = new Uint8Array(
        await crypto.subtle.sign({ name: "ECDSA", hash }, pair.privateKey, data),
      );
      const der = derOf(raw, size);
      assert.deepEqual(rawSignature(der, size), raw);
      const other: EcdsaHash = hash === "SHA-256" ? "SHA-384" : "SHA-256";
      const tampered = data.slice();
      tampered[round] ^= 1;
      for (const key of keys) {
        const label = `${curve} ${hash} ${key.engine}`;
        assert.equal(await key.verify(der, data, hash), true, label);
        assert.equal(await key.verify(der, tampered, hash), false, label);
        assert.equal(await key.verify(der, data, other), false, `${label}, other hash`);
        assert.equal(await key.verify(der.subarray(0, der.length - 1), data, hash), false, label);
      }
    }
    await assert.rejects(importEcdsaKey(spki, curve === "P-256" ? "P-384" : "P-256", "openssl"));
  }
});

Deno.test("ecdsa: only minimal DER of two positive integers is a signature", () => {
  const ok = new Uint8Array([0x30, 0x06, 0x02, 0x01, 0x05, 0x02, 0x01, 0x07]);
  assert.deepEqual(Array.from(rawSignature(ok, 2)!), [0, 5, 0, 7]);
  const refused: [string, number[]][] = [
    ["leading zero", [0x30, 0x07, 0x02, 0x02, 0x00, 0x05, 0x02, 0x01, 0x07]],
    ["negative", [0x30, 0x06, 0x02, 0x01, 0x85, 0x02, 0x01, 0x07]],
    ["zero", [0x30, 0x06, 0x02, 0x01, 0x00, 0x02, 0x01, 0x07]],
    ["trailing byte", [0x30, 0x07, 0x02, 0x01, 0x05, 0x02, 0x01, 0x07, 0x00]],
    ["too wide", [0x30, 0x07, 0x02, 0x02, 0x01, 0x05, 0x02, 0x01, 0x07]],
    ["not a sequence", [0x31, 0x06, 0x02, 0x01, 0x05, 0x02, 0x01, 0x07]],
  ];
  for (const [what, bytes] of refused) {
    assert.equal(rawSignature(new Uint8Array(bytes), what === "too wide" ? 1 : 2), null, what);
  }
});
