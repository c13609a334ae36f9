/**
 * Reading the command line: which command the words name, its options and arguments checked
 * against its row of the command table, and "did you mean" for what matches nothing.
 * @module
 */
import { type CommandInput, commandName, type CommandSpec, UsageError } from "./command.ts";

/** Options every command takes, besides its own. */
export interface GlobalFlags {
  /** `--help` or `-h`: print the command's help instead of running it. */
  help: boolean;
  /** `--pretty`: readable output, also when piped. */
  pretty: boolean;
  /** `--json`: JSON output, also on a terminal. */
  json: boolean;
}

/** The flags every command takes, as usage and help show them. */
export const GLOBAL_FLAGS: readonly { flag: string; summary: string }[] = [
  { flag: "-h, --help", summary: "show the help of a command instead of running it" },
  { flag: "--pretty", summary: "readable output and errors, also when piped" },
  { flag: "--json", summary: "JSON output and errors, also on a terminal" },
];

/** A command line resolved to a command, or to none. */
export interface Resolved {
  /** The command the leading words name; null when they name none. */
  command: CommandSpec | null;
  /** The leading words given (up to two), for messages. */
  words: string[];
  /** What follows the command's words. */
  rest: string[];
  /** Flags given before the command's words. */
  flags: GlobalFlags;
  /** `--version` before any command. */
  version: boolean;
}

/**
 * Finds the command `argv` names: its leading words (after any global flags) matched against
 * the table, two words before one.
 */
export function resolveCommand(argv: string[], commands: readonly CommandSpec[]): Resolved {
  const flags: GlobalFlags = { help: false, pretty: false, json: false };
  let version = false;
  let start = 0;
  for (; start < argv.length && argv[start].startsWith("-"); start++) {
    const arg = argv[start];
    if (arg === "--help" || arg === "-h") flags.help = true;
    else if (arg === "--pretty") flags.pretty = true;
    else if (arg === "--json") flags.json = true;
    else if (arg === "--version") version = true;
    else {
      throw new UsageError(`unknown option ${arg}`, {
        suggestions: closest(arg, ["--help", "--pretty", "--json", "--version"]),
      });
    }
  }
  const words = argv.slice(start, start + 2).filter((word) => !word.startsWith("-"));
  for (const count of [2, 1]) {
    if (words.length < count) continue;
    const name = words.slice(0, count).join(" ");
    const command = commands.find((candidate) => commandName(candidate) === name);
    if (command) return { command, words, rest: argv.slice(start + count), flags, version };
  }
  // No command to parse the rest: still honour the output flags for the error to come.
  const rest = argv.slice(start + words.length);
  flags.pretty ||= rest.includes("--pretty");
  flags.json ||= rest.includes("--json");
  return { command: null, words, rest, flags, version };
}

/** The usage error for words that name no command, with the closest commands. */
export function unknownCommand(words: string[], commands: readonly CommandSpec[]): UsageError {
  const group = commands.filter((command) => command.words.length > 1)
    .filter((command) => command.words[0] === words[0]);
  if (group.length > 0 && words.length === 1) {
    return new UsageError(
      `${words[0]} needs a command: ${group.map((command) => command.words[1]).join(", ")}`,
    );
  }
  const typed = words.join(" ");
  const names = commands.map(commandName);
  // Compare with as many words as each command has: `tenant creat x` is close to `tenant create`.
  const suggestions = closestBy(names, (name) => {
    const count = name.split(" ").length;
    return distance(words.slice(0, count).join(" "), name);
  }, typed.length);
  const known = group.length > 0 && suggestions.length === 0
    ? `; the ${words[0]} commands are ${alternatives(group.map((command) => command.words[1]))}`
    : "";
  return new UsageError(`unknown command: ${typed}${known}`, { suggestions });
}

/**
 * Parses what follows a command's words against its row: options it declares (each at most
 * once), the flags every command takes, and the count of its positional arguments. `--` ends
 * the options. Then required options and choices are checked, and defaults applied.
 */
export function parseCommandArgs(
  command: CommandSpec,
  args: string[],
): { input: CommandInput; flags: GlobalFlags } {
  const declared = command.options ?? {};
  const flags: GlobalFlags = { help: false, pretty: false, json: false };
  const options: Record<string, string | undefined> = {};
  const positionals: string[] = [];
  const problems: UsageError[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") {
      positionals.push(...args.slice(i + 1));
      break;
    }
    if (arg === "--help" || arg === "-h") flags.help = true;
    else if (arg === "--pretty") flags.pretty = true;
    else if (arg === "--json") flags.json = true;
    else if (arg.startsWith("-") && arg !== "-") {
      const match = /^--([^=]+)(?:=([\s\S]*))?$/.exec(arg);
      const name = match?.[1] ?? arg;
      if (!match || !Object.hasOwn(declared, name)) {
        problems.push(
          new UsageError(`unknown option ${arg.split("=")[0]} for ${commandName(command)}`, {
            command,
            suggestions: closest(
              arg.split("=")[0],
              [...Object.keys(declared).map((key) => `--${key}`), "--help", "--pretty", "--json"],
            ),
          }),
        );
        continue;
      }
      let value = match[2];
      if (declared[name].flag) {
        if (value !== undefined) {
          problems.push(new UsageError(`--${name} takes no value`, { command }));
          continue;
        }
        value = "true";
      } else if (value === undefined) {
        const next = args[i + 1];
        // A value that looks like an option is most likely a forgotten value.
        if (next === undefined || (next.startsWith("-") && next !== "-")) {
          problems.push(
            new UsageError(
              `--${name} needs a value (${
                declared[name].value
              }); write --${name}=VALUE for a value that starts with -`,
              { command },
            ),
          );
          continue;
        }
        value = next;
        i++;
      }
      if (Object.hasOwn(options, name)) {
        problems.push(new UsageError(`--${name} is given twice`, { command }));
      }
      options[name] = value;
    } else {
      positionals.push(arg);
    }
  }
  // Help is the way out of a wrong command line: it wins over the problems found.
  if (flags.help) return { input: { positionals, options }, flags };
  if (problems.length > 0) throw problems[0];
  checkPositionals(command, positionals);
  for (const [name, spec] of Object.entries(declared)) {
    const value = options[name];
    if (spec.required && (value === undefined || value.trim() === "")) {
      throw new UsageError(`--${name} is required`, { command });
    }
    if (value !== undefined && spec.choices && !spec.choices.includes(value)) {
      throw new UsageError(`--${name} must be ${alternatives(spec.choices)}`, {
        command,
        suggestions: closest(value, spec.choices),
      });
    }
    if (value === undefined && spec.default !== undefined) options[name] = spec.default;
  }
  return { input: { positionals, options }, flags };
}

function checkPositionals(command: CommandSpec, positionals: string[]): void {
  const names = command.args ?? [];
  const needed = names.filter((name) => !name.startsWith("["));
  if (positionals.length >= needed.length && positionals.length <= names.length) return;
  const name = commandName(command);
  if (names.length === 0) {
    throw new UsageError(`${name} takes no arguments, got ${positionals.join(" ")}`, { command });
  }
  if (needed.length === 1 && names.length === 1) {
    throw new UsageError(`expected exactly one ${needed[0]}`, { command });
  }
  throw new UsageError(`${name} takes ${names.join(" ")}, got ${positionals.length}`, { command });
}

/** `a`, `a or b`, `a, b or c`. */
export function alternatives(values: readonly string[]): string {
  if (values.length <= 1) return values.join("");
  return `${values.slice(0, -1).join(", ")} or ${values.at(-1)}`;
}

/** The candidates close to `typed` (case-insensitive edit distance), closest first. */
export function closest(typed: string, candidates: readonly string[]): string[] {
  return closestBy(candidates, (candidate) => distance(typed, candidate), typed.length);
}

function closestBy(
  candidates: readonly string[],
  distanceOf: (candidate: string) => number,
  typedLength: number,
): string[] {
  // One typo in a short word, two in a longer one, three in a long one.
  const limit = typedLength <= 4 ? 1 : typedLength <= 8 ? 2 : 3;
  const scored = candidates.map((candidate) => ({ candidate, d: distanceOf(candidate) }))
    .filter(({ d }) => d <= limit);
  if (scored.length === 0) return [];
  const best = Math.min(...scored.map(({ d }) => d));
  return scored.filter(({ d }) => d === best).map(({ candidate }) => candidate);
}

/**
 * The edit distance between `a` and `b`, case-insensitive: insertions, deletions, substitutions
 * and transpositions of neighbours each count one (optimal string alignment).
 */
export function distance(a: string, b: string): number {
  const s = a.toLowerCase();
  const t = b.toLowerCase();
  const rows: number[][] = Array.from({ length: s.length + 1 }, (_, i) => [i]);
  for (let j = 1; j <= t.length; j++) rows[0][j] = j;
  for (let i = 1; i <= s.length; i++) {
    for (let j = 1; j <= t.length; j++) {
      const cost = s[i - 1] === t[j - 1] ? 0 : 1;
      rows[i][j] = Math.min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && s[i - 1] === t[j - 2] && s[i - 2] === t[j - 1]) {
        rows[i][j] = Math.min(rows[i][j], rows[i - 2][j - 2] + 1);
      }
    }
  }
  return rows[s.length][t.length];
}
