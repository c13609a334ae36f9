/**
 * `encryption rotate-key`: seals every stored secret again with `ENCRYPTION_KEY`, opening those
 * sealed with `ENCRYPTION_KEY_PREVIOUS` (docs/maintenance.md, "Rotating `ENCRYPTION_KEY`"). The
 * keys come from the environment, as the replicas' do: never from the command line.
 * @module
 */
import { type CliContext, CommandError, type CommandInput, type CommandOutput } from "./command.ts";
import { resealSecrets, UnreadableSecretsError } from "../db/key_rotation.ts";

/** `encryption rotate-key` */
export async function rotateKey(
  _input: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db, box } = await context.open();
  try {
    return { ...await resealSecrets(db.sql, box) };
  } catch (error) {
    if (error instanceof UnreadableSecretsError) {
      throw new CommandError(error.code, error.message, { unreadable: error.unreadable });
    }
    throw error;
  }
}
