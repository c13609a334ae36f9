/**
 * The link between `serve` and scripts/launch.ts, which runs it in a process group of its own
 * (`deno task start`): the launcher gives the service a pipe as standard input that only the
 * launcher holds, and writes {@linkcode LAUNCHER_GREETING} on it. When the launcher dies, however
 * it died (SIGKILL included), the pipe ends, and the service drains as on SIGTERM instead of
 * holding the port and `DATA_DIR` with nobody in front of it (docs/deploy.md, "Shutdown").
 *
 * A service started any other way (systemd, a container, a test) reads no greeting and is not
 * affected: its standard input is a terminal, `/dev/null`, a file, or someone else's pipe.
 * Nothing here reads the environment or needs a permission.
 * @module
 */

/** What the launcher writes first on the service's standard input, and nothing after it. */
export const LAUNCHER_GREETING = "purchase-relay launcher\n";

/** The standard input the link reads: `Deno.stdin`, or a stand-in. */
export interface LinkInput {
  isTerminal(): boolean;
  read(buffer: Uint8Array): Promise<number | null>;
}

/**
 * Resolves once the launcher is gone: standard input began with the launcher's greeting, then
 * ended (or failed). Never resolves when standard input did not begin with the greeting; it then
 * reads nothing more.
 */
export async function launcherGone(input: LinkInput = Deno.stdin): Promise<void> {
  const never = new Promise<void>(() => {});
  // Reading a terminal from a background process group would stop the process (SIGTTIN).
  if (input.isTerminal()) return never;
  const greeting = new TextEncoder().encode(LAUNCHER_GREETING);
  const buffer = new Uint8Array(greeting.length);
  let filled = 0;
  try {
    while (filled < greeting.length) {
      // Never past the greeting's length: what follows is not ours when it is not the launcher.
      const read = await input.read(buffer.subarray(filled));
      if (read === null) return never;
      for (let i = filled; i < filled + read; i++) {
        if (buffer[i] !== greeting[i]) return never;
      }
      filled += read;
    }
  } catch {
    return never;
  }
  try {
    // The launcher writes nothing more: the next read returns at its end.
    while (await input.read(buffer) !== null) {
      // ignored
    }
  } catch {
    // The pipe broke: the launcher cannot be heard any more, as when it ended.
  }
}
