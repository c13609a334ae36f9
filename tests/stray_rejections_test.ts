/**
 * The one stray rejection the service survives (src/process/stray_rejections.ts), checked in a process of
 * its own: Deno ends a process on an unhandled rejection, which is what the guard must prevent for
 * that rejection and only for it. Then in a real service process, so that `serve` is seen to
 * install the guard: there the rejection is provoked by tests/helpers/stray_rejection_preload.ts.
 */
import assert from "node:assert/strict";
import { startService, stopAndDrop } from "./helpers/service.ts";

const MODULE = new URL("../src/process/stray_rejections.ts", import.meta.url).href;
const LOG = new URL("../src/observability/log.ts", import.meta.url).href;

/** Runs a process that installs the guard, then leaves `rejection` unhandled. */
async function leaveUnhandled(rejection: string) {
  const script = `
    import { dropStrayWriteAfterEnd } from "${MODULE}";
    import { Logger } from "${LOG}";
    using _guard = dropStrayWriteAfterEnd(new Logger());
    ${rejection};
    await new Promise((resolve) => setTimeout(resolve, 100));
    console.log("still running");
  `;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--quiet", script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    code: output.code,
    stdout: new TextDecoder().decode(output.stdout),
    stderr: new TextDecoder().decode(output.stderr),
  };
}

Deno.test("stray rejections: a write on a database socket the peer closed is logged, not fatal", async () => {
  const run = await leaveUnhandled(`Promise.reject(Object.assign(
    new Error("This socket has been ended by the other party"), { code: "EPIPE" }))`);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /"level":"warn","msg":"database_socket_closed_mid_write"/);
  assert.match(run.stdout, /still running/);
});

Deno.test("stray rejections: any other unhandled rejection still ends the process", async () => {
  for (
    const rejection of [
      `Promise.reject(new Error("This socket has been ended by the other party"))`,
      `Promise.reject(Object.assign(new Error("something else"), { code: "EPIPE" }))`,
      `Promise.reject("not an error")`,
    ]
  ) {
    const run = await leaveUnhandled(rejection);
    assert.notEqual(run.code, 0, rejection);
    assert.doesNotMatch(run.stdout, /still running/, rejection);
  }
});

const PRELOAD = new URL("./helpers/stray_rejection_preload.ts", import.meta.url).pathname;

Deno.test("stray rejections: serve installs the guard in the service process", async () => {
  // The preload makes node:net's write-after-end rejection on SIGUSR2, another one on SIGUSR1.
  const service = await startService({
    permissions: (flags) => [...flags, "--preload", PRELOAD],
  });
  try {
    const health = async () => {
      const response = await fetch(`${service.url}/health`);
      await response.body?.cancel();
      return response.status;
    };
    assert.equal(await health(), 200);
    Deno.kill(service.pid, "SIGUSR2");
    const warning = await service.waitForLog(
      (line) => line.msg === "database_socket_closed_mid_write",
      10_000,
    );
    assert.equal(warning.level, "warn");
    assert.equal(warning.reason, "This socket has been ended by the other party");
    // Still serving, and only that rejection was dropped: it was made once, it is logged once.
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(await health(), 200);
    const warnings = service.logs.filter((line) => line.msg === "database_socket_closed_mid_write");
    assert.equal(warnings.length, 1);
    // Any other unhandled rejection still ends the process, as Deno's default does.
    Deno.kill(service.pid, "SIGUSR1");
    const { code } = await service.exited;
    assert.notEqual(code, 0);
  } finally {
    await stopAndDrop(service);
  }
});
