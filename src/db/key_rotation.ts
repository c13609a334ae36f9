/**
 * Rotating the master key (docs/maintenance.md, "Rotating `ENCRYPTION_KEY`"): every sealed value
 * of the database is opened and sealed again with the current `ENCRYPTION_KEY`, in one
 * transaction. Values already sealed with it are left as they are, so a second run changes
 * nothing; the others must open with `ENCRYPTION_KEY_PREVIOUS`, or nothing is changed at all.
 *
 * Replicas keep working throughout: they open values sealed with either key, and read the old
 * values until the transaction commits, the new ones after. The rows are locked `FOR NO KEY
 * UPDATE`, which lets receivers and deliveries insert rows that refer to a tenant meanwhile; a
 * command that changes one of these secrets at the same moment waits for the commit.
 */
import type { Sql } from "./connect.ts";
import { sealedKeyId, type SecretBox, type SecretPurpose } from "../crypto/secrets.ts";
import { auditHashKey, SEALED_SETTINGS } from "./settings.ts";
import { RelayError } from "../errors.ts";

/** A column that holds sealed values, and what binds each value (its purpose and owner). */
export interface SealedColumn {
  /** Its name in what a rotation reports. */
  label: string;
  table: string;
  column: string;
  /** The column of the owner a value is bound to. */
  owner: string;
  /** The purpose a value was sealed for, by owner. */
  purposeOf(owner: string): SecretPurpose | undefined;
}

/**
 * Every column that holds sealed values. tests/key_rotation_test.ts fails when the schema has a
 * `_sealed` column that is not listed here.
 */
export const SEALED_COLUMNS: readonly SealedColumn[] = [
  {
    label: "webhookSecrets",
    table: "tenants",
    column: "webhook_secret_sealed",
    owner: "id",
    purposeOf: () => "webhook-secret",
  },
  {
    label: "previousWebhookSecrets",
    table: "tenants",
    column: "previous_webhook_secret_sealed",
    owner: "id",
    purposeOf: () => "webhook-secret",
  },
  {
    label: "storeaCredentials",
    table: "storea_credentials",
    column: "private_key_sealed",
    owner: "tenant_id",
    purposeOf: () => "storea-private-key",
  },
  {
    label: "storebCredentials",
    table: "storeb_credentials",
    column: "service_account_sealed",
    owner: "tenant_id",
    purposeOf: () => "storeb-service-account",
  },
  {
    label: "settings",
    table: "settings",
    column: "value",
    owner: "name",
    purposeOf: (name) => SEALED_SETTINGS[name],
  },
];

/** What a rotation did. */
export interface KeyRotation {
  /** The id of the key every value is now sealed with (`ENCRYPTION_KEY`). */
  keyId: string;
  /** The id of `ENCRYPTION_KEY_PREVIOUS`, or null when it is not set. */
  previousKeyId: string | null;
  /** Values sealed again with the current key, by column. */
  resealed: Record<string, number>;
  /** Values that were sealed with the current key already, and left alone. */
  alreadyCurrent: number;
}

/** A sealed value that opens with neither key. */
export interface UnreadableSecret {
  sealed: string;
  owner: string;
  /** The id of the master key that sealed it. */
  keyId: string | null;
}

/** Some values open with neither key: the rotation changed nothing. */
export class UnreadableSecretsError extends RelayError {
  readonly unreadable: UnreadableSecret[];
  constructor(unreadable: UnreadableSecret[], box: SecretBox) {
    const keys = [box.keyId, box.previous?.keyId].filter(Boolean).join(" and ");
    super(
      "SECRETS_UNREADABLE",
      `${unreadable.length} sealed value(s) open with neither configured key (${keys}); ` +
        "nothing was changed",
    );
    this.unreadable = unreadable;
  }
}

/** Seals every sealed value of the database with `box`'s current key; see the module's doc. */
export async function resealSecrets(sql: Sql, box: SecretBox): Promise<KeyRotation> {
  // The audit hash key is made now if it is not yet: derived from the key being replaced, it is
  // the key of the hashes written so far, and the rotation re-seals it like any other secret.
  await auditHashKey(sql, box);
  return await sql.begin(async (tx) => {
    const resealed: Record<string, number> = {};
    const unreadable: UnreadableSecret[] = [];
    const updates: (() => Promise<unknown>)[] = [];
    let alreadyCurrent = 0;
    for (const sealed of SEALED_COLUMNS) {
      resealed[sealed.label] = 0;
      const rows = await tx`
        SELECT ${tx(sealed.owner)} AS owner, ${tx(sealed.column)} AS value
        FROM ${tx(sealed.table)}
        WHERE ${tx(sealed.column)} IS NOT NULL
        ORDER BY 1
        FOR NO KEY UPDATE`;
      for (const { owner, value } of rows) {
        const purpose = sealed.purposeOf(owner);
        if (purpose === undefined) continue; // a setting that is not a secret
        if (sealedKeyId(value) === box.keyId) {
          alreadyCurrent++;
          continue;
        }
        let plaintext: string;
        try {
          plaintext = await box.open(purpose, owner, value);
        } catch {
          unreadable.push({ sealed: sealed.label, owner, keyId: sealedKeyId(value) });
          continue;
        }
        const fresh = await box.seal(purpose, owner, plaintext);
        resealed[sealed.label]++;
        updates.push(() =>
          tx`
            UPDATE ${tx(sealed.table)} SET ${tx(sealed.column)} = ${fresh}
            WHERE ${tx(sealed.owner)} = ${owner}`
        );
      }
    }
    if (unreadable.length > 0) throw new UnreadableSecretsError(unreadable, box);
    for (const update of updates) await update();
    return {
      keyId: box.keyId,
      previousKeyId: box.previous?.keyId ?? null,
      resealed,
      alreadyCurrent,
    };
  });
}
