/**
 * What the helpers that start their own servers (a PostgreSQL cluster, PgBouncer) share: free
 * ports, commands run as the `postgres` user when the tests run as root (initdb, PostgreSQL and
 * PgBouncer all refuse root), and directories that user may write.
 */
import net from "node:net";

let root: Promise<boolean> | undefined;

/** Whether this process runs as root. */
export function runningAsRoot(): Promise<boolean> {
  root ??= (async () => (await output("id", ["-u"])).trim() === "0")();
  return root;
}

/** Runs `command` and returns its stdout; throws with its stderr when it fails. */
export async function output(command: string, args: string[]): Promise<string> {
  const result = await new Deno.Command(command, { args, stdout: "piped", stderr: "piped" })
    .output();
  const decoder = new TextDecoder();
  if (result.code !== 0) {
    throw new Error(`${command} ${args.join(" ")}: ${decoder.decode(result.stderr).trim()}`);
  }
  return decoder.decode(result.stdout);
}

/** `command` as the `postgres` user when running as root, else as this user. */
export async function asServerUser(command: string, args: string[]): Promise<[string, string[]]> {
  return await runningAsRoot()
    ? ["runuser", ["-u", "postgres", "--", command, ...args]]
    : [command, args];
}

/** A fresh temporary directory that the server user owns (mode 0700). */
export async function serverDirectory(prefix: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix });
  if (await runningAsRoot()) await output("chown", ["-R", "postgres:", dir]);
  return dir;
}

/** Gives the server user the files written into `dir` since {@linkcode serverDirectory}. */
export async function handOver(dir: string): Promise<void> {
  if (await runningAsRoot()) await output("chown", ["-R", "postgres:", dir]);
}

/** A loopback TCP port that was free a moment ago. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** Waits until something accepts TCP connections on `port`, or throws after `timeoutMs`. */
export async function waitForPort(port: number, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1");
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`${what} did not listen on ${port}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The path of `name` on PATH or in the usual system directories, or `null`. */
export async function findExecutable(
  name: string,
  extraDirs: string[] = [],
): Promise<string | null> {
  const dirs = [...(Deno.env.get("PATH") ?? "").split(":"), "/usr/sbin", "/sbin", ...extraDirs];
  for (const dir of dirs.filter((d) => d !== "")) {
    try {
      const info = await Deno.stat(`${dir}/${name}`);
      if (info.isFile) return `${dir}/${name}`;
    } catch {
      // not there
    }
  }
  return null;
}
