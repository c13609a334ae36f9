/**
 * Only `serve` and `migrate` change the schema: every other CLI command refuses a database whose
 * recorded migrations are not its version's (none, fewer or more), changes nothing, and says
 * what to run. On this test run's engine.
 */
import assert from "node:assert/strict";
import {
  type CliResult,
  ENGINE,
  freshDatabase,
  runCli,
  type TestDatabase,
} from "./helpers/service.ts";
import { connectDatabase, type Database } from "../src/db/connect.ts";
import { migrate, readMigrations } from "../src/db/migrate.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** The refusal: exit 1, nothing on stdout, SCHEMA_MISMATCH with the lists on stderr. */
function refused(result: CliResult, what: string): Json {
  assert.equal(result.code, 1, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  assert.equal(result.stdout, "", `${what}: nothing on stdout`);
  const body = JSON.parse(result.stderr.trim().split("\n").at(-1)!);
  assert.equal(body.error, "SCHEMA_MISMATCH", `${what}: ${result.stderr}`);
  return body;
}

function ok(result: CliResult, what: string): Json {
  assert.equal(result.code, 0, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  return result.json;
}

/** Opens the test database in this process (the embedded engine privately, as a CLI does). */
async function open(db: TestDatabase): Promise<Database> {
  return await connectDatabase({
    databaseUrl: db.env.DATABASE_URL ?? null,
    dataDir: db.dataDir,
    poolSize: 1,
    timeoutMs: 30_000,
    shareEmbedded: false,
  });
}

async function recorded(db: TestDatabase): Promise<string[]> {
  const database = await open(db);
  try {
    const [{ present }] = await database.sql`
      SELECT to_regclass('schema_migrations') IS NOT NULL AS present`;
    if (!present) return [];
    return (await database.sql`SELECT name FROM schema_migrations ORDER BY name`)
      .map((row) => row.name);
  } finally {
    await database.close();
  }
}

const files = (await readMigrations()).map((file) => file.name);

Deno.test(`cli schema (${ENGINE}): an empty database is refused until migrate`, async () => {
  const db = await freshDatabase({ migrated: false });
  try {
    const cli = (...args: string[]) => runCli(args, db.env);
    const body = refused(await cli("tenant", "create", "--name", "Too early"), "empty");
    assert.match(
      body.message,
      /no schema yet: run `purchase-relay migrate` \(or start the service\)/,
    );
    assert.deepEqual(body.missing, files);
    assert.deepEqual(body.unknown, []);
    refused(await cli("tenant", "list"), "tenant list on an empty database");
    assert.deepEqual(await recorded(db), [], "the refused commands changed no schema");

    assert.deepEqual(ok(await cli("migrate"), "migrate").applied, files);
    assert.deepEqual(ok(await cli("tenant", "list"), "after migrate").tenants, []);
  } finally {
    await db.drop();
  }
});

Deno.test(`cli schema (${ENGINE}): an older schema (a migration missing) is refused`, async () => {
  const db = await freshDatabase({ migrated: false });
  try {
    // The database as the previous version left it: every migration but the last.
    const all = await readMigrations();
    const database = await open(db);
    try {
      await migrate(database.sql, all.slice(0, -1));
    } finally {
      await database.close();
    }
    const last = all.at(-1)!.name;
    const cli = (...args: string[]) => runCli(args, db.env);

    const body = refused(await cli("tenant", "create", "--name", "Old schema"), "older");
    assert.deepEqual(body.missing, [last]);
    assert.deepEqual(body.unknown, []);
    assert.ok(body.message.includes(last), "the message names the missing migration");
    assert.match(body.message, /run `purchase-relay migrate` with this version first/);
    refused(await cli("deliveries", "list"), "deliveries list");
    refused(await cli("key", "revoke", "key_01ARZ3NDEKTSV4RRFFQ69G5FAV"), "key revoke");
    assert.deepEqual(await recorded(db), files.slice(0, -1), "no command migrated behind us");

    assert.deepEqual(ok(await cli("migrate"), "migrate").applied, [last]);
    ok(await cli("tenant", "create", "--name", "Now"), "after migrate");
  } finally {
    await db.drop();
  }
});

Deno.test(`cli schema (${ENGINE}): a newer schema (an unknown migration) is refused`, async () => {
  const db = await freshDatabase({ migrated: true });
  try {
    const future = "9999_from_a_newer_version.sql";
    const database = await open(db);
    try {
      await database.sql`INSERT INTO schema_migrations (name) VALUES (${future})`;
    } finally {
      await database.close();
    }
    const cli = (...args: string[]) => runCli(args, db.env);

    const body = refused(await cli("tenant", "create", "--name", "New schema"), "newer");
    assert.deepEqual(body.missing, []);
    assert.deepEqual(body.unknown, [future]);
    assert.match(body.message, /migrated by a newer version; use that version's CLI/);
    refused(await cli("tenant", "list"), "tenant list");

    // `migrate` of an older version has nothing to apply, and removes nothing.
    assert.deepEqual(ok(await cli("migrate"), "migrate").applied, []);
    assert.deepEqual(await recorded(db), [...files, future]);

    // Nothing was written by the refused commands.
    const check = await open(db);
    try {
      const [{ count }] = await check.sql`SELECT count(*)::int AS count FROM tenants`;
      assert.equal(count, 0);
    } finally {
      await check.close();
    }
  } finally {
    await db.drop();
  }
});

Deno.test(`cli schema (${ENGINE}): a matching schema is used as it is`, async () => {
  const db = await freshDatabase({ migrated: true });
  try {
    const cli = (...args: string[]) => runCli(args, db.env);
    const tenant = ok(await cli("tenant", "create", "--name", "Matching"), "tenant create");
    assert.deepEqual(
      ok(await cli("tenant", "list"), "tenant list").tenants.map((t: Json) => t.id),
      [tenant.id],
    );
    assert.deepEqual(await recorded(db), files);
    // version and help open no database at all: they work on any schema, or none.
    ok(await runCli(["version"], { DATA_DIR: "/nonexistent/never-opened" }), "version");
  } finally {
    await db.drop();
  }
});
