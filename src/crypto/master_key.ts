/**
 * The master encryption key: `ENCRYPTION_KEY` when set; outside production, otherwise, a key
 * generated once into `DATA_DIR/encryption.key` (mode 0600) with a warning (docs/security.md,
 * "Generating a key").
 */
import { join } from "node:path";
import { type Config, ConfigError, decodeMasterKey } from "../config.ts";
import type { Logger } from "../observability/log.ts";

const KEY_FILE = "encryption.key";

/** Returns the master key, generating the development key when needed. */
export async function loadMasterKey(config: Config, log: Logger): Promise<Uint8Array> {
  if (config.encryptionKey !== null) return config.encryptionKey;
  if (config.env === "production") {
    throw new ConfigError("ENCRYPTION_KEY", "is required when NODE_ENV is production");
  }
  const path = join(config.dataDir, KEY_FILE);
  try {
    return decodeMasterKey((await Deno.readTextFile(path)).trim());
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) {
      throw new ConfigError("ENCRYPTION_KEY", `the generated key file ${path} is unreadable`);
    }
  }
  await Deno.mkdir(config.dataDir, { recursive: true, mode: 0o700 });
  const key = crypto.getRandomValues(new Uint8Array(32));
  try {
    // createNew: two processes starting at once must not both write a key.
    await Deno.writeTextFile(path, btoa(String.fromCharCode(...key)) + "\n", {
      createNew: true,
      mode: 0o600,
    });
    log.warn("encryption_key_generated", {
      path,
      hint: "set ENCRYPTION_KEY in production; this key was generated for development",
    });
    return key;
  } catch (error) {
    if (error instanceof Deno.errors.AlreadyExists) {
      return decodeMasterKey((await Deno.readTextFile(path)).trim());
    }
    throw error;
  }
}
