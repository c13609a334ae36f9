/**
 * ES256 signature checks (RFC 7518 3.4: ECDSA on P-256 with SHA-256) for keys that check many
 * signatures: the App Store's leaf key signs every JWS the service verifies, three per
 * notification.
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

const ECDSA_P256 = { name: "ECDSA", namedCurve: "P-256" } as const;
const ES256 = { name: "ECDSA", hash: "SHA-256" } as const;

/**
 * Where OpenSSL 3's libcrypto is installed, as absolute paths: Deno's `--allow-ffi=<path>` grants
 * a path, not a library name (a bare `libcrypto.so.3` is read as a file in the working directory),
 * so the service opens the file itself and src/permissions.ts grants exactly these paths. Linux:
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
  SHA256: { parameters: ["buffer", "usize", "buffer"], result: "pointer" },
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
  const failure = await openLibcrypto();
  if (failure !== null) throw new Es256EngineError(failure);
  const canonical = new Uint8Array(await crypto.subtle.exportKey("spki", key));
  return OpenSslKey.fromSpki(canonical);
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

/** Native handles of a key; freed when the key object is garbage-collected. */
interface OpenSslHandles {
  pkey: Deno.PointerValue;
  context: Deno.PointerValue;
}

const openSslHandles = new FinalizationRegistry<OpenSslHandles>(({ pkey, context }) => {
  const symbols = libcryptoSymbols();
  symbols.EVP_PKEY_CTX_free(context);
  symbols.EVP_PKEY_free(pkey);
});

class OpenSslKey implements Es256VerifyingKey {
  readonly engine = "openssl";
  // One context per key, initialised once: EVP_PKEY_verify may be called on it repeatedly.
  #context: Deno.PointerValue;
  // Scratch space for the digest; JavaScript runs one verification at a time.
  #digest = new Uint8Array(32);

  private constructor(context: Deno.PointerValue) {
    this.#context = context;
  }

  static fromSpki(spki: Uint8Array): OpenSslKey {
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
    const context = symbols.EVP_PKEY_CTX_new(pkey, null);
    if (
      context === null || symbols.EVP_PKEY_verify_init(context) !== 1 ||
      symbols.EVP_PKEY_CTX_set_signature_md(context, symbols.EVP_sha256()) !== 1
    ) {
      if (context !== null) symbols.EVP_PKEY_CTX_free(context);
      symbols.EVP_PKEY_free(pkey);
      symbols.ERR_clear_error();
      throw new Es256EngineError("libcrypto could not set up an ES256 verification");
    }
    const key = new OpenSslKey(context);
    openSslHandles.register(key, { pkey, context });
    return key;
  }

  verify(signature: Uint8Array, data: Uint8Array): Promise<boolean> {
    if (signature.length !== 64) return Promise.resolve(false);
    const symbols = libcryptoSymbols();
    const der = derSignature(signature);
    symbols.SHA256(data, BigInt(data.length), this.#digest);
    const result = symbols.EVP_PKEY_verify(
      this.#context,
      der,
      BigInt(der.length),
      this.#digest,
      32n,
    );
    // A failed check leaves entries on OpenSSL's per-thread error queue; they would pile up.
    if (result !== 1) symbols.ERR_clear_error();
    return Promise.resolve(result === 1);
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

async function passesSelfTest(): Promise<boolean> {
  try {
    const pair = await crypto.subtle.generateKey(ECDSA_P256, true, ["sign", "verify"]);
    const data = new TextEncoder().encode("purchase-relay ES256 self-test");
    const signature = new Uint8Array(await crypto.subtle.sign(ES256, pair.privateKey, data));
    const spki = new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey));
    const key = OpenSslKey.fromSpki(spki);
    const tampered = data.slice();
    tampered[0] ^= 1;
    return await key.verify(signature, data) && !await key.verify(signature, tampered);
  } catch {
    return false;
  }
}
