/**
 * Rotating the master key (docs/maintenance.md, "Rotating `ENCRYPTION_KEY`"): the secret box opens
 * values of either key during a rotation, `encryption rotate-key` seals every stored secret again
 * with the new key in one transaction (or changes nothing), twice is harmless, and the audit's
 * hashes written before the rotation still match after it. Against a real database of either
 * engine, in process and through the CLI.
 */
import assert from "node:assert/strict";
import { readConfig } from "../src/config.ts";
import { masterKeyId, sealedKeyId, SecretBox, SecretError } from "../src/crypto/secrets.ts";
import type { Sql } from "../src/db/connect.ts";
import { insertTenant, rotateWebhookSecret } from "../src/db/tenants.ts";
import { loadDeliveryTarget } from "../src/delivery/targets.ts";
import {
  loadCredentials,
  saveStoreaCredentials,
  saveStorebCredentials,
} from "../src/db/credentials.ts";
import {
  auditHashKey,
  canaryOpens,
  ensureEncryptionCanary,
  readEncryptionCanary,
  SEALED_SETTINGS,
} from "../src/db/settings.ts";
import { resealSecrets, SEALED_COLUMNS, UnreadableSecretsError } from "../src/db/key_rotation.ts";
import { SubjectHasher } from "../src/audit/subject_hash.ts";
import {
  connectTestDatabase,
  freshDatabase,
  runCli,
  TEST_ENCRYPTION_KEY,
} from "./helpers/service.ts";

const OLD_KEY = Uint8Array.fromBase64(TEST_ENCRYPTION_KEY);
const NEW_KEY = new Uint8Array(32).fill(9);
const OTHER_KEY = new Uint8Array(32).fill(11);
const NEW_KEY_TEXT = NEW_KEY.toBase64();

const encoder = new TextEncoder();

/** The audit hash as versions before the rotation made it: HMAC under a key derived by HKDF. */
async function legacyAuditHash(
  masterKey: Uint8Array<ArrayBuffer>,
  subject: string,
): Promise<string> {
  const master = await crypto.subtle.importKey("raw", masterKey.slice(), "HKDF", false, [
    "deriveKey",
  ]);
  const key = await crypto.subtle.deriveKey(
    {
      name: "HKDF",
      hash: "SHA-256",
      salt: encoder.encode("purchase-relay"),
      info: encoder.encode("hash:audit-subject"),
    },
    master,
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const mac = await crypto.subtle.sign("HMAC", key, encoder.encode(subject));
  return Array.from(new Uint8Array(mac), (b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("secret box: during a rotation, values of either key open; new ones use the new key", async () => {
  const old = new SecretBox(OLD_KEY);
  const rotating = new SecretBox(NEW_KEY, OLD_KEY);
  const sealedOld = await old.seal("webhook-secret", "tenant_a", "whsec_old");
  assert.equal(await rotating.open("webhook-secret", "tenant_a", sealedOld), "whsec_old");
  const sealedNew = await rotating.seal("webhook-secret", "tenant_a", "whsec_new");
  assert.equal(sealedKeyId(sealedNew), masterKeyId(NEW_KEY));
  assert.equal(rotating.previous?.keyId, masterKeyId(OLD_KEY));
  // The binding to purpose and owner holds for the previous key too.
  await assert.rejects(rotating.open("webhook-secret", "tenant_b", sealedOld), SecretError);
  // A third key: refused, naming both configured ones.
  const third = await new SecretBox(OTHER_KEY).seal("webhook-secret", "tenant_a", "x");
  await assert.rejects(
    rotating.open("webhook-secret", "tenant_a", third),
    new RegExp(`${masterKeyId(NEW_KEY)} or ${masterKeyId(OLD_KEY)}`),
  );
  // The old key alone does not open what the new one sealed.
  await assert.rejects(old.open("webhook-secret", "tenant_a", sealedNew), SecretError);
  assert.equal(sealedKeyId("garbage"), null);
});

Deno.test("secret box: the derived audit hash key makes the hashes earlier versions made", async () => {
  const hasher = new SubjectHasher(() => new SecretBox(OLD_KEY).derivedHashKey("audit-subject"));
  for (const subject of ["2000000000000101", "token-ä-\u{1F600}", ""]) {
    assert.equal(await hasher.hash(subject), await legacyAuditHash(OLD_KEY, subject));
  }
});

Deno.test("subject hasher: a key that failed to load is loaded again at the next hash", async () => {
  let loads = 0;
  const hasher = new SubjectHasher(() => {
    loads++;
    return loads === 1 ? Promise.reject(new Error("database away")) : Promise.resolve(NEW_KEY);
  });
  await assert.rejects(hasher.hash("a"), /database away/);
  const first = await hasher.hash("a");
  assert.equal(await hasher.hash("a"), first);
  assert.equal(loads, 2);
});

Deno.test("config: ENCRYPTION_KEY_PREVIOUS", () => {
  const base = { ENCRYPTION_KEY: NEW_KEY_TEXT };
  assert.equal(readConfig(base).encryptionKeyPrevious, null);
  assert.deepEqual(
    readConfig({ ...base, ENCRYPTION_KEY_PREVIOUS: TEST_ENCRYPTION_KEY }).encryptionKeyPrevious,
    OLD_KEY,
  );
  const refused = (env: Record<string, string>, pattern: RegExp) =>
    assert.throws(() => readConfig(env), (error: Error) => {
      assert.match(error.message, pattern);
      assert.ok(!error.message.includes(TEST_ENCRYPTION_KEY), "no key in the message");
      return true;
    });
  refused(
    { ENCRYPTION_KEY_PREVIOUS: TEST_ENCRYPTION_KEY },
    /^ENCRYPTION_KEY_PREVIOUS: .*ENCRYPTION_KEY is not/,
  );
  refused(
    { ...base, ENCRYPTION_KEY_PREVIOUS: "not base64!" },
    /^ENCRYPTION_KEY_PREVIOUS: is not valid base64/,
  );
  refused(
    { ...base, ENCRYPTION_KEY_PREVIOUS: btoa("short") },
    /^ENCRYPTION_KEY_PREVIOUS: must decode to 32 bytes/,
  );
  refused(
    { ...base, ENCRYPTION_KEY_PREVIOUS: NEW_KEY_TEXT },
    /^ENCRYPTION_KEY_PREVIOUS: is the same key/,
  );
});

// ---------------------------------------------------------------------------------------------
// On a database

const PEM = "-----BEGIN PRIVATE KEY-----\nMIGHAgEA\n-----END PRIVATE KEY-----\n";
const ACCOUNT = '{"type":"service_account","client_email":"a@b.iam.gserviceaccount.com"}';

/**
 * A database set up with the old key, as it is before a rotation: two tenants, one with both
 * stores' credentials and a webhook secret in a rotation grace period, the canary, and audit rows
 * hashed as earlier versions hashed them (there is no stored audit hash key yet).
 */
async function seedUnderOldKey(sql: Sql): Promise<void> {
  const old = new SecretBox(OLD_KEY);
  await ensureEncryptionCanary(sql, old);
  await insertTenant(sql, old, {
    id: "tenant_a",
    name: "A",
    callbackUrl: "https://a.example/hook",
    webhookSecret: "whsec_a_first_secret_of_32_characters",
  });
  await rotateWebhookSecret(sql, old, "tenant_a", {
    secret: "whsec_a_second_secret_of_32_characters",
    graceMs: 3_600_000,
  });
  await insertTenant(sql, old, {
    id: "tenant_b",
    name: "B",
    callbackUrl: null,
    webhookSecret: null,
  });
  await saveStoreaCredentials(sql, old, "tenant_a", {
    bundleId: "com.example.app",
    keyId: "ABC123DEFG",
    issuerId: "57246542-96fe-1a63-e053-0824d011072a",
    privateKeyPem: PEM,
    environment: "auto",
    appId: null,
  });
  await saveStorebCredentials(sql, old, "tenant_a", {
    packageName: "com.example.app",
    clientEmail: "a@b.iam.gserviceaccount.com",
    serviceAccountJson: ACCOUNT,
    pushAudience: "https://relay.example/push",
    pushServiceAccount: "push@b.iam.gserviceaccount.com",
  });
  await sql`
    INSERT INTO validation_audit (tenant_id, store, subject_hash, outcome, latency_ms, created_at)
    VALUES ('tenant_a', 'storea', ${await legacyAuditHash(OLD_KEY, "2000000000000101")}, 'valid',
            5, now())`;
}

/** Every sealed value in the database, by column, with the id of the key that sealed it. */
async function sealedValues(sql: Sql): Promise<Record<string, string>> {
  const values: Record<string, string> = {};
  for (const sealed of SEALED_COLUMNS) {
    const rows = await sql`
      SELECT ${sql(sealed.owner)} AS owner, ${sql(sealed.column)} AS value
      FROM ${sql(sealed.table)} WHERE ${sql(sealed.column)} IS NOT NULL`;
    for (const row of rows) values[`${sealed.table}.${sealed.column}:${row.owner}`] = row.value;
  }
  return values;
}

Deno.test("key rotation: every secret is sealed again with the new key, and still opens", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    await seedUnderOldKey(db.sql);
    const rotation = await resealSecrets(db.sql, new SecretBox(NEW_KEY, OLD_KEY));
    assert.deepEqual(rotation, {
      keyId: masterKeyId(NEW_KEY),
      previousKeyId: masterKeyId(OLD_KEY),
      resealed: {
        webhookSecrets: 1,
        previousWebhookSecrets: 1,
        storeaCredentials: 1,
        storebCredentials: 1,
        settings: 2, // the canary, and the audit hash key made for the rotation
      },
      alreadyCurrent: 0,
    });
    const values = await sealedValues(db.sql);
    assert.equal(Object.keys(values).length, 6);
    for (const [where, value] of Object.entries(values)) {
      assert.equal(sealedKeyId(value), masterKeyId(NEW_KEY), where);
    }

    // The new key alone opens everything: the old one can be retired.
    const only = new SecretBox(NEW_KEY);
    assert.ok(await canaryOpens(only, (await readEncryptionCanary(db.sql))!));
    const target = await loadDeliveryTarget(db.sql, only, "tenant_a");
    assert.deepEqual(target?.secrets, [
      "whsec_a_second_secret_of_32_characters",
      "whsec_a_first_secret_of_32_characters",
    ]);
    const credentials = await loadCredentials(db.sql, only, "tenant_a");
    assert.equal(credentials.storea?.privateKeyPem, PEM);
    assert.equal(credentials.storeb?.serviceAccountJson, ACCOUNT);
    // Audit rows written before the rotation are still found by their id.
    const hash = await new SubjectHasher(() => auditHashKey(db.sql, only)).hash("2000000000000101");
    const [found] = await db.sql`SELECT count(*)::int AS n FROM validation_audit
                                 WHERE subject_hash = ${hash}`;
    assert.equal(found.n, 1);
    // And the old key alone opens nothing any more.
    assert.equal(
      await canaryOpens(new SecretBox(OLD_KEY), (await readEncryptionCanary(db.sql))!),
      false,
    );

    // A second run changes nothing.
    const again = await resealSecrets(db.sql, new SecretBox(NEW_KEY, OLD_KEY));
    assert.deepEqual(Object.values(again.resealed), [0, 0, 0, 0, 0]);
    assert.equal(again.alreadyCurrent, 6);
    assert.deepEqual(await sealedValues(db.sql), values);
    // So does a run with the new key alone, once the previous one is removed.
    const alone = await resealSecrets(db.sql, only);
    assert.equal(alone.previousKeyId, null);
    assert.equal(alone.alreadyCurrent, 6);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("key rotation: a value that opens with neither key stops it; nothing changes", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    await seedUnderOldKey(db.sql);
    // A secret left under a third key, and one copied from another tenant's row.
    await db.sql`UPDATE tenants SET webhook_secret_sealed =
      ${await new SecretBox(OTHER_KEY).seal("webhook-secret", "tenant_b", "whsec_b")}
      WHERE id = 'tenant_b'`;
    await db.sql`UPDATE storeb_credentials SET service_account_sealed =
      (SELECT private_key_sealed FROM storea_credentials WHERE tenant_id = 'tenant_a')`;
    const before = await sealedValues(db.sql);
    await assert.rejects(
      resealSecrets(db.sql, new SecretBox(NEW_KEY, OLD_KEY)),
      (error: Error) => {
        assert.ok(error instanceof UnreadableSecretsError);
        assert.deepEqual(error.unreadable, [
          { sealed: "webhookSecrets", owner: "tenant_b", keyId: masterKeyId(OTHER_KEY) },
          { sealed: "storebCredentials", owner: "tenant_a", keyId: masterKeyId(OLD_KEY) },
        ]);
        return true;
      },
    );
    // The audit hash key was made (under the old key, as before the rotation); nothing else moved.
    const after = await sealedValues(db.sql);
    const hashKey = "settings.value:audit_subject_hash_key";
    assert.equal(sealedKeyId(after[hashKey]), masterKeyId(OLD_KEY));
    delete after[hashKey];
    assert.deepEqual(after, before);
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("key rotation: every sealed column of the schema is re-sealed", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test);
  try {
    await seedUnderOldKey(db.sql);
    await auditHashKey(db.sql, new SecretBox(OLD_KEY));
    const columns = await db.sql`
      SELECT table_name, column_name FROM information_schema.columns
      WHERE table_schema = current_schema() AND column_name LIKE '%\\_sealed'
      ORDER BY 1, 2`;
    const known = new Set(SEALED_COLUMNS.map((c) => `${c.table}.${c.column}`));
    for (const { table_name, column_name } of columns) {
      assert.ok(known.has(`${table_name}.${column_name}`), `${table_name}.${column_name}`);
    }
    assert.ok(columns.length >= 4, `only ${columns.length} sealed columns found`);
    // Every setting is a sealed secret the rotation knows.
    for (const { name } of await db.sql`SELECT name FROM settings`) {
      assert.ok(name in SEALED_SETTINGS, `setting ${name}`);
    }
  } finally {
    await db.close();
    await test.drop();
  }
});

Deno.test("encryption rotate-key: the CLI rotates from its environment, and refuses what it cannot", async () => {
  const test = await freshDatabase({ migrated: true });
  try {
    const db = await connectTestDatabase(test);
    try {
      await seedUnderOldKey(db.sql);
    } finally {
      await db.close();
    }
    const rotatingEnv = {
      ...test.env,
      ENCRYPTION_KEY: NEW_KEY_TEXT,
      ENCRYPTION_KEY_PREVIOUS: TEST_ENCRYPTION_KEY,
    };

    // The new key alone: refused before anything is written, with the way out.
    const alone = await runCli(["encryption", "rotate-key"], {
      ...test.env,
      ENCRYPTION_KEY: NEW_KEY_TEXT,
    });
    assert.equal(alone.code, 1);
    assert.equal(alone.json.error, "ENCRYPTION_KEY_MISMATCH");
    assert.match(alone.json.message, /ENCRYPTION_KEY_PREVIOUS/);

    const rotated = await runCli(["encryption", "rotate-key"], rotatingEnv);
    assert.equal(rotated.code, 0, rotated.stderr);
    assert.deepEqual(rotated.json, {
      keyId: masterKeyId(NEW_KEY),
      previousKeyId: masterKeyId(OLD_KEY),
      resealed: {
        webhookSecrets: 1,
        previousWebhookSecrets: 1,
        storeaCredentials: 1,
        storebCredentials: 1,
        settings: 2,
      },
      alreadyCurrent: 0,
    });
    assert.ok(!rotated.stdout.includes(NEW_KEY_TEXT) && !rotated.stderr.includes(NEW_KEY_TEXT));

    const again = await runCli(["encryption", "rotate-key"], rotatingEnv);
    assert.equal(again.code, 0, again.stderr);
    assert.equal(again.json.alreadyCurrent, 6);

    // With only the new key, every command works; the old key is refused.
    const shown = await runCli(["tenant", "show", "tenant_a"], {
      ...test.env,
      ENCRYPTION_KEY: NEW_KEY_TEXT,
    });
    assert.equal(shown.code, 0, shown.stderr);
    const oldOnly = await runCli(["tenant", "list"], test.env);
    assert.equal(oldOnly.code, 1);
    assert.equal(oldOnly.json.error, "ENCRYPTION_KEY_MISMATCH");
    const lookup = await runCli(
      ["audit", "lookup", "tenant_a", "--subject", "2000000000000101"],
      { ...test.env, ENCRYPTION_KEY: NEW_KEY_TEXT },
    );
    assert.equal(lookup.code, 0, lookup.stderr);
    assert.equal(lookup.json.entries.length, 1, "the audit row from before the rotation");

    // A value that opens with neither key: SECRETS_UNREADABLE, naming it, and nothing changed.
    const third = await connectTestDatabase(test);
    try {
      await third.sql`UPDATE tenants SET webhook_secret_sealed =
        ${await new SecretBox(OTHER_KEY).seal("webhook-secret", "tenant_b", "whsec_b")}
        WHERE id = 'tenant_b'`;
    } finally {
      await third.close();
    }
    const refused = await runCli(["encryption", "rotate-key"], rotatingEnv);
    assert.equal(refused.code, 1);
    assert.equal(refused.json.error, "SECRETS_UNREADABLE");
    assert.deepEqual(refused.json.unreadable, [
      { sealed: "webhookSecrets", owner: "tenant_b", keyId: masterKeyId(OTHER_KEY) },
    ]);
  } finally {
    await test.drop();
  }
});
