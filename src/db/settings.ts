/** Service-wide settings, and the encryption canary (issue: /ready proves the key matches). */
import type { Sql } from "./connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";

const CANARY_NAME = "encryption_canary";
const CANARY_TEXT = "purchase-relay encryption canary";

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

/** Whether `sealed` opens with `box`'s key to the canary text. */
export async function canaryOpens(box: SecretBox, sealed: string): Promise<boolean> {
  try {
    return (await box.open("canary", CANARY_NAME, sealed)) === CANARY_TEXT;
  } catch {
    return false;
  }
}
