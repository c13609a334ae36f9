/**
 * The CLI's command table and its pure helpers, without processes: the table is consistent
 * (names unique, every synopsis names the command's options), the command line is parsed as
 * documented, "did you mean" finds close words, and text output reads as designed.
 */
import assert from "node:assert/strict";
import { COMMAND_GROUPS, COMMANDS } from "../src/cli/mod.ts";
import {
  closest,
  distance,
  parseCommandArgs,
  resolveCommand,
  unknownCommand,
} from "../src/cli/args.ts";
import { type CommandSpec, UsageError } from "../src/cli/command.ts";
import { commandHelp, referenceMarkdown, synopses } from "../src/cli/help.ts";
import { formatError, outputStyles, renderText } from "../src/cli/output.ts";

const command = (name: string): CommandSpec =>
  COMMANDS.find((candidate) => candidate.words.join(" ") === name)!;

Deno.test("cli table: names are unique, every command can run or is served elsewhere", () => {
  const names = COMMANDS.map((spec) => spec.words.join(" "));
  assert.equal(new Set(names).size, names.length, "no command twice");
  for (const spec of COMMANDS) {
    assert.ok(spec.words.length >= 1 && spec.words.length <= 2, `${spec.words}: one or two words`);
    assert.ok(spec.summary.length > 0 && spec.summary.length <= 60, `${spec.words}: summary`);
    assert.ok(spec.description.length > 0, `${spec.words}: description`);
    const name = spec.words.join(" ");
    assert.ok(spec.run || name === "serve" || name === "help", `${name} has a handler`);
    // A group word is never a command of its own: `tenant` must stay free for group help.
    if (spec.words.length === 1) {
      assert.ok(!COMMANDS.some((other) => other.words.length === 2 && other.words[0] === name));
    }
  }
  assert.equal(COMMANDS.length, COMMAND_GROUPS.flatMap((group) => group.commands).length);
});

Deno.test("cli table: each synopsis names exactly the command's options", () => {
  for (const spec of COMMANDS) {
    const text = synopses(spec).join(" ");
    const shown = new Set([...text.matchAll(/--([a-z-]+)/g)].map((match) => match[1]));
    assert.deepEqual(
      [...shown].sort(),
      Object.keys(spec.options ?? {}).sort(),
      `${spec.words.join(" ")}: ${text}`,
    );
    for (const [name, option] of Object.entries(spec.options ?? {})) {
      if (option.choices) {
        assert.equal(option.value, option.choices.join("|"), `--${name} shows its choices`);
      }
      if (option.default !== undefined && option.choices) {
        assert.ok(option.choices.includes(option.default), `--${name}'s default is a choice`);
      }
    }
    const help = commandHelp(spec);
    for (const name of Object.keys(spec.options ?? {})) {
      assert.ok(help.includes(`--${name} `), `${spec.words.join(" ")} --help shows --${name}`);
    }
  }
  const reference = referenceMarkdown(COMMAND_GROUPS);
  for (const spec of COMMANDS) assert.ok(reference.includes(`### ${spec.words.join(" ")}\n`));
});

Deno.test("cli args: words resolve to commands, two words before one", () => {
  const resolved = resolveCommand(["--pretty", "tenant", "show", "ID", "--json"], COMMANDS);
  assert.equal(resolved.command?.words.join(" "), "tenant show");
  assert.deepEqual(resolved.rest, ["ID", "--json"]);
  assert.equal(resolved.flags.pretty, true);
  assert.equal(resolveCommand(["migrate"], COMMANDS).command?.words[0], "migrate");
  for (const argv of [["constructor"], ["toString", "x"], ["__proto__"], ["tenant"], []]) {
    assert.equal(resolveCommand(argv, COMMANDS).command, null, argv.join(" "));
  }
  assert.throws(() => resolveCommand(["--verbose"], COMMANDS), UsageError);
  assert.match(unknownCommand(["tenant"], COMMANDS).message, /tenant needs a command: create/);
});

Deno.test("cli args: options, arguments, required values, choices and defaults", () => {
  const create = command("tenant create");
  const parsed = parseCommandArgs(create, ["--name=Acme Inc", "--callback-url", "https://a.test"]);
  assert.deepEqual(parsed.input.options, { name: "Acme Inc", "callback-url": "https://a.test" });
  assert.deepEqual(parsed.input.positionals, []);

  const usage = (spec: CommandSpec, args: string[]) => {
    try {
      parseCommandArgs(spec, args);
    } catch (error) {
      assert.ok(error instanceof UsageError, String(error));
      return error;
    }
    assert.fail(`${args.join(" ")} must be a usage error`);
  };
  assert.match(usage(create, []).message, /--name is required/);
  assert.match(usage(create, ["--name", "   "]).message, /--name is required/);
  assert.match(usage(create, ["--name", "a", "--name", "b"]).message, /given twice/);
  assert.match(usage(create, ["--name"]).message, /--name needs a value/);
  // A value that looks like an option is taken for a forgotten value, unless written with =.
  assert.match(usage(create, ["--name", "--callback-url", "x"]).message, /needs a value/);
  assert.equal(parseCommandArgs(create, ["--name=-dash"]).input.options.name, "-dash");
  assert.match(usage(create, ["--name", "x", "extra"]).message, /takes no arguments/);
  assert.deepEqual(usage(create, ["--name", "x", "--nmae", "y"]).suggestions, ["--name"]);

  const key = command("key create");
  assert.equal(parseCommandArgs(key, ["tenant_1"]).input.options.env, "live", "default");
  assert.match(usage(key, []).message, /expected exactly one TENANT_ID/);
  assert.match(usage(key, ["t", "--env", "prod"]).message, /--env must be live or test/);
  // After --, everything is an argument.
  assert.deepEqual(parseCommandArgs(key, ["--", "--odd-id"]).input.positionals, ["--odd-id"]);

  // `-` is a value (standard input), not an option.
  const storea = command("storea set-credentials");
  const fromStdin = parseCommandArgs(storea, [
    "t",
    "--bundle-id",
    "b",
    "--key-id",
    "K",
    "--issuer-id",
    "i",
    "--private-key-file",
    "-",
  ]);
  assert.equal(fromStdin.input.options["private-key-file"], "-");

  // --help wins over every other problem on the line.
  assert.equal(parseCommandArgs(create, ["--colour", "--help"]).flags.help, true);
});

Deno.test("cli args: did you mean, by edit distance", () => {
  assert.equal(distance("creat", "create"), 1);
  assert.equal(distance("shwo", "show"), 1, "a transposition counts one");
  assert.equal(distance("Tenant", "tenant"), 0, "case does not count");
  assert.deepEqual(closest("--nmae", ["--name", "--callback-url"]), ["--name"]);
  assert.deepEqual(closest("frobnicate", ["migrate", "version", "serve"]), []);
  assert.deepEqual(unknownCommand(["tenant", "creat"], COMMANDS).suggestions, ["tenant create"]);
  assert.deepEqual(unknownCommand(["keys", "list"], COMMANDS).suggestions, ["key list"]);
  assert.deepEqual(unknownCommand(["migrat"], COMMANDS).suggestions, ["migrate"]);
  assert.deepEqual(unknownCommand(["x"], COMMANDS).suggestions, []);
});

Deno.test("cli output: JSON when piped, text on a terminal or asked for", () => {
  const none = { help: false, pretty: false, json: false };
  assert.deepEqual(outputStyles(none, { stdout: false, stderr: false }), {
    stdout: "json",
    stderr: "json",
  });
  assert.deepEqual(outputStyles(none, { stdout: true, stderr: false }), {
    stdout: "text",
    stderr: "json",
  });
  assert.equal(
    outputStyles({ ...none, pretty: true }, { stdout: false, stderr: false }).stdout,
    "text",
  );
  assert.equal(
    outputStyles({ ...none, json: true }, { stdout: true, stderr: true }).stderr,
    "json",
  );

  const text = renderText({
    id: "tenant_1",
    callbackUrl: null,
    storea: { keyId: "K" },
    keys: [{ id: "key_1", env: "live" }, { id: "key_2", env: "test" }],
    none: [],
    body: "two\nlines",
  });
  assert.equal(
    text,
    [
      "id:          tenant_1",
      "callbackUrl: -",
      "storea:",
      "  keyId: K",
      "keys:",
      "  id     env",
      "  key_1  live",
      "  key_2  test",
      "none:        (none)",
      'body:        "two\\nlines"',
      "",
    ].join("\n"),
  );
  // Too wide for a table: a block per record.
  const wide = renderText({ rows: [{ a: "x".repeat(70), b: "y".repeat(70) }] });
  assert.match(wide, /^rows:\n {2}a: x+\n {2}b: y+\n$/);

  const error = { error: "USAGE", message: "unknown command: x", suggestions: ["y"], help: "h" };
  assert.deepEqual(JSON.parse(formatError(error, "json")), {
    error: "USAGE",
    message: "unknown command: x",
    didYouMean: ["y"],
    help: "h",
  });
  assert.equal(
    formatError(error, "text"),
    'purchase-relay: unknown command: x [USAGE]\nDid you mean "y"?\nRun "h" for help.\n',
  );
});
