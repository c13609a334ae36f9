/**
 * ES256 signature checks (RFC 7518 3.4: ECDSA on P-256 with SHA-256) for keys that check many
 * signatures: the App Store's leaf key signs every JWS the service verifies, three per
 * notification. The same engines check the ECDSA signatures of the certificates in Apple's chain
 * (P-256 or P-384 keys, SHA-256 or SHA-384), so that a forged chain is refused by one native
 * check (src/storea/jws.ts).
 *
 * Two engines do the same check. `webcrypto` is Deno's WebCrypto, always there. `openssl` is
 * the system's OpenSSL 3 libcrypto called through Deno's FFI: on the development machine it
 * checks a signature in about 50 µs where WebCrypto takes 300–500 µs, which is most of what a
 * store A verification or notification costs (docs/benchmarks.md). `auto` takes OpenSSL when
 * the library opens and passes a self-test, and WebCrypto otherwise.
 */
import { RelayError } from "../errors.ts";

/** The engine that checks ES256 signatures. */
export type Es256Engine = "openssl" | "webcrypto";

/** What `CRYPTO_ENGINE` may ask for. */
export type Es256EngineChoice = "auto" | Es256Engine;

/** A P-256 public key ready to check signatures. */
export interface Es256VerifyingKey {
  readonly engine: Es256Engine;
  /** Whether `signature` (64 bytes, r || s) is a valid ES256 signature of `data`. */
  verify(signature: Uint8Array, data: Uint8Array): Promise<boolean>;
}

/** The requested engine cannot be used; `reason` says why. */
export class Es256EngineError extends RelayError {
  constructor(reason: string) {
    super("CRYPTO_ENGINE_UNAVAILABLE", reason);
  }
}

/** A curve of the keys in Apple's chain. */
export type EcdsaCurve = "P-256" | "P-384";

/** The hash of a certificate's ECDSA signature (`ecdsa-with-SHA256` or `-SHA384`). */
export type EcdsaHash = "SHA-256" | "SHA-384";

/** An EC public key that checks certificate signatures. */
export interface EcdsaVerifyingKey {
  readonly engine: Es256Engine;
  /**
   * Whether `signature`, a DER `ECDSA-Sig-Value` as X.509 carries it, is a valid signature of
   * `data` with `hash`.
   */
  verify(signature: Uint8Array, data: Uint8Array, hash: EcdsaHash): Promise<boolean>;
}

const ECDSA_P256 = { name: "ECDSA", namedCurve: "P-256" } as const;
const ES256 = { name: "ECDSA", hash: "SHA-256" } as const;
/** Bytes of each of r and s on a curve. */
const SCALAR_BYTES: Record<EcdsaCurve, number> = { "P-256": 32, "P-384": 48 };

/**
 * Where OpenSSL 3's libcrypto is installed, as absolute paths: Deno's `--allow-ffi=<path>` grants
 * a path, not a library name (a bare `libcrypto.so.3` is read as a file in the working directory),
 * so the service opens the file itself and src/process/permissions.ts grants exactly these paths. Linux:
 * Debian and Ubuntu (also the distroless image), then RHEL, Fedora and SUSE, then Alpine and Arch.
 * macOS: Homebrew's `openssl@3`; macOS's own unversioned libcrypto aborts the process when opened.
 */
export const LIBCRYPTO_PATHS: readonly string[] = Deno.build.os === "darwin"
  ? [
    "/opt/homebrew/opt/openssl@3/lib/libcrypto.3.dylib",
    "/usr/local/opt/openssl@3/lib/libcrypto.3.dylib",
  ]
  : [
    `/usr/lib/${Deno.build.arch}-linux-gnu/libcrypto.so.3`,
    "/usr/lib64/libcrypto.so.3",
    "/usr/lib/libcrypto.so.3",
  ];

/**
 * What is tried, in order: the paths above, then on Linux the soname, which the dynamic loader
 * looks up itself (`LD_LIBRARY_PATH`, other distributions); only an unscoped `--allow-ffi` lets
 * the soname through.
 */
const LIBCRYPTO_CANDIDATES = Deno.build.os === "darwin"
  ? LIBCRYPTO_PATHS
  : [...LIBCRYPTO_PATHS, "libcrypto.so.3"];

const LIBCRYPTO_SYMBOLS = {
  BIO_new_mem_buf: { parameters: ["buffer", "i32"], result: "pointer" },
  BIO_free: { parameters: ["pointer"], result: "i32" },
  d2i_PUBKEY_bio: { parameters: ["pointer", "pointer"], result: "pointer" },
  EVP_PKEY_free: { parameters: ["pointer"], result: "void" },
  EVP_PKEY_CTX_new: { parameters: ["pointer", "pointer"], result: "pointer" },
  EVP_PKEY_CTX_free: { parameters: ["pointer"], result: "void" },
  EVP_PKEY_verify_init: { parameters: ["pointer"], result: "i32" },
  EVP_PKEY_CTX_set_signature_md: { parameters: ["pointer", "pointer"], result: "i32" },
  EVP_PKEY_verify: {
    parameters: ["pointer", "buffer", "usize", "buffer", "usize"],
    result: "i32",
  },
  EVP_sha256: { parameters: [], result: "pointer" },
  EVP_sha384: { parameters: [], result: "pointer" },
  SHA256: { parameters: ["buffer", "usize", "buffer"], result: "pointer" },
  SHA384: { parameters: ["buffer", "usize", "buffer"], result: "pointer" },
  ERR_clear_error: { parameters: [], result: "void" },
} as const;

type Libcrypto = Deno.DynamicLibrary<typeof LIBCRYPTO_SYMBOLS>["symbols"];

/** The process's libcrypto, opened once: `null` until tried, then the library or why not. */
let libcrypto: { symbols: Libcrypto } | { failure: string } | null = null;

/**
 * Picks the engine for `choice`. `auto` falls back to WebCrypto when OpenSSL cannot be used;
 * `openssl` throws instead.
 * @throws {Es256EngineError} when `openssl` is asked for and cannot be used.
 */
export async function selectEs256Engine(choice: Es256EngineChoice): Promise<Es256Engine> {
  if (choice === "webcrypto") return "webcrypto";
  const failure = await openLibcrypto();
  if (failure === null) return "openssl";
  if (choice === "openssl") throw new Es256EngineError(failure);
  return "webcrypto";
}

/**
 * Why OpenSSL cannot be used here, or `null` when it can. Opens libcrypto on first call and
 * proves it with a self-test: a WebCrypto signature must verify and a tampered one must not.
 */
export async function openLibcrypto(): Promise<string | null> {
  if (libcrypto === null) {
    let refused = 0;
    libcrypto = { failure: `no libcrypto found (looked for ${LIBCRYPTO_PATHS.join(", ")})` };
    for (const path of LIBCRYPTO_CANDIDATES) {
      try {
        const library = Deno.dlopen(path, LIBCRYPTO_SYMBOLS);
        libcrypto = { symbols: library.symbols };
        break;
      } catch (error) {
        // A path outside a scoped --allow-ffi is refused: the next one may be granted.
        if (error instanceof Deno.errors.NotCapable) refused++;
      }
    }
    // Without --allow-ffi every path is refused: say so rather than "not found".
    if (refused === LIBCRYPTO_CANDIDATES.length) {
      libcrypto = { failure: "FFI is not permitted (--allow-ffi)" };
    }
    if ("symbols" in libcrypto && !await passesSelfTest()) {
      libcrypto = { failure: "libcrypto failed the ES256 self-test" };
    }
  }
  return "failure" in libcrypto ? libcrypto.failure : null;
}

/**
 * Imports a P-256 public key from its SubjectPublicKeyInfo DER for `engine`. WebCrypto parses
 * it first in both cases, so that only a valid P-256 point on the named curve gets through.
 * @throws when the key is not a usable P-256 key.
 */
export async function importEs256Key(
  spki: Uint8Array,
  engine: Es256Engine,
): Promise<Es256VerifyingKey> {
  const key = await crypto.subtle.importKey(
    "spki",
    spki as Uint8Array<ArrayBuffer>,
    ECDSA_P256,
    true,
    ["verify"],
  );
  if (engine === "webcrypto") return new WebCryptoKey(key);
  return new OpenSslKey(await openSslKeyOf(key));
}

/**
 * Imports an EC public key on `curve` from its SubjectPublicKeyInfo DER, to check certificate
 * signatures with `engine`; WebCrypto parses it first, as for {@linkcode importEs256Key}.
 * @throws when the key is not a usable key on `curve`.
 */
export async function importEcdsaKey(
  spki: Uint8Array,
  curve: EcdsaCurve,
  engine: Es256Engine,
): Promise<EcdsaVerifyingKey> {
  const key = await crypto.subtle.importKey(
    "spki",
    spki as Uint8Array<ArrayBuffer>,
    { name: "ECDSA", namedCurve: curve },
    true,
    ["verify"],
  );
  if (engine === "webcrypto") return new WebCryptoCertificateKey(key, SCALAR_BYTES[curve]);
  const native = await openSslKeyOf(key);
  return {
    engine: "openssl",
    verify: (signature, data, hash) => Promise.resolve(native.verify(signature, data, hash)),
  };
}

/** The OpenSSL key of a key WebCrypto parsed, from its canonical SubjectPublicKeyInfo. */
async function openSslKeyOf(key: CryptoKey): Promise<OpenSslPublicKey> {
  const failure = await openLibcrypto();
  if (failure !== null) throw new Es256EngineError(failure);
  const canonical = new Uint8Array(await crypto.subtle.exportKey("spki", key));
  return OpenSslPublicKey.fromSpki(canonical);
}

class WebCryptoKey implements Es256VerifyingKey {
  readonly engine = "webcrypto";
  #key: CryptoKey;

  constructor(key: CryptoKey) {
    this.#key = key;
  }

  async verify(signature: Uint8Array, data: Uint8Array): Promise<boolean> {
    if (signature.length !== 64) return false;
    return await crypto.subtle.verify(
      ES256,
      this.#key,
      signature as Uint8Array<ArrayBuffer>,
      data as Uint8Array<ArrayBuffer>,
    );
  }
}

class WebCryptoCertificateKey implements EcdsaVerifyingKey {
  readonly engine = "webcrypto";
  #key: CryptoKey;
  #scalarBytes: number;

  constructor(key: CryptoKey, scalarBytes: number) {
    this.#key = key;
    this.#scalarBytes = scalarBytes;
  }

  async verify(signature: Uint8Array, data: Uint8Array, hash: EcdsaHash): Promise<boolean> {
    // WebCrypto takes r || s, each as wide as the curve's order.
    const raw = rawSignature(signature, this.#scalarBytes);
    if (raw === null) return false;
    return await crypto.subtle.verify(
      { name: "ECDSA", hash },
      this.#key,
      raw as Uint8Array<ArrayBuffer>,
      data as Uint8Array<ArrayBuffer>,
    );
  }
}

/** Native handles of a key; freed when the key object is garbage-collected. */
interface OpenSslHandles {
  pkey: Deno.PointerValue;
  /** One verification context per hash used, made on first use. */
  contexts: Deno.PointerValue[];
}

const openSslHandles = new FinalizationRegistry<OpenSslHandles>(({ pkey, contexts }) => {
  const symbols = libcryptoSymbols();
  for (const context of contexts) symbols.EVP_PKEY_CTX_free(context);
  symbols.EVP_PKEY_free(pkey);
});

/** Digest lengths, and scratch space for each: JavaScript runs one verification at a time. */
const DIGESTS: Record<EcdsaHash, Uint8Array> = {
  "SHA-256": new Uint8Array(32),
  "SHA-384": new Uint8Array(48),
};

/** An EC public key in libcrypto, checking DER signatures synchronously. */
class OpenSslPublicKey {
  #handles: OpenSslHandles;
  // One context per hash, initialised once: EVP_PKEY_verify may be called on it repeatedly.
  #contexts = new Map<EcdsaHash, Deno.PointerValue>();

  private constructor(handles: OpenSslHandles) {
    this.#handles = handles;
  }

  static fromSpki(spki: Uint8Array): OpenSslPublicKey {
    const symbols = libcryptoSymbols();
    // A memory BIO over the key rather than d2i_PUBKEY's pointer to a pointer: taking a
    // buffer's address (Deno.UnsafePointer.of) needs an unscoped --allow-ffi.
    const bio = symbols.BIO_new_mem_buf(spki, spki.length);
    if (bio === null) throw new Es256EngineError("libcrypto could not read the public key");
    const pkey = symbols.d2i_PUBKEY_bio(bio, null);
    symbols.BIO_free(bio);
    if (pkey === null) {
      symbols.ERR_clear_error();
      throw new Es256EngineError("libcrypto could not read the public key");
    }
    const key = new OpenSslPublicKey({ pkey, contexts: [] });
    openSslHandles.register(key, key.#handles);
    // Made now, so that a key libcrypto cannot check with fails here rather than at each check.
    key.#contextFor("SHA-256");
    return key;
  }

  #contextFor(hash: EcdsaHash): Deno.PointerValue {
    let context = this.#contexts.get(hash);
    if (context !== undefined) return context;
    const symbols = libcryptoSymbols();
    context = symbols.EVP_PKEY_CTX_new(this.#handles.pkey, null);
    const md = hash === "SHA-256" ? symbols.EVP_sha256() : symbols.EVP_sha384();
    if (
      context === null || symbols.EVP_PKEY_verify_init(context) !== 1 ||
      symbols.EVP_PKEY_CTX_set_signature_md(context, md) !== 1
    ) {
      if (context !== null) symbols.EVP_PKEY_CTX_free(context);
      symbols.ERR_clear_error();
      throw new Es256EngineError("libcrypto could not set up an ECDSA verification");
    }
    this.#handles.contexts.push(context);
    this.#contexts.set(hash, context);
    return context;
  }

  /** Whether `der` (an `ECDSA-Sig-Value`) signs `data` with `hash`. */
  verify(der: Uint8Array, data: Uint8Array, hash: EcdsaHash): boolean {
    const symbols = libcryptoSymbols();
    const context = this.#contextFor(hash);
    const digest = DIGESTS[hash];
    if (hash === "SHA-256") symbols.SHA256(data, BigInt(data.length), digest);
    else symbols.SHA384(data, BigInt(data.length), digest);
    const result = symbols.EVP_PKEY_verify(
      context,
      der,
      BigInt(der.length),
      digest,
      BigInt(digest.length),
    );
    // A failed check leaves entries on OpenSSL's per-thread error queue; they would pile up.
    if (result !== 1) symbols.ERR_clear_error();
    return result === 1;
  }
}

class OpenSslKey implements Es256VerifyingKey {
  readonly engine = "openssl";
  #key: OpenSslPublicKey;

  constructor(key: OpenSslPublicKey) {
    this.#key = key;
  }

  verify(signature: Uint8Array, data: Uint8Array): Promise<boolean> {
    if (signature.length !== 64) return Promise.resolve(false);
    return Promise.resolve(this.#key.verify(derSignature(signature), data, "SHA-256"));
  }
}

function libcryptoSymbols(): Libcrypto {
  if (libcrypto === null || !("symbols" in libcrypto)) {
    throw new Es256EngineError("libcrypto is not open");
  }
  return libcrypto.symbols;
}

/** JWS's r || s (32 bytes each) as the DER `SEQUENCE { INTEGER r, INTEGER s }` OpenSSL reads. */
export function derSignature(raw: Uint8Array): Uint8Array {
  const r = derInteger(raw.subarray(0, 32));
  const s = derInteger(raw.subarray(32, 64));
  const der = new Uint8Array(2 + r.length + s.length);
  der[0] = 0x30;
  der[1] = r.length + s.length;
  der.set(r, 2);
  der.set(s, 2 + r.length);
  return der;
}

/** A big-endian unsigned integer as a minimal DER INTEGER. */
function derInteger(bytes: Uint8Array): Uint8Array {
  let start = 0;
  while (start < bytes.length - 1 && bytes[start] === 0) start++;
  const value = bytes.subarray(start);
  // A leading 1 bit would read as negative: DER adds a zero byte.
  const pad = value[0] & 0x80 ? 1 : 0;
  const der = new Uint8Array(2 + pad + value.length);
  der[0] = 0x02;
  der[1] = pad + value.length;
  der.set(value, 2 + pad);
  return der;
}

/**
 * A DER `ECDSA-Sig-Value` as r || s, each left-padded to `size` bytes; null when it is not
 * minimal DER of two positive integers that fit.
 */
export function rawSignature(der: Uint8Array, size: number): Uint8Array | null {
  if (der.length < 8 || der[0] !== 0x30 || der[1] !== der.length - 2 || der[1] > 0x7f) return null;
  const raw = new Uint8Array(size * 2);
  let offset = 2;
  for (const half of [0, 1]) {
    if (der[offset] !== 0x02) return null;
    const length = der[offset + 1];
    const start = offset + 2;
    if (length === 0 || length > 0x7f || start + length > der.length) return null;
    let value = der.subarray(start, start + length);
    // Minimal and positive: no sign bit, and a leading zero only in front of one.
    if (value[0] & 0x80) return null;
    if (value[0] === 0 && (value.length === 1 || !(value[1] & 0x80))) return null;
    if (value[0] === 0) value = value.subarray(1);
    if (value.length > size) return null;
    raw.set(value, half * size + size - value.length);
    offset = start + length;
  }
  return offset === der.length ? raw : null;
}

async function passesSelfTest(): Promise<boolean> {
  try {
    const pair = await crypto.subtle.generateKey(ECDSA_P256, true, ["sign", "verify"]);
    const data = new TextEncoder().encode("purchase-relay ES256 self-test");
    const signature = new Uint8Array(await crypto.subtle.sign(ES256, pair.privateKey, data));
    const spki = new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey));
    const key = new OpenSslKey(OpenSslPublicKey.fromSpki(spki));
    const tampered = data.slice();
    tampered[0] ^= 1;
    return await key.verify(signature, data) && !await key.verify(signature, tampered);
  } catch {
    return false;
  }
}
