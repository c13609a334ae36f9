/**
 * Secrets at rest: store credentials and webhook secrets are sealed with AES-256-GCM under a key
 * derived per purpose from the master `ENCRYPTION_KEY` (HKDF-SHA-256). A sealed value records
 * the id of the master key that sealed it, so that during a rotation values sealed with the
 * previous key (`ENCRYPTION_KEY_PREVIOUS`) still open, and is bound to its purpose and owner
 * (additional data) so a value copied to another row does not open.
 *
 * Format: `v1.<keyId>.<base64url nonce>.<base64url ciphertext+tag>`.
 */
import { createHash } from "node:crypto";
import { RelayError } from "../errors.ts";

/** What a sealed value is for; each purpose has its own derived key. */
export type SecretPurpose =
  | "storea-private-key"
  | "storeb-service-account"
  | "webhook-secret"
  | "canary"
  | "hash-key";

/** What a keyed hash is for; each has its own key. */
export type HashPurpose = "audit-subject";

/** A value that could not be opened: wrong key, wrong owner, or tampered. */
export class SecretError extends RelayError {
  constructor(message: string) {
    super("SECRET_UNREADABLE", message);
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Seals secrets under the master key, and opens those sealed under it or, during a rotation,
 * under the previous master key.
 */
export class SecretBox {
  /** A short, non-secret fingerprint of the master key. */
  readonly keyId: string;
  /**
   * The box of the previous master key (`ENCRYPTION_KEY_PREVIOUS`) during a rotation, else null:
   * what it sealed still opens, and nothing new is sealed with it.
   */
  readonly previous: SecretBox | null;
  #master: Promise<CryptoKey>;
  /** Derived keys by HKDF info string. */
  #derived = new Map<string, Promise<CryptoKey>>();

  constructor(masterKey: Uint8Array, previousKey: Uint8Array | null = null) {
    this.keyId = masterKeyId(masterKey);
    this.#master = crypto.subtle.importKey("raw", toBuffer(masterKey), "HKDF", false, [
      "deriveKey",
      "deriveBits",
    ]);
    const previous = previousKey === null ? null : new SecretBox(previousKey);
    this.previous = previous?.keyId === this.keyId ? null : previous;
  }

  /** Seals `plaintext` for `purpose`, bound to `owner` (a tenant id, for instance). */
  async seal(purpose: SecretPurpose, owner: string, plaintext: string): Promise<string> {
    const key = await this.#keyFor(purpose);
    const nonce = crypto.getRandomValues(new Uint8Array(12));
    const sealed = await crypto.subtle.encrypt(
      { name: "AES-GCM", iv: nonce, additionalData: encoder.encode(`${purpose}:${owner}`) },
      key,
      encoder.encode(plaintext),
    );
    return `v1.${this.keyId}.${base64url(nonce)}.${base64url(new Uint8Array(sealed))}`;
  }

  /** Opens a value sealed by {@linkcode SecretBox.seal} with the same purpose and owner. */
  async open(purpose: SecretPurpose, owner: string, sealed: string): Promise<string> {
    const parts = sealed.split(".");
    if (parts.length !== 4 || parts[0] !== "v1") throw new SecretError("not a sealed value");
    if (parts[1] !== this.keyId) {
      if (parts[1] === this.previous?.keyId) {
        return await this.previous.open(purpose, owner, sealed);
      }
      const configured = [this.keyId, this.previous?.keyId].filter(Boolean).join(" or ");
      throw new SecretError(`sealed with master key ${parts[1]}, not the configured ${configured}`);
    }
    const key = await this.#keyFor(purpose);
    try {
      const plain = await crypto.subtle.decrypt(
        {
          name: "AES-GCM",
          iv: toBuffer(fromBase64url(parts[2])),
          additionalData: encoder.encode(`${purpose}:${owner}`),
        },
        key,
        toBuffer(fromBase64url(parts[3])),
      );
      return decoder.decode(plain);
    } catch {
      throw new SecretError("the value does not open with the configured key");
    }
  }

  /**
   * The HMAC-SHA-256 key this master key derives for `purpose` (512 bits), which keyed the
   * hashes of `purpose` until they got a key of their own (src/db/settings.ts).
   */
  async derivedHashKey(purpose: HashPurpose): Promise<Uint8Array> {
    const bits = await crypto.subtle.deriveBits(
      hkdfParams(`hash:${purpose}`),
      await this.#master,
      512,
    );
    return new Uint8Array(bits);
  }

  #keyFor(purpose: SecretPurpose): Promise<CryptoKey> {
    return this.#derive(purpose, { name: "AES-GCM", length: 256 }, ["encrypt", "decrypt"]);
  }

  /** The key for `info`, derived once from the master key with HKDF-SHA-256. */
  #derive(
    info: string,
    algorithm: AesKeyGenParams,
    usages: KeyUsage[],
  ): Promise<CryptoKey> {
    let key = this.#derived.get(info);
    if (!key) {
      key = this.#master.then((master) =>
        crypto.subtle.deriveKey(
          hkdfParams(info),
          master,
          algorithm,
          false,
          usages,
        )
      );
      this.#derived.set(info, key);
    }
    return key;
  }
}

function hkdfParams(info: string): HkdfParams {
  return {
    name: "HKDF",
    hash: "SHA-256",
    salt: encoder.encode("purchase-relay"),
    info: encoder.encode(info),
  };
}

/** The id of the master key that sealed `sealed`, or null when it is not a sealed value. */
export function sealedKeyId(sealed: string): string | null {
  const parts = sealed.split(".");
  return parts.length === 4 && parts[0] === "v1" ? parts[1] : null;
}

/** The id recorded in sealed values: the first 8 hex digits of a hash of the master key. */
export function masterKeyId(masterKey: Uint8Array): string {
  return createHash("sha256").update("purchase-relay key id\0").update(masterKey).digest("hex")
    .slice(0, 8);
}

/** Base64url without padding. */
export function base64url(bytes: Uint8Array): string {
  return bytes.toBase64({ alphabet: "base64url", omitPadding: true });
}

/** Decodes base64url (padding optional). */
export function fromBase64url(text: string): Uint8Array<ArrayBuffer> {
  return Uint8Array.fromBase64(text, { alphabet: "base64url" });
}

function toBuffer(bytes: Uint8Array): ArrayBuffer {
  return bytes.slice().buffer as ArrayBuffer;
}
