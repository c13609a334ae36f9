/**
 * The admin CLI (docs/cli_reference.md, "Admin CLI"), run as real processes (`deno run main.ts ...`)
 * against a real database of this test run's engine: output shapes, exit codes, secrets printed
 * once, input validation before writing, and use with and without a running service.
 */
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { join } from "node:path";
import {
  type CliResult,
  createTenantWithKey,
  ENGINE,
  freshDatabase,
  runCli,
  startService,
  stopAndDrop,
  type TestDatabase,
} from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_ISSUER_ID,
  TEST_PUSH_SERVICE_ACCOUNT,
  writeServiceAccountFile,
  writeStoreaKeyFile,
} from "./helpers/fixtures.ts";
import { BUILD_VERSION } from "../src/version.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const ULID = "[0-9A-HJKMNP-TV-Z]{26}";
const TENANT_ID = new RegExp(`^tenant_${ULID}$`);
const KEY_ID = new RegExp(`^key_${ULID}$`);
const WEBHOOK_SECRET = /^whsec_[A-Za-z0-9_-]{43}$/;
const API_KEY = /^service_(live|test)_[A-Za-z0-9_-]{43}$/;
/** Well-formed ids that no database of this run holds. */
const UNKNOWN_TENANT = "tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV";
const UNKNOWN_KEY = "key_01ARZ3NDEKTSV4RRFFQ69G5FAV";
const LONG_SECRET = "a-given-webhook-secret-of-forty-characters";

/** A successful command: exit 0 and exactly one line on stdout, holding one JSON object. */
function ok(result: CliResult, what = "command"): Json {
  assert.equal(result.code, 0, `${what} exited ${result.code}; stderr: ${result.stderr}`);
  assert.ok(result.stdout.endsWith("\n"), `${what}: stdout must end with a newline`);
  const lines = result.stdout.slice(0, -1).split("\n");
  assert.equal(lines.length, 1, `${what}: stdout must be exactly one line: ${result.stdout}`);
  let value: Json;
  try {
    value = JSON.parse(lines[0]);
  } catch {
    assert.fail(`${what}: stdout is not JSON: ${lines[0]}`);
  }
  assert.ok(
    value !== null && typeof value === "object" && !Array.isArray(value),
    `${what}: stdout must be a JSON object: ${lines[0]}`,
  );
  return value;
}

/** A failed command: the exit code, nothing on stdout and `{error, message}` on stderr. */
function fails(result: CliResult, exitCode: 1 | 2, error: string, what = "command"): Json {
  assert.equal(
    result.code,
    exitCode,
    `${what}: expected exit ${exitCode}, got ${result.code}; stdout: ${result.stdout}; stderr: ${result.stderr}`,
  );
  assert.equal(result.stdout, "", `${what}: a failed command prints nothing on stdout`);
  const last = result.stderr.trim().split("\n").at(-1) ?? "";
  let body: Json;
  try {
    body = JSON.parse(last);
  } catch {
    assert.fail(`${what}: the last stderr line is not JSON: ${result.stderr}`);
  }
  assert.equal(body.error, error, `${what}: stderr ${last}`);
  assert.equal(typeof body.message, "string", `${what}: message`);
  return body;
}

function assertRecentIso(value: unknown, what: string): void {
  assert.equal(typeof value, "string", `${what} must be a string`);
  assert.equal(new Date(value as string).toISOString(), value, `${what} must be ISO 8601`);
  const age = Date.now() - Date.parse(value as string);
  assert.ok(age > -60_000 && age < 600_000, `${what} must be recent: ${value}`);
}

/** Everything a process printed, on both streams. */
function printed(...results: CliResult[]): string {
  return results.map((r) => r.stdout + r.stderr).join("\n");
}

/** The base64 body lines of a PEM file (the secret part). */
function pemBody(pem: string): string[] {
  return pem.split("\n").filter((line) => line !== "" && !line.startsWith("-----"));
}

function assertNoPem(output: string, pem: string, what: string): void {
  const body = pemBody(pem);
  assert.ok(body.length > 0);
  for (const line of body) {
    assert.ok(!output.includes(line), `${what} must not print key material`);
  }
  assert.ok(!output.includes(body.join("")), `${what} must not print key material`);
  assert.ok(!output.includes("PRIVATE KEY"), `${what} must not print a PEM`);
}

async function withDatabase(fn: (db: TestDatabase) => Promise<void>): Promise<void> {
  const db = await freshDatabase({ migrated: true });
  try {
    await fn(db);
  } finally {
    await db.drop();
  }
}

Deno.test("cli: version prints {version}; migrate applies the migrations once", async () => {
  // `version` needs no database.
  const scratch = await Deno.makeTempDir({ prefix: "pr-cli-" });
  try {
    const version = ok(await runCli(["version"], { DATA_DIR: scratch }), "version");
    assert.deepEqual(version, { version: BUILD_VERSION });
    const stamped = ok(
      await runCli(["version"], { DATA_DIR: scratch, SERVICE_VERSION: "v9.8.7" }),
      "version with SERVICE_VERSION",
    );
    assert.deepEqual(stamped, { version: "v9.8.7" });
  } finally {
    await Deno.remove(scratch, { recursive: true }).catch(() => {});
  }

  // A database that has never been migrated: an empty PostgreSQL database, or an empty DATA_DIR.
  const migrations = [...Deno.readDirSync(new URL("../migrations/", import.meta.url))]
    .map((entry) => entry.name)
    .filter((name) => /^\d{4}_[a-z0-9_]+\.sql$/.test(name))
    .sort();
  assert.ok(migrations.length > 0);
  const empty = await freshDatabase({ migrated: false });
  const env = empty.env;
  try {
    const first = ok(await runCli(["migrate"], env), "first migrate");
    const second = ok(await runCli(["migrate"], env), "second migrate");
    assert.deepEqual(second, { applied: [], engine: ENGINE }, "a second migrate applies nothing");
    assert.deepEqual(
      first,
      { applied: migrations, engine: ENGINE },
      "the first migrate on an empty database prints the migrations it applied",
    );
  } finally {
    await empty.drop();
  }
});

Deno.test("cli: exit codes 1 (missing target) and 2 (bad usage) with a JSON error on stderr", async () => {
  await withDatabase(async (db) => {
    const cli = (...args: string[]) => runCli(args, db.env);

    // 2: bad usage.
    fails(await cli("frobnicate"), 2, "USAGE", "unknown command");
    fails(await cli("constructor"), 2, "USAGE", "a name of Object's methods is no command");
    fails(await cli("toString", "x"), 2, "USAGE", "a name of Object's methods is no command");
    fails(await cli("tenant", "frobnicate"), 2, "USAGE", "unknown subcommand");
    fails(await cli("tenant", "create"), 2, "USAGE", "tenant create without --name");
    fails(
      await cli("tenant", "create", "--name", "x", "--colour", "red"),
      2,
      "USAGE",
      "unknown flag",
    );
    fails(
      await cli("tenant", "create", "--name", "x", "--webhook-secret", LONG_SECRET),
      2,
      "USAGE",
      "--webhook-secret without --callback-url",
    );
    fails(await cli("key", "create", UNKNOWN_TENANT, "--env", "prod"), 2, "USAGE", "--env prod");
    fails(await cli("key", "create"), 2, "USAGE", "key create without TENANT_ID");
    fails(await cli("tenant", "show"), 2, "USAGE", "tenant show without ID");

    // 1: the target does not exist.
    const notFound = fails(
      await cli("tenant", "show", UNKNOWN_TENANT),
      1,
      "TENANT_NOT_FOUND",
      "tenant show unknown",
    );
    assert.ok(notFound.message.includes(UNKNOWN_TENANT));
    fails(await cli("key", "revoke", UNKNOWN_KEY), 1, "KEY_NOT_FOUND", "key revoke unknown");
    fails(
      await cli("key", "create", UNKNOWN_TENANT),
      1,
      "TENANT_NOT_FOUND",
      "key create unknown tenant",
    );
    fails(await cli("key", "list", UNKNOWN_TENANT), 1, "TENANT_NOT_FOUND", "key list unknown");
    fails(
      await cli("tenant", "deactivate", UNKNOWN_TENANT),
      1,
      "TENANT_NOT_FOUND",
      "tenant deactivate unknown",
    );
    fails(
      await cli("tenant", "activate", UNKNOWN_TENANT),
      1,
      "TENANT_NOT_FOUND",
      "tenant activate unknown",
    );

    // None of that wrote anything.
    assert.deepEqual(ok(await cli("tenant", "list"), "tenant list"), { tenants: [] });
  });
});

Deno.test("cli: tenant create, list, show, deactivate, activate; the webhook secret is printed once", async () => {
  await withDatabase(async (db) => {
    const cli = (...args: string[]) => runCli(args, db.env);

    // Without a callback: no secret at all.
    const plain = ok(await cli("tenant", "create", "--name", "Plain tenant"), "create plain");
    assert.deepEqual(Object.keys(plain).sort(), [
      "active",
      "callbackUrl",
      "createdAt",
      "id",
      "name",
    ]);
    assert.match(plain.id, TENANT_ID);
    assert.equal(plain.name, "Plain tenant");
    assert.equal(plain.active, true);
    assert.equal(plain.callbackUrl, null);
    assert.ok(!("webhookSecret" in plain));
    assertRecentIso(plain.createdAt, "createdAt");

    // With a callback: a generated secret.
    const hooked = ok(
      await cli(
        "tenant",
        "create",
        "--name",
        "Hooked",
        "--callback-url",
        "http://127.0.0.1:9/hook",
      ),
      "create with callback",
    );
    assert.match(hooked.id, TENANT_ID);
    assert.notEqual(hooked.id, plain.id);
    assert.equal(hooked.callbackUrl, "http://127.0.0.1:9/hook");
    assert.equal(hooked.active, true);
    assert.match(hooked.webhookSecret, WEBHOOK_SECRET);
    assertRecentIso(hooked.createdAt, "createdAt");

    // A given secret of at least 32 characters is used as given.
    const given = ok(
      await cli(
        "tenant",
        "create",
        "--name",
        "Given",
        "--callback-url",
        "http://127.0.0.1:9/given",
        "--webhook-secret",
        LONG_SECRET,
      ),
      "create with a given secret",
    );
    assert.equal(given.webhookSecret, LONG_SECRET);

    // A shorter one is refused, and nothing is created.
    const weak = await cli(
      "tenant",
      "create",
      "--name",
      "Weak",
      "--callback-url",
      "http://127.0.0.1:9/weak",
      "--webhook-secret",
      "x".repeat(31),
    );
    assert.equal(weak.code, 1, `a 31-character secret must be refused: ${weak.stderr}`);
    assert.equal(weak.stdout, "");

    // list and show never print a secret again.
    const list = await cli("tenant", "list");
    const tenants = ok(list, "tenant list").tenants;
    assert.ok(Array.isArray(tenants));
    assert.deepEqual(tenants.map((t: Json) => t.id), [plain.id, hooked.id, given.id]);
    assert.ok(!tenants.some((t: Json) => t.name === "Weak"));
    const listed = tenants.find((t: Json) => t.id === hooked.id);
    assert.equal(listed.name, "Hooked");
    assert.equal(listed.active, true);
    assert.equal(listed.callbackUrl, "http://127.0.0.1:9/hook");
    assert.equal(listed.createdAt, hooked.createdAt);

    const showHooked = await cli("tenant", "show", hooked.id);
    const shown = ok(showHooked, "tenant show");
    assert.equal(shown.id, hooked.id);
    assert.equal(shown.name, "Hooked");
    assert.equal(shown.active, true);
    assert.equal(shown.callbackUrl, "http://127.0.0.1:9/hook");
    assert.equal(shown.createdAt, hooked.createdAt);
    assert.equal(shown.storea, null);
    assert.equal(shown.storeb, null);
    assert.ok(!("webhookSecret" in shown));
    const showGiven = await cli("tenant", "show", given.id);
    ok(showGiven, "tenant show given");
    for (const secret of [hooked.webhookSecret, LONG_SECRET]) {
      assert.ok(
        !printed(list, showHooked, showGiven).includes(secret),
        "tenant list and tenant show must not print a webhook secret",
      );
    }

    // deactivate / activate flip `active`, and show agrees.
    const off = ok(await cli("tenant", "deactivate", plain.id), "deactivate");
    assert.equal(off.id, plain.id);
    assert.equal(off.active, false);
    assert.equal(ok(await cli("tenant", "show", plain.id)).active, false);
    const on = ok(await cli("tenant", "activate", plain.id), "activate");
    assert.equal(on.id, plain.id);
    assert.equal(on.active, true);
    const after = ok(await cli("tenant", "list")).tenants;
    assert.deepEqual(after.map((t: Json) => [t.id, t.active]), [
      [plain.id, true],
      [hooked.id, true],
      [given.id, true],
    ]);
  });
});

Deno.test("cli: tenant set-callback prints a webhook secret only when one is newly set", async () => {
  await withDatabase(async (db) => {
    const cli = (...args: string[]) => runCli(args, db.env);
    const tenant = ok(await cli("tenant", "create", "--name", "Later hooked"), "create");
    assert.ok(!("webhookSecret" in tenant));

    // No secret yet: one is generated and printed.
    const first = ok(
      await cli("tenant", "set-callback", tenant.id, "--url", "http://127.0.0.1:9/a"),
      "first set-callback",
    );
    assert.equal(first.id, tenant.id);
    assert.equal(first.callbackUrl, "http://127.0.0.1:9/a");
    assert.match(first.webhookSecret, WEBHOOK_SECRET);

    // It has one now: kept, not printed.
    const second = await cli("tenant", "set-callback", tenant.id, "--url", "http://127.0.0.1:9/b");
    const moved = ok(second, "second set-callback");
    assert.equal(moved.callbackUrl, "http://127.0.0.1:9/b");
    assert.ok(!("webhookSecret" in moved), "an existing secret is not printed again");
    assert.ok(!printed(second).includes(first.webhookSecret));

    // A given one replaces it and is printed.
    const replaced = ok(
      await cli(
        "tenant",
        "set-callback",
        tenant.id,
        "--url",
        "http://127.0.0.1:9/c",
        "--webhook-secret",
        LONG_SECRET,
      ),
      "set-callback with a given secret",
    );
    assert.equal(replaced.callbackUrl, "http://127.0.0.1:9/c");
    assert.equal(replaced.webhookSecret, LONG_SECRET);

    // A short one is refused and changes nothing.
    const weak = await cli(
      "tenant",
      "set-callback",
      tenant.id,
      "--url",
      "http://127.0.0.1:9/d",
      "--webhook-secret",
      "too-short",
    );
    assert.equal(weak.code, 1, `a short secret must be refused: ${weak.stderr}`);
    assert.equal(weak.stdout, "");

    fails(
      await cli("tenant", "set-callback", tenant.id),
      2,
      "USAGE",
      "set-callback without --url",
    );
    fails(
      await cli("tenant", "set-callback", UNKNOWN_TENANT, "--url", "http://127.0.0.1:9/x"),
      1,
      "TENANT_NOT_FOUND",
      "set-callback unknown tenant",
    );

    const show = await cli("tenant", "show", tenant.id);
    assert.equal(ok(show).callbackUrl, "http://127.0.0.1:9/c");
    const list = await cli("tenant", "list");
    ok(list);
    for (const secret of [first.webhookSecret, LONG_SECRET]) {
      assert.ok(!printed(show, list).includes(secret), "the secret is never printed again");
    }
  });
});

Deno.test("cli: in production a callback URL must be https and public", async () => {
  await withDatabase(async (db) => {
    const env = { ...db.env, NODE_ENV: "production" };
    const create = (url: string) =>
      runCli(["tenant", "create", "--name", "Prod", "--callback-url", url], env);

    const http = fails(
      await create("http://example.com/x"),
      1,
      "INVALID_CALLBACK_URL",
      "http in production",
    );
    assert.match(http.message, /https/);
    for (const url of ["https://127.0.0.1/x", "https://10.0.0.1/x", "https://169.254.169.254/x"]) {
      fails(await create(url), 1, "INVALID_CALLBACK_URL", url);
    }

    const tenant = ok(await create("https://example.com/x"), "https public callback");
    assert.equal(tenant.callbackUrl, "https://example.com/x");
    assert.match(tenant.webhookSecret, WEBHOOK_SECRET);

    fails(
      await runCli(["tenant", "set-callback", tenant.id, "--url", "http://example.com/y"], env),
      1,
      "INVALID_CALLBACK_URL",
      "set-callback http in production",
    );
    // Nothing but the one good tenant was created, and its callback is unchanged.
    const tenants = ok(await runCli(["tenant", "list"], env)).tenants;
    assert.deepEqual(tenants.map((t: Json) => [t.id, t.callbackUrl]), [
      [tenant.id, "https://example.com/x"],
    ]);
  });
});

Deno.test("cli: key create, list and revoke; the key is printed once", async () => {
  await withDatabase(async (db) => {
    const cli = (...args: string[]) => runCli(args, db.env);
    const tenant = ok(await cli("tenant", "create", "--name", "Keyed"), "tenant create");

    const live = ok(await cli("key", "create", tenant.id), "key create (default env)");
    assert.deepEqual(Object.keys(live).sort(), [
      "createdAt",
      "env",
      "id",
      "key",
      "name",
      "tenantId",
    ]);
    assert.match(live.id, KEY_ID);
    assert.equal(live.tenantId, tenant.id);
    assert.equal(live.env, "live", "the default env is live");
    assert.equal(live.name, null);
    assert.match(live.key, API_KEY);
    assert.ok(live.key.startsWith("service_live_"));
    assertRecentIso(live.createdAt, "createdAt");

    const test = ok(
      await cli("key", "create", tenant.id, "--env", "test", "--name", "CI key"),
      "key create --env test",
    );
    assert.match(test.id, KEY_ID);
    assert.equal(test.env, "test");
    assert.equal(test.name, "CI key");
    assert.match(test.key, API_KEY);
    assert.ok(test.key.startsWith("service_test_"));
    assert.notEqual(test.key, live.key);

    const explicitLive = ok(
      await cli("key", "create", tenant.id, "--env", "live"),
      "key create --env live",
    );
    assert.ok(explicitLive.key.startsWith("service_live_"));

    const listing = await cli("key", "list", tenant.id);
    const keys = ok(listing, "key list").keys;
    assert.ok(Array.isArray(keys));
    assert.deepEqual(keys.map((k: Json) => k.id), [live.id, test.id, explicitLive.id]);
    for (const key of keys) {
      assert.deepEqual(Object.keys(key).sort(), [
        "createdAt",
        "env",
        "id",
        "lastUsedAt",
        "name",
        "prefix",
        "revokedAt",
      ]);
      assert.equal(key.revokedAt, null);
      assert.equal(key.lastUsedAt, null);
    }
    const [liveListed, testListed] = keys;
    assert.equal(liveListed.env, "live");
    assert.equal(liveListed.name, null);
    assert.equal(liveListed.createdAt, live.createdAt);
    assert.equal(testListed.env, "test");
    assert.equal(testListed.name, "CI key");
    assert.ok(live.key.startsWith(liveListed.prefix) && liveListed.prefix.length < live.key.length);
    assert.ok(test.key.startsWith(testListed.prefix) && testListed.prefix.length < test.key.length);
    for (const full of [live.key, test.key, explicitLive.key]) {
      assert.ok(!printed(listing).includes(full), "key list must not print a full key");
      // Not even its random part.
      assert.ok(!printed(listing).includes(full.slice(-43)), "key list must not print a key");
    }

    const revoked = ok(await cli("key", "revoke", test.id), "key revoke");
    assert.deepEqual(Object.keys(revoked).sort(), ["id", "revokedAt"]);
    assert.equal(revoked.id, test.id);
    assertRecentIso(revoked.revokedAt, "revokedAt");

    const afterRevoke = ok(await cli("key", "list", tenant.id)).keys;
    const byId = new Map(afterRevoke.map((k: Json) => [k.id, k]));
    assert.equal((byId.get(test.id) as Json).revokedAt, revoked.revokedAt);
    assert.equal((byId.get(live.id) as Json).revokedAt, null);
    assert.equal((byId.get(explicitLive.id) as Json).revokedAt, null);

    // Another tenant's listing does not show these keys.
    const other = ok(await cli("tenant", "create", "--name", "Other"));
    assert.deepEqual(ok(await cli("key", "list", other.id)), { keys: [] });
  });
});

Deno.test("cli: storea set-credentials takes only an EC P-256 key and never prints it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-cli-keys-" });
  try {
    await withDatabase(async (db) => {
      const cli = (...args: string[]) => runCli(args, db.env);
      const tenant = ok(await cli("tenant", "create", "--name", "Store A"), "tenant create");
      const goodKey = await writeStoreaKeyFile(dir);
      const pem = await Deno.readTextFile(goodKey);
      const setCredentials = (keyFile: string, ...extra: string[]) =>
        cli(...storeaCredentialArgs(tenant.id, keyFile), ...extra);

      // Bad key files: exit 1, before anything is written.
      const write = async (name: string, text: string) => {
        const path = join(dir, name);
        await Deno.writeTextFile(path, text);
        return path;
      };
      const p384 = await write(
        "p384.p8",
        generateKeyPairSync("ec", { namedCurve: "secp384r1" }).privateKey
          .export({ type: "pkcs8", format: "pem" }) as string,
      );
      const rsa = await write(
        "rsa.p8",
        generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey
          .export({ type: "pkcs8", format: "pem" }) as string,
      );
      const publicOnly = await write(
        "public.pem",
        generateKeyPairSync("ec", { namedCurve: "prime256v1" }).publicKey
          .export({ type: "spki", format: "pem" }) as string,
      );
      const garbage = await write("garbage.p8", "-----BEGIN PRIVATE KEY-----\nnot a key\n");
      const bad: [string, string][] = [
        [p384, "a P-384 key"],
        [rsa, "an RSA key"],
        [publicOnly, "a public key"],
        [garbage, "a garbage file"],
        [join(dir, "missing.p8"), "a missing file"],
      ];
      for (const [path, what] of bad) {
        const result = await setCredentials(path);
        assert.equal(result.code, 1, `${what} must be refused with exit 1: ${result.stderr}`);
        assert.equal(result.stdout, "", what);
        const body = JSON.parse(result.stderr.trim().split("\n").at(-1)!);
        assert.equal(typeof body.error, "string", what);
        assert.equal(typeof body.message, "string", what);
      }
      assert.equal(ok(await cli("tenant", "show", tenant.id)).storea, null, "nothing written");

      // Bad usage: exit 2.
      fails(
        await cli(
          "storea",
          "set-credentials",
          tenant.id,
          "--bundle-id",
          "com.example.app",
          "--key-id",
          "ABC123DEFG",
          "--issuer-id",
          "not-a-uuid",
          "--private-key-file",
          goodKey,
        ),
        2,
        "USAGE",
        "bad --issuer-id",
      );
      fails(await setCredentials(goodKey, "--environment", "staging"), 2, "USAGE", "--environment");
      fails(
        await cli(...storeaCredentialArgs(UNKNOWN_TENANT, goodKey)),
        1,
        "TENANT_NOT_FOUND",
        "storea set-credentials unknown tenant",
      );

      // A good key.
      const set = await setCredentials(
        goodKey,
        "--environment",
        "sandbox",
        "--app-id",
        "1234567890",
      );
      const saved = ok(set, "storea set-credentials");
      assert.equal(saved.tenantId, tenant.id);
      const expected = {
        bundleId: "com.example.app",
        keyId: "ABC123DEFG",
        issuerId: TEST_ISSUER_ID,
        environment: "sandbox",
        appId: 1234567890,
      };
      for (const [field, value] of Object.entries(expected)) {
        assert.deepEqual(saved.storea[field], value, `set-credentials storea.${field}`);
      }

      const show = await cli("tenant", "show", tenant.id);
      const shown = ok(show, "tenant show");
      for (const [field, value] of Object.entries(expected)) {
        assert.deepEqual(shown.storea[field], value, `tenant show storea.${field}`);
      }
      for (const field of Object.keys(shown.storea)) {
        assert.ok(!/private|pem|sealed|secret/i.test(field), `storea.${field} must not be shown`);
      }
      assert.equal(shown.storeb, null);
      const list = await cli("tenant", "list");
      ok(list);
      assertNoPem(printed(set, show, list), pem, "storea set-credentials, tenant show and list");

      // Replacing them with the default environment and no app id.
      const replaced = ok(await setCredentials(goodKey), "storea set-credentials again");
      assert.equal(replaced.storea.environment, "auto");
      assert.equal(replaced.storea.appId, null);
    });
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test("cli: storeb set-credentials takes only a service-account file and never prints its key", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-cli-sa-" });
  try {
    await withDatabase(async (db) => {
      const cli = (...args: string[]) => runCli(args, db.env);
      const tenant = ok(await cli("tenant", "create", "--name", "Store B"), "tenant create");
      const { path: goodFile, clientEmail } = await writeServiceAccountFile(dir);
      const account = JSON.parse(await Deno.readTextFile(goodFile));
      const setCredentials = (file: string, tenantId = tenant.id) =>
        cli(...storebCredentialArgs(tenantId, file));

      const write = async (name: string, text: string) => {
        const path = join(dir, name);
        await Deno.writeTextFile(path, text);
        return path;
      };
      const { client_email: _, ...noEmail } = account;
      const bad: [string, string][] = [
        [await write("user.json", JSON.stringify({ ...account, type: "user" })), 'type "user"'],
        [await write("no-email.json", JSON.stringify(noEmail)), "no client_email"],
        [await write("not-json.json", "this is { not JSON"), "not JSON"],
        [join(dir, "missing.json"), "a missing file"],
      ];
      for (const [path, what] of bad) {
        const result = await setCredentials(path);
        assert.equal(result.code, 1, `${what} must be refused with exit 1: ${result.stderr}`);
        assert.equal(result.stdout, "", what);
        const body = JSON.parse(result.stderr.trim().split("\n").at(-1)!);
        assert.equal(typeof body.error, "string", what);
        assert.ok(!result.stderr.includes("PRIVATE KEY"), `${what}: no key in the error`);
      }
      // The push service account is required: without it, a usage error and nothing written.
      const args = storebCredentialArgs(tenant.id, goodFile);
      const withoutAccount = args.slice(0, args.indexOf("--push-service-account"));
      const usage = fails(await cli(...withoutAccount), 2, "USAGE", "no --push-service-account");
      assert.match(usage.message, /--push-service-account is required/);
      fails(
        await cli(...withoutAccount, "--push-service-account", "not an email"),
        2,
        "USAGE",
        "--push-service-account not an email",
      );
      assert.equal(ok(await cli("tenant", "show", tenant.id)).storeb, null, "nothing written");
      fails(
        await setCredentials(goodFile, UNKNOWN_TENANT),
        1,
        "TENANT_NOT_FOUND",
        "storeb set-credentials unknown tenant",
      );

      const set = await setCredentials(goodFile);
      const saved = ok(set, "storeb set-credentials");
      assert.equal(saved.tenantId, tenant.id);
      assert.equal(saved.storeb.clientEmail, clientEmail);
      assert.equal(saved.storeb.packageName, "com.example.app");
      assert.equal(saved.storeb.pushAudience, "https://relay.example.com/push");
      assert.equal(saved.storeb.pushServiceAccount, TEST_PUSH_SERVICE_ACCOUNT);
      assert.equal(saved.storeb.missing, undefined, "nothing is missing");

      const show = await cli("tenant", "show", tenant.id);
      const shown = ok(show, "tenant show");
      assert.equal(shown.storeb.clientEmail, clientEmail);
      assert.equal(shown.storeb.packageName, "com.example.app");
      assert.equal(shown.storeb.pushAudience, "https://relay.example.com/push");
      for (const field of Object.keys(shown.storeb)) {
        assert.ok(!/private|sealed|secret|json/i.test(field), `storeb.${field} must not be shown`);
      }
      assert.equal(shown.storea, null);
      const output = printed(set, show);
      assertNoPem(output, account.private_key, "storeb set-credentials and tenant show");
      assert.ok(!output.includes("private_key"), "the service-account file is not printed");
    });
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test("cli: works while the service runs, and the service accepts the key at once", async () => {
  const service = await startService();
  try {
    const listening = service.logs.find((line) => line.msg === "listening");
    assert.equal(listening?.database, ENGINE, "the service runs on this test run's engine");

    assert.deepEqual(ok(await service.cli("migrate"), "migrate"), { applied: [], engine: ENGINE });
    const tenant = ok(
      await service.cli("tenant", "create", "--name", "Live tenant"),
      "tenant create",
    );
    const key = ok(await service.cli("key", "create", tenant.id, "--env", "test"), "key create");
    assert.match(key.key, API_KEY);

    const ready = await fetch(`${service.url}/ready`);
    await ready.body?.cancel();
    assert.equal(ready.status, 200, "the service stays ready while the CLI uses its database");

    const verify = (token: string) =>
      fetch(`${service.url}/v1/storea/verify`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ transactionId: "1" }),
      });
    const response = await verify(key.key);
    const body = await response.json();
    assert.equal(response.status, 400, `the new key must authenticate: ${JSON.stringify(body)}`);
    assert.equal(body.error, "CREDENTIALS_MISSING");

    const shown = ok(await service.cli("tenant", "show", tenant.id), "tenant show");
    assert.equal(shown.active, true);

    // A revoked key is refused within a second by the running service.
    ok(await service.cli("key", "revoke", key.id), "key revoke");
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    const refused = await verify(key.key);
    const refusedBody = await refused.json();
    assert.equal(refused.status, 401, JSON.stringify(refusedBody));
    assert.equal(refusedBody.error, "UNAUTHENTICATED");

    const stillReady = await fetch(`${service.url}/ready`);
    await stillReady.body?.cancel();
    assert.equal(stillReady.status, 200);
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("cli: works with no service running, and a service started later sees its writes", async () => {
  const db = await freshDatabase({ migrated: true });
  let service: Awaited<ReturnType<typeof startService>> | undefined;
  try {
    const tenant = ok(await runCli(["tenant", "create", "--name", "Offline"], db.env), "create");
    const key = ok(await runCli(["key", "create", tenant.id], db.env), "key create");
    assert.equal(key.env, "live");
    const tenants = ok(await runCli(["tenant", "list"], db.env), "tenant list").tenants;
    assert.deepEqual(tenants.map((t: Json) => t.id), [tenant.id]);
    assert.deepEqual(ok(await runCli(["migrate"], db.env), "migrate"), {
      applied: [],
      engine: ENGINE,
    });

    // The CLI released the database: a service can start on it and accepts the key.
    service = await startService({ db });
    const response = await fetch(`${service.url}/v1/storea/verify`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.key}`, "content-type": "application/json" },
      body: JSON.stringify({ transactionId: "1" }),
    });
    const body = await response.json();
    assert.equal(response.status, 400, JSON.stringify(body));
    assert.equal(body.error, "CREDENTIALS_MISSING");
  } finally {
    if (service) await stopAndDrop(service);
    else await db.drop();
  }
});

Deno.test("cli: a key other than the database's is refused before anything is written", async () => {
  const service = await startService();
  try {
    const { tenantId } = await createTenantWithKey(service);
    const otherKey = btoa(String.fromCharCode(...new Uint8Array(32).fill(9)));
    const refused = await runCli(["tenant", "create", "--name", "Wrong key"], {
      ...service.env,
      ENCRYPTION_KEY: otherKey,
    });
    assert.equal(refused.code, 1);
    assert.equal(JSON.parse(refused.stderr).error, "ENCRYPTION_KEY_MISMATCH");
    const listed = ok(await service.cli("tenant", "list"), "tenant list");
    assert.deepEqual(listed.tenants.map((t: Json) => t.id), [tenantId]);
  } finally {
    await stopAndDrop(service);
  }
});
