/**
 * Help text and the CLI reference, both made from the command table (src/cli/mod.ts): `help`,
 * `--help` and `COMMAND --help` on a terminal, and the "Commands" part of docs/operations.md
 * (written by `deno task docs:cli`, checked by tests/docs_test.ts).
 * @module
 */
import { GLOBAL_FLAGS } from "./args.ts";
import { type CommandGroup, commandName, type CommandSpec, type OptionSpec } from "./command.ts";

const PROGRAM = "purchase-relay";
const WIDTH = 80;

/** The command's synopses after the program name, e.g. `tenant show ID`. */
export function synopses(command: CommandSpec): string[] {
  const name = commandName(command);
  if (command.usage) return command.usage.map((form) => `${name} ${form}`.trimEnd());
  const parts = [name, ...(command.args ?? [])];
  for (const [option, spec] of Object.entries(command.options ?? {})) {
    const text = optionText(option, spec);
    parts.push(spec.required ? text : `[${text}]`);
  }
  return [parts.join(" ")];
}

/** The help of one command. */
export function commandHelp(command: CommandSpec): string {
  const summary = command.summary[0].toUpperCase() + command.summary.slice(1);
  const lines = [`${summary}.`, ""];
  lines.push(
    ...synopses(command).map((synopsis, i) =>
      `${i === 0 ? "Usage:" : "   or:"} ${PROGRAM} ${synopsis}`
    ),
  );
  lines.push("", ...wrap(command.description, WIDTH, ""));
  const rows = Object.entries(command.options ?? {}).map(([option, spec]) => ({
    flag: optionText(option, spec),
    summary: optionSummary(spec.summary, spec.required, spec.default),
  }));
  if (rows.length > 0) lines.push("", "Options:", ...columns(rows));
  lines.push("", "Options of every command:", ...columns(GLOBAL_FLAGS));
  return `${lines.join("\n")}\n`;
}

/** The help of the commands that start with `word`, e.g. every `tenant` command. */
export function groupHelp(word: string, commands: readonly CommandSpec[]): string {
  const members = commands.filter((command) => command.words[0] === word);
  const lines = [`Usage: ${PROGRAM} ${word} <command> [options]`, "", "Commands:"];
  lines.push(...columns(members.map((command) => ({
    flag: commandName(command),
    summary: command.summary,
  }))));
  lines.push("", `Run "${PROGRAM} ${word} <command> --help" for its options.`);
  return `${lines.join("\n")}\n`;
}

/** The help of the whole CLI: every command by group, and how output works. */
export function overviewHelp(groups: readonly CommandGroup[], version: string): string {
  const lines = [
    `Purchase Relay ${version}: verifies store purchases and relays store notifications.`,
    "",
    `Usage: ${PROGRAM} <command> [options]`,
  ];
  const rows = groups.flatMap((group) =>
    group.commands.map((command) => ({ flag: commandName(command), summary: command.summary }))
  );
  const width = Math.max(...rows.map((row) => row.flag.length));
  for (const group of groups) {
    lines.push("", `${group.title}:`);
    lines.push(...columns(
      group.commands.map((command) => ({ flag: commandName(command), summary: command.summary })),
      width,
    ));
  }
  lines.push(
    "",
    "Options:",
    ...columns([
      ...GLOBAL_FLAGS,
      { flag: "--version", summary: "print the version (the version command)" },
    ]),
  );
  lines.push(
    "",
    ...wrap(
      "A command prints one JSON object on stdout when piped, and readable text on a terminal. " +
        `Run "${PROGRAM} help COMMAND" or "${PROGRAM} COMMAND --help" for a command's options. ` +
        'Reference: docs/cli_reference.md, "Admin CLI".',
      WIDTH,
      "",
    ),
  );
  return `${lines.join("\n")}\n`;
}

/** The reference of every command, in Markdown, for docs/cli_reference.md. */
export function referenceMarkdown(groups: readonly CommandGroup[]): string {
  const parts: string[] = [];
  // Commands only as headings: the groups' titles would take anchors other sections own.
  for (const group of groups) {
    for (const command of group.commands) {
      parts.push(`### ${commandName(command)}`);
      parts.push(
        ["```sh", ...synopses(command).map((synopsis) => `${PROGRAM} ${synopsis}`), "```"].join(
          "\n",
        ),
      );
      parts.push(command.description);
      const options = Object.entries(command.options ?? {}).map(([option, spec]) =>
        `- \`${optionText(option, spec)}\`: ${
          optionSummary(spec.summary, spec.required, spec.default)
        }.`
      );
      if (options.length > 0) parts.push(options.join("\n"));
    }
  }
  return `${parts.join("\n\n")}\n`;
}

/** `--name VALUE`, or `--name` for a flag. */
function optionText(option: string, spec: OptionSpec): string {
  return spec.flag ? `--${option}` : `--${option} ${spec.value}`;
}

function optionSummary(summary: string, required?: boolean, fallback?: string): string {
  if (required) return `${summary} (required)`;
  if (fallback !== undefined) return `${summary} (default ${fallback})`;
  return summary;
}

/** Two columns: flags, then their summaries wrapped beside them. */
function columns(rows: readonly { flag: string; summary: string }[], width?: number): string[] {
  const flagWidth = width ?? Math.max(...rows.map((row) => row.flag.length));
  const lines: string[] = [];
  for (const row of rows) {
    const indent = " ".repeat(2 + flagWidth + 2);
    const wrapped = wrap(row.summary, WIDTH, indent);
    const first = wrapped[0].slice(indent.length);
    if (row.flag.length > flagWidth) {
      lines.push(`  ${row.flag}`, ...wrapped);
    } else {
      lines.push(`  ${row.flag.padEnd(flagWidth)}  ${first}`, ...wrapped.slice(1));
    }
  }
  return lines;
}

/** `text` in lines of at most `width` characters (longer words stand alone), each indented. */
function wrap(text: string, width: number, indent: string): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line !== "" && indent.length + line.length + 1 + word.length > width) {
      lines.push(indent + line);
      line = word;
    } else {
      line = line === "" ? word : `${line} ${word}`;
    }
  }
  lines.push(indent + line);
  return lines;
}
