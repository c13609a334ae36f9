/**
 * scripts/launch.ts, behind `deno task start` and `deno task cli`, run as an operator runs it: the
 * service it starts does not outlive it, however it dies, and CLI commands still read its
 * standard input.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { freshDatabase, runCli, TEST_ENCRYPTION_KEY } from "./helpers/service.ts";
import { freePort } from "./helpers/local_servers.ts";
import { serviceEnvironment, servicePermissions } from "../src/process/permissions.ts";
import { LAUNCHER_GREETING, launcherGone } from "../src/process/launcher_pipe.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const MAIN = join(ROOT, "main.ts");

/** The environment a shell would pass on: the tools' variables, no configuration. */
function shellEnv(): Record<string, string> {
  const env: Record<string, string> = { NO_COLOR: "1" };
  for (const name of ["PATH", "HOME", "DENO_DIR", "DENO_TLS_CA_STORE"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** `deno task -q <args>` in the checkout, with `env` on top of a shell's. */
function denoTask(args: string[], env: Record<string, string>, options: Deno.CommandOptions = {}) {
  return new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", ...args],
    cwd: ROOT,
    env: { ...shellEnv(), ...env },
    clearEnv: true,
    ...options,
  });
}

/** The output of `command`, as text. */
async function output(command: string, args: string[]): Promise<string> {
  const { stdout } = await new Deno.Command(command, { args, stderr: "null" }).output();
  return new TextDecoder().decode(stdout);
}

/** The processes whose parent is `pid`. */
async function childrenOf(pid: number): Promise<number[]> {
  return (await output("ps", ["-o", "pid=", "--ppid", String(pid)]))
    .split("\n").filter((line) => line.trim() !== "").map(Number);
}

/** Whether `pid` still runs (a zombie waiting for its new parent to reap it does not). */
async function running(pid: number): Promise<boolean> {
  const state = (await output("ps", ["-o", "stat=", "-p", String(pid)])).trim();
  return state !== "" && !state.startsWith("Z");
}

/** Waits up to `timeoutMs` for every process of `pids` to end; the ones still running. */
async function stillRunning(pids: number[], timeoutMs: number): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const left = [];
    for (const pid of pids) if (await running(pid)) left.push(pid);
    if (left.length === 0 || Date.now() > deadline) return left;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** The `main.ts serve` process under the task's launcher. */
async function serviceUnder(taskPid: number): Promise<number> {
  for (const launcher of await childrenOf(taskPid)) {
    for (const child of await childrenOf(launcher)) {
      const args = await output("ps", ["-o", "args=", "-p", String(child)]);
      if (args.includes(`${MAIN} serve`)) return child;
    }
  }
  throw new Error(`no main.ts serve process under ${taskPid}`);
}

/** Polls `url` until it answers 200. */
async function waitFor200(url: string, timeoutMs: number, exited: Promise<unknown>) {
  let gone = false;
  exited.then(() => gone = true);
  const deadline = Date.now() + timeoutMs;
  while (!gone && Date.now() < deadline) {
    try {
      const response = await fetch(url);
      await response.body?.cancel();
      if (response.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${url} did not answer 200 (${gone ? "the task exited" : "timed out"})`);
}

/** A running `deno task start` whose output is collected. */
function startTask(env: Record<string, string>, options: { ownGroup: boolean }) {
  const child = denoTask(["start"], env, {
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    detached: options.ownGroup,
  }).spawn();
  let stdout = "";
  let stderr = "";
  // The service holds these pipes as long as it runs, after the task and the launcher are gone.
  const drained = Promise.all([
    (async () => {
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) stdout += chunk;
    })(),
    (async () => {
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) stderr += chunk;
    })(),
  ]);
  return {
    child,
    drained,
    // Whole lines only: the last one may still be on its way.
    lines: () =>
      stdout.split("\n").slice(0, -1).filter((line) => line.startsWith("{")).map((line) =>
        JSON.parse(line)
      ),
    output: () => `${stdout}\n${stderr}`.slice(-4000),
  };
}

Deno.test("launcher: a SIGKILL of deno task start's group ends the service; a new one starts", async () => {
  const db = await freshDatabase();
  const port = freePort();
  const env = {
    ...db.env,
    NODE_ENV: "test",
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    HOST: "127.0.0.1",
    PORT: String(port),
  };
  const url = `http://127.0.0.1:${port}`;
  let servicePid: number | undefined;
  // Its own process group, as a supervisor or a terminal's job runs it.
  const first = startTask(env, { ownGroup: true });
  try {
    await waitFor200(`${url}/ready`, 60_000, first.child.status);
    servicePid = await serviceUnder(first.child.pid);

    // The supervisor's stop timeout, a test harness, kill -9: the task and its launcher vanish.
    Deno.kill(-first.child.pid, "SIGKILL");
    assert.equal((await first.child.status).signal, "SIGKILL");
    assert.deepEqual(
      await stillRunning([servicePid], 10_000),
      [],
      `the service still runs 10 s on\n${first.output()}`,
    );
    await first.drained;
    // It drained as on SIGTERM, and said why.
    const shutdowns = first.lines().filter((line) => line.msg === "shutdown");
    assert.deepEqual(shutdowns.map(({ signal, cause }) => ({ signal, cause })), [
      { signal: "SIGTERM", cause: "launcher_exited" },
    ]);
    await assert.rejects(fetch(`${url}/health`), "the port is free");

    // The next start gets the port and DATA_DIR.
    const second = startTask(env, { ownGroup: false });
    try {
      await waitFor200(`${url}/ready`, 60_000, second.child.status);
    } finally {
      second.child.kill("SIGTERM");
      const status = await second.child.status;
      await second.drained;
      assert.equal(status.code, 0, second.output());
    }
  } finally {
    try {
      Deno.kill(-first.child.pid, "SIGKILL");
    } catch {
      // gone
    }
    await first.child.status;
    if (servicePid !== undefined && await running(servicePid)) Deno.kill(servicePid, "SIGKILL");
    await first.drained;
    await db.drop();
  }
});

Deno.test("launcher: a SIGKILL of the task runner alone ends the launcher and the service", async () => {
  const db = await freshDatabase();
  const port = freePort();
  const env = {
    ...db.env,
    NODE_ENV: "test",
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    HOST: "127.0.0.1",
    PORT: String(port),
  };
  const task = startTask(env, { ownGroup: false });
  const left: number[] = [];
  try {
    await waitFor200(`http://127.0.0.1:${port}/ready`, 60_000, task.child.status);
    const [launcher] = await childrenOf(task.child.pid);
    left.push(launcher, await serviceUnder(task.child.pid));

    // A harness that stops its child with SIGKILL: only the runner's own pid gets it.
    task.child.kill("SIGKILL");
    await task.child.status;
    assert.deepEqual(await stillRunning(left, 10_000), [], `10 s on\n${task.output()}`);
    await task.drained;
    const shutdowns = task.lines().filter((line) => line.msg === "shutdown");
    assert.deepEqual(shutdowns.map(({ signal }) => signal), ["SIGTERM"]);
  } finally {
    for (const pid of left) if (await running(pid)) Deno.kill(pid, "SIGKILL");
    try {
      task.child.kill("SIGKILL");
    } catch {
      // gone
    }
    await task.child.status;
    await task.drained;
    await db.drop();
  }
});

Deno.test("launcher: a SIGKILL of the task runner during the drain does not cut it short", async () => {
  const db = await freshDatabase();
  const port = freePort();
  const env = {
    ...db.env,
    NODE_ENV: "test",
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    HOST: "127.0.0.1",
    PORT: String(port),
  };
  const url = `http://127.0.0.1:${port}`;
  const task = startTask(env, { ownGroup: false });
  const left: number[] = [];
  try {
    await waitFor200(`${url}/ready`, 60_000, task.child.status);
    left.push(...await childrenOf(task.child.pid), await serviceUnder(task.child.pid));
    const tenant = await runCli(["tenant", "create", "--name", "Drain"], env);
    const key = await runCli(["key", "create", tenant.json.id, "--env", "test"], env);
    assert.equal(key.code, 0, key.stderr);
    // A body that arrives slowly keeps a request in flight through the drain.
    let push!: (chunk: Uint8Array) => void;
    let end!: () => void;
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        // The request may be gone, cut by the defect under test: its response says so.
        push = (chunk) => {
          try {
            controller.enqueue(chunk);
          } catch { /* cut */ }
        };
        end = () => {
          try {
            controller.close();
          } catch { /* cut */ }
        };
      },
    });
    const pending = fetch(`${url}/v1/storea/verify`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.json.key}`, "content-type": "application/json" },
      body,
    });
    pending.catch(() => {}); // awaited below, once the drain is under way
    push(new TextEncoder().encode('{"transactionId":'));
    await new Promise((resolve) => setTimeout(resolve, 300));

    // A supervisor's stop: SIGTERM, then SIGKILL when the drain outlasts its patience.
    task.child.kill("SIGTERM");
    while (!task.lines().some((line) => line.msg === "shutdown")) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    // Later than the launcher's window for a signal delivered twice.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    task.child.kill("SIGKILL");
    await task.child.status;
    // Past the launcher's check of its parent.
    await new Promise((resolve) => setTimeout(resolve, 1500));
    push(new TextEncoder().encode('"1"}'));
    end();
    const response = await pending.catch((error) => {
      throw new assert.AssertionError({ message: `the request in flight was cut: ${error}` });
    });
    assert.equal(response.status, 400, await response.text());
    await task.drained;
    assert.equal(task.lines().filter((line) => line.msg === "shutdown").length, 1);
    assert.deepEqual(await stillRunning(left, 10_000), [], task.output());
  } finally {
    for (const pid of left) if (await running(pid)) Deno.kill(pid, "SIGKILL");
    try {
      task.child.kill("SIGKILL");
    } catch {
      // gone
    }
    await task.child.status;
    await task.drained;
    await db.drop();
  }
});

Deno.test("launcher: deno task cli gives a command its standard input (a secret from -)", async () => {
  const db = await freshDatabase({ migrated: true });
  try {
    const secret = "a-webhook-secret-read-from-standard-input";
    const child = denoTask(
      [
        "cli",
        "tenant",
        "create",
        "--name",
        "Piped",
        "--callback-url",
        "http://127.0.0.1:9/hook",
        "--webhook-secret-file",
        "-",
      ],
      { ...db.env, NODE_ENV: "test", ENCRYPTION_KEY: TEST_ENCRYPTION_KEY },
      { stdin: "piped", stdout: "piped", stderr: "piped", detached: true },
    ).spawn();
    // A command left waiting for the end of its input would wait for ever.
    const timer = setTimeout(() => Deno.kill(-child.pid, "SIGKILL"), 30_000);
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(`${secret}\n`));
    await writer.close();
    const { code, stdout, stderr } = await child.output().finally(() => clearTimeout(timer));
    const text = new TextDecoder().decode(stdout);
    assert.equal(code, 0, new TextDecoder().decode(stderr));
    assert.equal(JSON.parse(text).webhookSecret, secret);
  } finally {
    await db.drop();
  }
});

/** Standard input that yields `chunks`, then its end (or nothing more, with `end: false`). */
function scriptedInput(chunks: string[], options: { terminal?: boolean; end?: boolean } = {}) {
  const pending = chunks.map((chunk) => new TextEncoder().encode(chunk));
  let consumed = 0;
  return {
    get consumed() {
      return consumed;
    },
    isTerminal: () => options.terminal ?? false,
    read(buffer: Uint8Array): Promise<number | null> {
      const next = pending[0];
      if (next === undefined) {
        return options.end === false ? new Promise(() => {}) : Promise.resolve(null);
      }
      const n = Math.min(buffer.length, next.length);
      buffer.set(next.subarray(0, n));
      if (n === next.length) pending.shift();
      else pending[0] = next.subarray(n);
      consumed += n;
      return Promise.resolve(n);
    },
  };
}

/** Whether `promise` settles within a few turns of the event loop. */
async function settles(promise: Promise<unknown>): Promise<boolean> {
  const late = Symbol("late");
  const timer = new Promise((resolve) => setTimeout(() => resolve(late), 50));
  return await Promise.race([promise.then(() => true), timer]) !== late;
}

Deno.test("launcher pipe: the end after the greeting is the launcher's; nothing else is", async () => {
  const [head, tail] = [LAUNCHER_GREETING.slice(0, 5), LAUNCHER_GREETING.slice(5)];
  assert.ok(await settles(launcherGone(scriptedInput([LAUNCHER_GREETING]))), "greeting, end");
  assert.ok(await settles(launcherGone(scriptedInput([head, tail]))), "greeting in two reads");
  assert.ok(!await settles(launcherGone(scriptedInput([LAUNCHER_GREETING], { end: false }))));
  // /dev/null, a closed pipe, a file, someone else's pipe, a terminal: not a launcher.
  assert.ok(!await settles(launcherGone(scriptedInput([]))), "an end without a greeting");
  assert.ok(!await settles(launcherGone(scriptedInput([head]))), "part of it, then the end");
  assert.ok(!await settles(launcherGone(scriptedInput([LAUNCHER_GREETING], { terminal: true }))));
  const other = scriptedInput(["x".repeat(LAUNCHER_GREETING.length), LAUNCHER_GREETING]);
  assert.ok(!await settles(launcherGone(other)), "other bytes first");
  assert.equal(other.consumed, LAUNCHER_GREETING.length, "it reads no further than a greeting");
});

Deno.test("launcher pipe: a service started directly outlives the end of its standard input", async () => {
  const db = await freshDatabase();
  const env = {
    ...shellEnv(),
    ...db.env,
    NODE_ENV: "test",
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    HOST: "127.0.0.1",
    PORT: String(freePort()),
  };
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...servicePermissions(env), MAIN, "serve"],
    env: { ...env, ...serviceEnvironment(env) },
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const stdout = new Response(child.stdout).text();
  try {
    const url = `http://127.0.0.1:${env.PORT}`;
    await waitFor200(`${url}/ready`, 60_000, child.status);
    // Whatever a supervisor's pipe carries, then its end: not the launcher's greeting.
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode("hello\n"));
    await writer.close();
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const ready = await fetch(`${url}/ready`);
    await ready.body?.cancel();
    assert.equal(ready.status, 200, "still serving");
    child.kill("SIGTERM");
    assert.equal((await child.status).code, 0);
    const shutdowns = (await stdout).split("\n").filter((line) => line.includes('"shutdown"'));
    assert.equal(shutdowns.length, 1);
    assert.equal(JSON.parse(shutdowns[0]).signal, "SIGTERM");
    assert.equal(JSON.parse(shutdowns[0]).cause, undefined);
  } finally {
    try {
      child.kill("SIGKILL");
    } catch {
      // exited
    }
    await child.status;
    await stdout;
    await db.drop();
  }
});
