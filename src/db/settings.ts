/**
 * Service-wide settings, all of them sealed secrets: the encryption canary (`/ready` proves the
 * key matches) and the audit hash key.
 */
import type { Sql } from "./connect.ts";
import {
  base64url,
  fromBase64url,
  sealedKeyId,
  type SecretBox,
  SecretError,
  type SecretPurpose,
} from "../crypto/secrets.ts";

const CANARY_NAME = "encryption_canary";
const CANARY_TEXT = "purchase-relay encryption canary";
const AUDIT_HASH_KEY_NAME = "audit_subject_hash_key";

/** The settings rows that hold sealed values, with their purposes (a key rotation re-seals them). */
export const SEALED_SETTINGS: Readonly<Record<string, SecretPurpose>> = {
  [CANARY_NAME]: "canary",
  [AUDIT_HASH_KEY_NAME]: "hash-key",
};

/** Seals the canary with the current key the first time a database is set up. */
export async function ensureEncryptionCanary(sql: Sql, box: SecretBox): Promise<void> {
  const sealed = await box.seal("canary", CANARY_NAME, CANARY_TEXT);
  await sql`
    INSERT INTO settings (name, value) VALUES (${CANARY_NAME}, ${sealed})
    ON CONFLICT (name) DO NOTHING`;
}

/** Reads the sealed canary; null when the database has none yet. */
export async function readEncryptionCanary(sql: Sql): Promise<string | null> {
  const [row] = await sql`SELECT value FROM settings WHERE name = ${CANARY_NAME}`;
  return row ? row.value : null;
}

/** Whether `sealed` opens with `box`'s key (or its previous key) to the canary text. */
export async function canaryOpens(box: SecretBox, sealed: string): Promise<boolean> {
  try {
    return (await box.open("canary", CANARY_NAME, sealed)) === CANARY_TEXT;
  } catch {
    return false;
  }
}

/**
 * The key of the validation audit's subject hashes (src/audit/subject_hash.ts). It is a secret of
 * the database, sealed like the others, so that a rotation of the master key re-seals it and
 * hashes written before the rotation still match. Made the first time it is needed, as the key
 * that earlier versions derived from the master key, so their hashes match too: from the master
 * key that sealed the canary, and sealed with that key, so that a replica still configured with
 * only that key during a rotation opens it as well.
 */
export async function auditHashKey(sql: Sql, box: SecretBox): Promise<Uint8Array> {
  let [row] = await sql`SELECT value FROM settings WHERE name = ${AUDIT_HASH_KEY_NAME}`;
  if (!row) {
    const setUpWith = await databaseKeyBox(sql, box);
    const key = base64url(await setUpWith.derivedHashKey("audit-subject"));
    const sealed = await setUpWith.seal("hash-key", AUDIT_HASH_KEY_NAME, key);
    await sql`
      INSERT INTO settings (name, value) VALUES (${AUDIT_HASH_KEY_NAME}, ${sealed})
      ON CONFLICT (name) DO NOTHING`;
    [row] = await sql`SELECT value FROM settings WHERE name = ${AUDIT_HASH_KEY_NAME}`;
  }
  return fromBase64url(await box.open("hash-key", AUDIT_HASH_KEY_NAME, row.value));
}

/** The box of the master key that sealed the canary: the current one, or the previous one. */
async function databaseKeyBox(sql: Sql, box: SecretBox): Promise<SecretBox> {
  await ensureEncryptionCanary(sql, box);
  const keyId = sealedKeyId(await readEncryptionCanary(sql) ?? "");
  if (keyId === box.keyId) return box;
  if (box.previous !== null && keyId === box.previous.keyId) return box.previous;
  throw new SecretError(
    `the database was set up with master key ${keyId}, which is not configured`,
  );
}
