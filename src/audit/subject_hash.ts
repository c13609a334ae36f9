/**
 * The validation audit keeps a transaction id or purchase token only as a keyed hash:
 * HMAC-SHA-256 (hex) under the database's audit hash key (`auditHashKey`, src/db/settings.ts),
 * the same for every replica and the CLI, and across rotations of the master key.
 */

const encoder = new TextEncoder();

/** Hashes audit subjects under a key loaded when first needed. */
export class SubjectHasher {
  #load: () => Promise<Uint8Array>;
  #key: Promise<CryptoKey> | null = null;

  /** `load` gives the raw key: called at the first hash, and again after it failed. */
  constructor(load: () => Promise<Uint8Array>) {
    this.#load = load;
  }

  /** The keyed hash of `subject`, as stored in `validation_audit.subject_hash`. */
  async hash(subject: string): Promise<string> {
    const mac = await crypto.subtle.sign("HMAC", await this.#keyOnce(), encoder.encode(subject));
    return Array.from(new Uint8Array(mac), (b) => b.toString(16).padStart(2, "0")).join("");
  }

  #keyOnce(): Promise<CryptoKey> {
    if (this.#key === null) {
      const loading = this.#load().then((raw) =>
        crypto.subtle.importKey(
          "raw",
          raw.slice().buffer as ArrayBuffer,
          { name: "HMAC", hash: "SHA-256" },
          false,
          ["sign"],
        )
      );
      // A failed load (the database away, a key that does not open) is tried again next time.
      loading.catch(() => {
        if (this.#key === loading) this.#key = null;
      });
      this.#key = loading;
    }
    return this.#key;
  }
}
