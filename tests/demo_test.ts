/**
 * `deno task demo` end to end, run exactly as a user runs it (the task line of deno.json with its
 * permissions): it must pass every step, print what it promises and leave nothing behind.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const EVENT_ID = "evt_[0-9A-HJKMNP-TV-Z]{26}";

Deno.test("deno task demo: both verifies valid, both notifications relayed, signed", async () => {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", "demo"],
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    // Well above the demo's own bounds; SIGTERM on expiry lets it clean up.
    signal: AbortSignal.timeout(180_000),
  }).output();
  const stdout = new TextDecoder().decode(output.stdout);
  const stderr = new TextDecoder().decode(output.stderr);
  const both = `${stdout}\n--- stderr ---\n${stderr}`;
  assert.equal(output.code, 0, both);

  // Each step is numbered, and shows the command a user would run before the result.
  for (let step = 1; step <= 12; step++) assert.match(stdout, new RegExp(`^Step ${step}/12 `, "m"));
  assert.match(
    stdout,
    /^ {2}\$ deno task cli tenant create --name 'Demo tenant' --callback-url http:\/\/127\.0\.0\.1:\d+\/hooks$/m,
  );
  assert.match(stdout, /^ {2}\$ deno task cli key create tenant_\w+ --env test --name demo$/m);
  assert.match(stdout, /^ {2}\$ deno task cli storea set-credentials tenant_\w+ \\$/m);
  assert.match(stdout, /^ {2}\$ deno task cli storeb set-credentials tenant_\w+ \\$/m);
  assert.match(stdout, /^ {2}\$ curl -s http:\/\/127\.0\.0\.1:\d+\/v1\/storea\/verify \\$/m);
  assert.match(stdout, /^ {2}\$ curl -s http:\/\/127\.0\.0\.1:\d+\/v1\/storeb\/verify \\$/m);
  assert.match(stdout, /^ {6}-H "Authorization: Bearer service_test_[\w-]{43}" \\$/m);

  // The summary: both verifies valid.
  assert.match(stdout, /^ {2}✓ store A verify: valid \(transaction \d+\)$/m);
  assert.match(stdout, /^ {2}✓ store B verify: valid \(subscription \w+\)$/m);

  // Both notifications accepted, each as a new event.
  const accepted = (store: string) => {
    const match = new RegExp(`^  ✓ store ${store} notification accepted \\((${EVENT_ID})\\)$`, "m")
      .exec(stdout);
    assert.ok(match, `store ${store} notification not accepted\n${both}`);
    return match[1];
  };
  const storeaEvent = accepted("A");
  const storebEvent = accepted("B");
  assert.notEqual(storeaEvent, storebEvent);

  // Two signed deliveries, one per event, each with a valid signature.
  const deliveries = [
    ...stdout.matchAll(
      new RegExp(
        `^  ✓ delivery (subscription\\.renewed) (${EVENT_ID}) from (store[ab]): signature valid$`,
        "gm",
      ),
    ),
  ].map((match) => `${match[3]} ${match[2]}`);
  // Each line appears twice: once in step 11 and once in the summary.
  assert.deepEqual(
    [...new Set(deliveries)].sort(),
    [`storea ${storeaEvent}`, `storeb ${storebEvent}`],
    both,
  );
  assert.equal(deliveries.length, 4, both);
  assert.doesNotMatch(stdout, /INVALID/);

  // Everything it started is gone, the temporary directory included.
  assert.match(
    stdout,
    /Cleaned up: service stopped, simulators closed, temporary directory removed\./,
  );
  assert.match(stdout, /Demo finished: every step passed in [\d.]+ s\./);
  const dir = /Temporary directory: (\S+)/.exec(stdout)?.[1];
  assert.ok(dir, both);
  await assert.rejects(Deno.stat(dir), Deno.errors.NotFound);
});
