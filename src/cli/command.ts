/**
 * What an admin command is: a row of the command table (src/cli/mod.ts), the input its handler
 * gets, what it may use, and the two errors a handler throws.
 * @module
 */
import type { Config } from "../config.ts";
import type { Logger } from "../observability/log.ts";
import type { Database } from "../db/connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";
import { RelayError } from "../errors.ts";

/**
 * One option of a command. Every option takes a value (`--name NAME` or `--name=NAME`), except a
 * flag, which takes none.
 */
export interface OptionSpec {
  /** The value's placeholder in usage, e.g. `NAME`; empty for a flag. */
  value: string;
  /** Takes no value: given, the handler gets `"true"`; absent, undefined. */
  flag?: boolean;
  /** What it means, one line. */
  summary: string;
  /** Missing or blank: a usage error before the handler runs. */
  required?: boolean;
  /** The only values accepted; anything else is a usage error before the handler runs. */
  choices?: readonly string[];
  /** The value the handler gets when the option is not given. */
  default?: string;
}

/** One admin command: its row in the command table. */
export interface CommandSpec {
  /** The words that name it, e.g. `["tenant", "create"]`. */
  words: readonly string[];
  /** One line for the command list. */
  summary: string;
  /** Positional arguments in order, e.g. `["TENANT_ID"]`; `"[ID]"` is optional. */
  args?: readonly string[];
  /** Its options, in the order usage shows them. */
  options?: Readonly<Record<string, OptionSpec>>;
  /** Synopses after the words, when the one made from `args` and `options` says too little. */
  usage?: readonly string[];
  /** What it does and prints: a paragraph for `--help` and the reference. */
  description: string;
  /**
   * Runs it and returns what it prints. Absent for `serve` (main.ts runs the service) and `help`
   * (the dispatcher prints it).
   */
  run?: Handler;
}

/** Commands shown together in the help and the reference. */
export interface CommandGroup {
  title: string;
  commands: readonly CommandSpec[];
}

/** A command's arguments after parsing: counts, required options and choices are checked. */
export interface CommandInput {
  positionals: string[];
  /** Option values by name (without `--`); defaults applied, absent ones undefined. */
  options: Record<string, string | undefined>;
}

/** What a command prints on success: one JSON object. */
export type CommandOutput = Record<string, unknown>;

/** Runs a command. */
export type Handler = (input: CommandInput, context: CliContext) => Promise<CommandOutput>;

/** An opened database, checked against this build's migrations, with the secret box. */
export interface OpenDatabase {
  db: Database;
  box: SecretBox;
  /** The migrations this opening applied (only `migrate` applies any). */
  applied: string[];
}

/** Options of {@linkcode CliContext.open}. */
export interface OpenOptions {
  /** Apply pending migrations (`migrate` only); otherwise a schema mismatch is refused. */
  migrate?: boolean;
}

/** What a command may use: configuration, logs and the database, each made when first used. */
export interface CliContext {
  /** The configuration, read from the environment when first used. */
  readonly config: Config;
  readonly log: Logger;
  /** Opens the database (once per command). */
  open(options?: OpenOptions): Promise<OpenDatabase>;
}

/** A command that failed; `code` is printed as `error`. Exit 1. */
export class CommandError extends RelayError {
  /** More fields for the error output. */
  readonly details?: Record<string, unknown>;
  constructor(code: string, message: string, details?: Record<string, unknown>) {
    super(code, message);
    this.details = details;
  }
}

/** Bad usage: unknown command or option, missing or malformed arguments. Exit 2. */
export class UsageError extends RelayError {
  /** The command it is about, when known: its help is the way out. */
  readonly command?: CommandSpec;
  /** Close matches of what was mistyped (`did you mean`). */
  readonly suggestions: string[];
  constructor(message: string, options: { command?: CommandSpec; suggestions?: string[] } = {}) {
    super("USAGE", message);
    this.command = options.command;
    this.suggestions = options.suggestions ?? [];
  }
}

/** The name of a command: its words joined, e.g. `tenant create`. */
export function commandName(command: CommandSpec): string {
  return command.words.join(" ");
}
