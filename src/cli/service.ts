/**
 * The commands about the program itself: `version` (no database) and `migrate`, the one command
 * besides `serve` that changes the schema.
 * @module
 */
import type { CliContext, CommandInput, CommandOutput } from "./command.ts";

/** `version` */
export function showVersion(_input: CommandInput, context: CliContext): Promise<CommandOutput> {
  return Promise.resolve({ version: context.config.version });
}

/** `migrate`: applies the pending migrations; prints those it applied. */
export async function migrateDatabase(
  _input: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db, applied } = await context.open({ migrate: true });
  return { applied, engine: db.engine };
}
