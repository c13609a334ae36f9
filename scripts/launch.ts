/**
 * `deno task start` and `deno task cli`: runs `main.ts` with the permissions its configuration
 * gives (src/process/permissions.ts). A task line in deno.json is fixed text and cannot follow `DATA_DIR`,
 * the files the configuration names or a CLI command's `--*-file` arguments; this script reads the
 * environment, computes the flags and runs `deno run <flags> main.ts <args>`.
 *
 * It needs `--allow-env` (the configuration) and `--allow-run` for the running Deno executable,
 * nothing else. It stays in front of the service: SIGINT, SIGTERM and SIGHUP sent to it reach the
 * service once, and it exits with the service's exit code. Its own end, however it comes (SIGKILL
 * included), ends `serve` as SIGTERM would: the service's standard input is a pipe that only this
 * script holds (src/process/launcher_pipe.ts). The end of the task runner in front of it, however it
 * comes, reaches the service as SIGTERM too.
 * @module
 */
import { serviceEnvironment, servicePermissions } from "../src/process/permissions.ts";
import { LAUNCHER_GREETING } from "../src/process/launcher_pipe.ts";

// Not node:url's fileURLToPath: loading Node's modules would delay every start (src/process/permissions.ts).
const MAIN = decodeURIComponent(new URL("../main.ts", import.meta.url).pathname);
const FORWARDED: Deno.Signal[] = ["SIGINT", "SIGTERM", "SIGHUP"];
/** A signal that comes again within this time is the same one, delivered twice. */
const DUPLICATE_SIGNAL_MS = 500;
/** How often `serve`'s launcher checks that the process that started it is still there. */
const PARENT_CHECK_MS = 500;
/** Signal numbers on Linux and macOS, for the shell's 128 + n exit code of a killed child. */
const SIGNAL_NUMBERS: Partial<Record<Deno.Signal, number>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGKILL: 9,
  SIGTERM: 15,
};

async function launch(args: string[]): Promise<number> {
  let permissions: string[];
  try {
    permissions = servicePermissions(Deno.env.toObject(), args);
  } catch (error) {
    console.error(error instanceof Error ? error.message : String(error));
    return 2;
  }
  // main.ts runs the service for exactly `serve`; anything else is a CLI command.
  const serving = args.length === 1 && args[0] === "serve";
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...permissions, MAIN, ...args],
    env: serviceEnvironment(Deno.env.toObject()),
    // Its own process group: a terminal's Ctrl-C reaches this script, which passes it on once,
    // instead of reaching the service twice (a second signal during the drain ends it at once).
    // The flip side: a signal to this script's group misses the service, hence the pipe below.
    detached: true,
    // CLI commands keep this script's standard input: some read a secret from it (`-`).
    stdin: serving ? "piped" : "inherit",
  }).spawn();
  if (serving) {
    // Never closed: it ends when this process does, which the service takes as SIGTERM.
    const writer = child.stdin.getWriter();
    writer.write(new TextEncoder().encode(LAUNCHER_GREETING)).catch(() => {
      // the service already exited; its status says why
    });
    writer.closed.catch(() => {});
  }
  // Under `deno task` a terminal's Ctrl-C arrives twice: once to this process's group, and once
  // passed on by the task runner. The copies come within milliseconds; a person's second Ctrl-C,
  // which should end the drain at once, comes later.
  const lastForwarded = new Map<Deno.Signal, number>();
  const forward = (signal: Deno.Signal) => {
    const now = performance.now();
    if (now - (lastForwarded.get(signal) ?? -Infinity) < DUPLICATE_SIGNAL_MS) return;
    lastForwarded.set(signal, now);
    try {
      child.kill(signal);
    } catch {
      // already exited
    }
  };
  for (const signal of FORWARDED) Deno.addSignalListener(signal, () => forward(signal));
  if (serving) {
    // The task runner in front of this script can be killed alone (`kill -9` of its pid, a
    // harness's `child.kill("SIGKILL")`), which leaves this script running with a new parent.
    // That is the runner's stop, passed on as the SIGTERM it would have passed on itself; a stop
    // already passed on stays the only one (a second signal would cut the drain short).
    const parent = Deno.ppid;
    const orphaned = setInterval(() => {
      if (Deno.ppid === parent) return;
      clearInterval(orphaned);
      if (lastForwarded.size === 0) forward("SIGTERM");
    }, PARENT_CHECK_MS);
    Deno.unrefTimer(orphaned);
  }
  const status = await child.status;
  if (status.signal === null) return status.code;
  return 128 + (SIGNAL_NUMBERS[status.signal] ?? 0);
}

if (import.meta.main) Deno.exit(await launch(Deno.args));
