/**
 * The configuration table of src/config.ts, checked row by row: each variable once, each field
 * once, every row documented, and no secret value in any refusal. (The values read, defaults and
 * messages: tests/unit_test.ts, tests/callback_policy_test.ts, tests/pgbouncer_test.ts.)
 */
import assert from "node:assert/strict";
import { CONFIG_GROUPS, CONFIG_VARIABLES, ConfigError, readConfig } from "../src/config.ts";

const MARK = "s3cret-Value";

Deno.test("config table: each variable and each field once, every row documented", () => {
  const names = CONFIG_VARIABLES.map((row) => row.name);
  assert.equal(new Set(names).size, names.length, "a variable has two rows");
  const fields = CONFIG_VARIABLES.flatMap((row) => row.field === null ? [] : [row.field]);
  assert.equal(new Set(fields).size, fields.length, "a field is filled by two rows");
  assert.deepEqual(
    CONFIG_GROUPS.flatMap((group) => group.variables.map((row) => row.name)),
    names,
  );
  const config = readConfig({});
  for (const row of CONFIG_VARIABLES) {
    assert.match(row.name, /^[A-Z][A-Z0-9_]*$/);
    assert.match(row.description, /^\S.*[.)]$/, `${row.name}: one line that ends a sentence`);
    assert.ok(row.parser.accepts.length > 0, `${row.name}: what it accepts`);
    assert.ok(
      (row.default !== undefined) !== (row.unset !== undefined),
      `${row.name}: a default text or a value when unset, one of the two`,
    );
    if (row.unset !== undefined) assert.ok(row.defaultText, `${row.name}: say what unset means`);
    if (row.needs !== undefined) assert.ok(names.includes(row.needs), `${row.name}: needs`);
    if (row.field !== null) assert.ok(row.field in config, `${row.name}: ${row.field} is filled`);
    else assert.ok(row.deprecated, `${row.name}: only a deprecated variable fills no field`);
  }
});

Deno.test("config table: a secret's value is never in its refusal", () => {
  const secrets = CONFIG_VARIABLES.filter((row) => row.secret);
  assert.deepEqual(
    secrets.map((row) => row.name).sort(),
    ["DATABASE_LISTEN_URL", "DATABASE_URL", "ENCRYPTION_KEY", "ENCRYPTION_KEY_PREVIOUS"],
  );
  const database = {
    DATABASE_URL: "postgres://relay@db.internal/relay",
    ENCRYPTION_KEY: btoa(String.fromCharCode(...new Uint8Array(32).fill(1))),
  };
  for (const row of secrets) {
    // Each refused in its own way: not a URL, a URL of another scheme, not base64, too short.
    for (const bad of [MARK, `mysql://u:${MARK}@h/db`, `${MARK}!!`, btoa(MARK)]) {
      if (row.name === "DATABASE_URL" && bad.startsWith("postgres")) continue;
      assert.throws(() => readConfig({ ...database, [row.name]: bad }), (error) => {
        assert.ok(error instanceof ConfigError, `${row.name}=${bad}`);
        assert.equal(error.variable, row.name);
        assert.ok(!error.message.includes(MARK), `${row.name}: ${error.message}`);
        assert.ok(!error.message.includes(btoa(MARK)), `${row.name}: ${error.message}`);
        return true;
      });
    }
  }
  // The same refusal of a variable that is not a secret quotes the value, to help its reader.
  assert.throws(
    () => readConfig({ STOREB_API_URL: MARK }),
    (error) => error instanceof ConfigError && error.message.includes(`"${MARK}"`),
  );
});
