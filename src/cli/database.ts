/**
 * Opening the database for a command. Only `serve` (at boot) and `migrate` change the schema: a
 * CLI of another build must not migrate under running replicas, against the "migrate once, then
 * roll" upgrade (docs/maintenance.md, "Upgrades and migrations"). Every other command refuses a
 * database whose migrations differ from this build's.
 * @module
 */
import type { Config } from "../config.ts";
import type { Logger } from "../observability/log.ts";
import { connectDatabase } from "../db/connect.ts";
import { compareSchema, migrate, type SchemaState } from "../db/migrate.ts";
import { SecretBox } from "../crypto/secrets.ts";
import { loadMasterKey } from "../crypto/master_key.ts";
import { canaryOpens, ensureEncryptionCanary, readEncryptionCanary } from "../db/settings.ts";
import { CommandError, type OpenDatabase, type OpenOptions } from "./command.ts";

/**
 * Opens the database for a command: migrated (`migrate`) or checked against this build's
 * migrations (every other command), with the encryption canary in place and opened by our key.
 */
export async function openForCli(
  config: Config,
  log: Logger,
  options: OpenOptions = {},
): Promise<OpenDatabase> {
  const box = new SecretBox(await loadMasterKey(config, log), config.encryptionKeyPrevious);
  const db = await connectDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: 2,
    timeoutMs: config.databaseConnectTimeoutMs,
    shareEmbedded: false,
    // Commands never LISTEN, so they leave DATABASE_LISTEN_URL alone.
    pooler: config.databasePooler,
    caFile: config.databaseCaFile,
  });
  try {
    let applied: string[] = [];
    if (options.migrate) {
      applied = await migrate(db.sql);
    } else {
      const state = await compareSchema(db.sql);
      if (state.missing.length > 0 || state.unknown.length > 0) throw schemaMismatch(state);
    }
    await ensureEncryptionCanary(db.sql, box);
    // A wrong key would seal secrets that the service can never open: refuse before any write.
    const canary = await readEncryptionCanary(db.sql);
    if (canary === null || !await canaryOpens(box, canary)) {
      throw new CommandError(
        "ENCRYPTION_KEY_MISMATCH",
        box.previous === null
          ? "ENCRYPTION_KEY is not the key this database was set up with; nothing was changed " +
            "(while rotating it, set ENCRYPTION_KEY_PREVIOUS to the key being replaced)"
          : "neither ENCRYPTION_KEY nor ENCRYPTION_KEY_PREVIOUS is the key this database was " +
            "set up with; nothing was changed",
      );
    }
    return { db, box, applied };
  } catch (error) {
    await db.close().catch(() => {});
    throw error;
  }
}

/** The refusal of a database this build's migrations do not match, saying what to run. */
function schemaMismatch(state: SchemaState): CommandError {
  const details = { missing: state.missing, unknown: state.unknown };
  if (state.empty) {
    return new CommandError(
      "SCHEMA_MISMATCH",
      "the database has no schema yet: run `purchase-relay migrate` (or start the service) first",
      details,
    );
  }
  const problems: string[] = [];
  if (state.unknown.length > 0) {
    problems.push(
      `it has migrations this build does not know (${state.unknown.join(", ")}): ` +
        "it was migrated by a newer version; use that version's CLI",
    );
  }
  if (state.missing.length > 0) {
    problems.push(
      `it lacks this build's migrations ${state.missing.join(", ")}: ` +
        "run `purchase-relay migrate` with this version first, once, as an upgrade does",
    );
  }
  return new CommandError(
    "SCHEMA_MISMATCH",
    `the database schema does not match this version; ${problems.join("; ")}`,
    details,
  );
}
