/**
 * The admin CLI for people, run as real processes: help on stdout with exit 0, `--version`, "did
 * you mean" for mistyped commands and options, no server started without a command, readable
 * output on a terminal or with `--pretty`, and piped output that stays one JSON object.
 */
import assert from "node:assert/strict";
import {
  type CliResult,
  freshDatabase,
  runCli,
  TEST_ENCRYPTION_KEY,
  type TestDatabase,
} from "./helpers/service.ts";
import { BUILD_VERSION } from "../src/version.ts";
import { COMMANDS } from "../src/cli/mod.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** Runs the CLI, killing it if it runs longer than a command should (a server would). */
function cli(args: string[], env: Record<string, string>): Promise<CliResult> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return runCli(args, env, {
    whileRunning: (pid) => {
      timer = setTimeout(() => {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }, 30_000);
      return Promise.resolve();
    },
  }).finally(() => clearTimeout(timer));
}

/** Help: exit 0, the text on stdout, nothing on stderr. */
function helpText(result: CliResult, what: string): string {
  assert.equal(result.code, 0, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  assert.equal(result.stderr, "", `${what}: nothing on stderr`);
  assert.ok(!result.stdout.trimStart().startsWith("{"), `${what}: help is text, not JSON`);
  return result.stdout;
}

/** A usage error: exit 2, nothing on stdout, one JSON object on stderr. */
function usageError(result: CliResult, what: string): Json {
  assert.equal(result.code, 2, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  assert.equal(result.stdout, "", `${what}: nothing on stdout`);
  const lines = result.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 1, `${what}: one line on stderr: ${result.stderr}`);
  const body = JSON.parse(lines[0]);
  assert.equal(body.error, "USAGE", what);
  assert.equal(typeof body.message, "string", what);
  return body;
}

async function withDatabase(fn: (db: TestDatabase) => Promise<void>): Promise<void> {
  const db = await freshDatabase({ migrated: true });
  try {
    await fn(db);
  } finally {
    await db.drop();
  }
}

Deno.test("cli usage: no command prints the help, exit 0, and starts no server", async () => {
  const scratch = await Deno.makeTempDir({ prefix: "pr-cli-bare-" });
  try {
    const bare = helpText(await cli([], { DATA_DIR: scratch }), "no command");
    assert.match(bare, /^Usage: purchase-relay <command>/m);
    for (const command of COMMANDS) {
      assert.ok(bare.includes(`  ${command.words.join(" ")} `), `help lists ${command.words}`);
    }
    assert.ok(!bare.includes("listening"), "no service log line");
    // A server would have opened the embedded engine in DATA_DIR (or written its key there).
    assert.deepEqual([...Deno.readDirSync(scratch)], [], "DATA_DIR untouched: nothing opened");
    for (const flag of ["help", "--help", "-h"]) {
      assert.equal(helpText(await cli([flag], { DATA_DIR: scratch }), flag), bare, flag);
    }
    // Help needs no valid configuration: it is how one finds out what to configure.
    assert.equal(
      helpText(await cli(["--help"], { DATA_DIR: scratch, PORT: "http" }), "bad config"),
      bare,
    );
  } finally {
    await Deno.remove(scratch, { recursive: true }).catch(() => {});
  }
});

Deno.test("cli usage: help of one command or group, by help or --help", async () => {
  const env = { DATA_DIR: "/nonexistent/never-opened" };
  const perCommand = helpText(await cli(["tenant", "create", "--help"], env), "--help");
  assert.match(perCommand, /^Usage: purchase-relay tenant create --name NAME/m);
  assert.match(perCommand, /--callback-url URL/);
  assert.match(perCommand, /--webhook-secret-file PATH\|-/);
  assert.equal(helpText(await cli(["help", "tenant", "create"], env), "help"), perCommand);
  assert.equal(helpText(await cli(["tenant", "create", "-h"], env), "-h"), perCommand);
  // --help wins over what else is wrong on the line: it is the way out.
  assert.equal(
    helpText(await cli(["tenant", "create", "--colour", "red", "--help"], env), "with junk"),
    perCommand,
  );
  const group = helpText(await cli(["help", "tenant"], env), "help tenant");
  assert.match(group, /tenant set-callback/);
  assert.ok(!group.includes("key create"), "only the group's commands");
  assert.equal(helpText(await cli(["tenant", "--help"], env), "tenant --help"), group);

  const retry = helpText(await cli(["deliveries", "retry", "--help"], env), "retry --help");
  assert.match(retry, /deliveries retry ID\|EVENT_ID/);
  assert.match(retry, /--tenant ID --status/);

  const wrong = usageError(await cli(["help", "tenant", "creat"], env), "help of a typo");
  assert.deepEqual(wrong.didYouMean, ["tenant create"]);
});

Deno.test("cli usage: --version prints the version, JSON when piped, text with --pretty", async () => {
  const env = { DATA_DIR: "/nonexistent/never-opened" };
  const json = await cli(["--version"], env);
  assert.equal(json.code, 0, json.stderr);
  assert.equal(json.stdout, `${JSON.stringify({ version: BUILD_VERSION })}\n`);
  const stamped = await cli(["--version"], { ...env, SERVICE_VERSION: "v9.8.7" });
  assert.equal(stamped.stdout, '{"version":"v9.8.7"}\n');
  const pretty = await cli(["--pretty", "--version"], env);
  assert.equal(pretty.code, 0, pretty.stderr);
  assert.equal(pretty.stdout, `version: ${BUILD_VERSION}\n`);
});

Deno.test("cli usage: a mistyped command or option is exit 2 with did-you-mean", async () => {
  const env = { DATA_DIR: "/nonexistent/never-opened" };
  const typo = usageError(await cli(["tenant", "creat", "--name", "x"], env), "tenant creat");
  assert.deepEqual(typo.didYouMean, ["tenant create"]);
  assert.equal(typo.help, "purchase-relay help");
  assert.deepEqual(
    usageError(await cli(["tennant", "list"], env), "tennant").didYouMean,
    ["tenant list"],
  );
  assert.deepEqual(
    usageError(await cli(["deliveries", "shwo", "x"], env), "shwo").didYouMean,
    ["deliveries show"],
  );
  const nothingClose = usageError(await cli(["frobnicate"], env), "frobnicate");
  assert.equal(nothingClose.didYouMean, undefined, "no suggestion when nothing is close");

  const option = usageError(await cli(["tenant", "create", "--nmae", "x"], env), "--nmae");
  assert.deepEqual(option.didYouMean, ["--name"]);
  assert.equal(option.help, "purchase-relay tenant create --help");
  assert.match(option.message, /unknown option --nmae/);
  const inline = usageError(
    await cli(["tenant", "create", "--name", "x", "--callback-ulr=https://a.example"], env),
    "--callback-ulr=",
  );
  assert.deepEqual(inline.didYouMean, ["--callback-url"]);
  const choice = usageError(await cli(["key", "create", "t", "--env", "tset"], env), "--env tset");
  assert.deepEqual(choice.didYouMean, ["test"]);
  assert.match(choice.message, /--env must be live or test/);

  // Readable on request: text on stderr, the suggestion and the way to the help, no JSON.
  const text = await cli(["tenant", "creat", "--pretty"], env);
  assert.equal(text.code, 2);
  assert.equal(text.stdout, "");
  assert.match(text.stderr, /^purchase-relay: unknown command: tenant creat \[USAGE\]$/m);
  assert.match(text.stderr, /^Did you mean "tenant create"\?$/m);
  assert.match(text.stderr, /^Run "purchase-relay help" for help\.$/m);
  assert.ok(!text.stderr.includes("{"), "no JSON with --pretty");
});

Deno.test("cli usage: --pretty prints text; piped output stays one JSON object", async () => {
  await withDatabase(async (db) => {
    const piped = await cli(["tenant", "create", "--name", "Acme"], db.env);
    assert.equal(piped.code, 0, piped.stderr);
    assert.equal(piped.stdout.split("\n").length, 2, "one line and its line break");
    const tenant = JSON.parse(piped.stdout);
    assert.equal(tenant.name, "Acme");

    const pretty = await cli(["tenant", "show", tenant.id, "--pretty"], db.env);
    assert.equal(pretty.code, 0, pretty.stderr);
    assert.match(pretty.stdout, new RegExp(`^id: +${tenant.id}$`, "m"));
    assert.match(pretty.stdout, /^name: +Acme$/m);
    assert.match(pretty.stdout, /^callbackUrl: +-$/m, "null is shown as -");
    assert.throws(() => JSON.parse(pretty.stdout), "text, not JSON");

    const list = await cli(["--pretty", "tenant", "list"], db.env);
    assert.equal(list.code, 0, list.stderr);
    assert.match(list.stdout, /^tenants:$/m);
    assert.ok(list.stdout.includes(tenant.id));

    const missing = await cli(
      ["tenant", "show", "tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV", "--pretty"],
      db.env,
    );
    assert.equal(missing.code, 1);
    assert.equal(missing.stdout, "");
    assert.match(
      missing.stderr,
      /^purchase-relay: no tenant tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV \[TENANT_NOT_FOUND\]$/m,
    );

    usageError(await cli(["tenant", "list", "--pretty", "--json"], db.env), "both");
    const json = await cli(["tenant", "list", "--json"], db.env);
    assert.deepEqual(JSON.parse(json.stdout).tenants.map((t: Json) => t.id), [tenant.id]);
  });
});

const script = (() => {
  try {
    return new Deno.Command("script", { args: ["--version"], stdout: "null", stderr: "null" })
      .outputSync().success;
  } catch {
    return false;
  }
})();

Deno.test({
  name: "cli usage: on a terminal, text by default and JSON with --json",
  ignore: !script,
  async fn() {
    await withDatabase(async (db) => {
      ok(await cli(["tenant", "create", "--name", "Terminal"], db.env));
      // util-linux `script` gives the command a pseudo-terminal for stdout and stderr.
      const onTerminal = async (...args: string[]) => {
        const line = ["deno", "run", "-A", new URL("../main.ts", import.meta.url).pathname, ...args]
          .map((word) => `'${word}'`).join(" ");
        const output = await new Deno.Command("script", {
          args: ["-qec", line, "/dev/null"],
          env: { ...db.env, NO_COLOR: "1", NODE_ENV: "test", ENCRYPTION_KEY: TEST_ENCRYPTION_KEY },
          stdin: "null",
          stdout: "piped",
          stderr: "piped",
        }).output();
        return { code: output.code, text: new TextDecoder().decode(output.stdout) };
      };
      const text = await onTerminal("tenant", "list");
      assert.equal(text.code, 0, text.text);
      assert.match(text.text, /^tenants:\r?$/m);
      assert.match(text.text, /name: +Terminal/);
      const json = await onTerminal("tenant", "list", "--json");
      assert.equal(JSON.parse(json.text).tenants[0].name, "Terminal");
      const error = await onTerminal("tenant", "creat");
      assert.equal(error.code, 2);
      assert.match(error.text, /Did you mean "tenant create"\?/);
    });
  },
});

function ok(result: CliResult): Json {
  assert.equal(result.code, 0, result.stderr);
  return result.json;
}
