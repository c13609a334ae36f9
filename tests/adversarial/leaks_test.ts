/**
 * What the service lets slip to someone who should not see it, tried as they would:
 * - `/ready` (no key needed) when the database fails: the database's own error text names hosts,
 *   users and databases; it must go to the log, not to the prober, and not once per probe;
 * - `STOREA_ROOT_CERTS` replacing the Apple root pin in production, silently, or failing the boot
 *   without naming the variable;
 * - a webhook secret on the CLI's command line, which every user of the machine can read in
 *   `/proc/<pid>/cmdline`.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import postgres from "postgres";
import {
  databaseOf,
  ENGINE,
  freshDatabase,
  type LogLine,
  readProcFile,
  runCli,
  type RunningService,
  startService,
  stopAndDrop,
} from "../helpers/service.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../../simulators/storea_pki.ts";
import { startCallbackReceiver } from "../../simulators/callback_receiver.ts";
import { TcpProxy } from "../../resilience/support.ts";

const ADMIN_URL = Deno.env.get("TEST_DATABASE_URL");

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** GETs /ready until it answers `status`; returns the body as text. */
async function readyUntil(service: RunningService, status: number): Promise<string> {
  const deadline = Date.now() + 20_000;
  while (true) {
    const response = await fetch(`${service.url}/ready`, { signal: AbortSignal.timeout(10_000) });
    const text = await response.text();
    if (response.status === status) return text;
    if (Date.now() > deadline) throw new Error(`/ready never answered ${status}; last: ${text}`);
    await sleep(200);
  }
}

const failuresLogged = (service: RunningService) =>
  service.logs.filter((line) => line.msg === "readiness_db_failed");

/**
 * Probes /ready several times while the database fails and checks what a prober sees: 503, a
 * database check that starts with `fail` and carries none of `secrets`, nor the database's own
 * words, which the log has (once, however many probes came).
 */
async function probeOutage(
  service: RunningService,
  secrets: string[],
  expectInReason: RegExp,
): Promise<LogLine> {
  const before = failuresLogged(service).length;
  const bodies = [await readyUntil(service, 503)];
  for (let i = 0; i < 4; i++) {
    const response = await fetch(`${service.url}/ready`);
    assert.equal(response.status, 503);
    bodies.push(await response.text());
  }
  const logged = await service.waitForLog((line) =>
    line.msg === "readiness_db_failed" && failuresLogged(service).indexOf(line) >= before
  );
  assert.equal(logged.level, "warn");
  assert.match(
    logged.reason,
    expectInReason,
    `the log has the database's own words: ${JSON.stringify(logged)}`,
  );
  for (const text of bodies) {
    const body = JSON.parse(text);
    assert.equal(body.status, "degraded");
    assert.match(body.checks.db, /^fail/);
    for (const secret of [...secrets, logged.reason]) {
      assert.ok(
        !text.includes(secret),
        `/ready told a stranger ${JSON.stringify(secret)}: ${text}`,
      );
    }
  }
  await sleep(300); // lines of the later probes, if any, are written by now
  assert.equal(failuresLogged(service).length - before, 1, "one warning per outage, not per probe");
  return logged;
}

Deno.test({
  name: "/ready fails without naming host, user or database; the log names them, once",
  ignore: ENGINE !== "postgresql",
}, async () => {
  // A role of its own, so that its name is something the database's errors can leak.
  const role = `pr_ready_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
  const admin = postgres(ADMIN_URL!, { max: 1, onnotice: () => {} });
  await admin.unsafe(`CREATE ROLE ${role} LOGIN`);
  const db = await freshDatabase();
  const direct = new URL(db.env.DATABASE_URL);
  const databaseName = direct.pathname.slice(1);
  await admin.unsafe(`ALTER DATABASE ${databaseName} OWNER TO ${role}`);
  const proxy = TcpProxy.start(Number(direct.port || 5432));
  const viaProxy = new URL(direct);
  viaProxy.port = String(proxy.port);
  viaProxy.username = role;
  const service = await startService({
    db,
    env: { DATABASE_URL: viaProxy.toString(), NODE_ENV: "production", LOG_LEVEL: "info" },
  });
  const secrets = [role, databaseName, "127.0.0.1", String(proxy.port), "postgres"];
  try {
    await readyUntil(service, 200);

    // The database host is gone: connections are refused or dropped.
    proxy.down();
    await probeOutage(service, secrets, /\S/);
    proxy.restore();
    await readyUntil(service, 200);
    const recovered = await service.waitForLog((line) => line.msg === "readiness_db_recovered");
    assert.ok(recovered.failedProbes >= 5, `failedProbes ${recovered.failedProbes}`);

    // The database refuses the service's user: its answer names the role.
    await admin.unsafe(`ALTER ROLE ${role} NOLOGIN`);
    await admin`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ${role}`;
    await sleep(1_000); // the pool drops its cut connections; the next check connects anew
    const refused = await probeOutage(service, secrets, new RegExp(role));
    assert.equal(refused.code, "28000", "PostgreSQL's code is logged too");
    await admin.unsafe(`ALTER ROLE ${role} LOGIN`);
    await readyUntil(service, 200);
  } finally {
    await admin.unsafe(`ALTER ROLE ${role} LOGIN`).catch(() => {});
    proxy.restore();
    await stopAndDrop(service);
    proxy.close();
    await admin.unsafe(`DROP ROLE IF EXISTS ${role}`).catch(() => {});
    await admin.end();
  }
});

Deno.test({
  name: "/ready fails without the embedded engine's error text; the log has it, once",
  // The embedded engine runs inside the service: it cannot become unreachable, but it can answer
  // with an error, here because its settings table was renamed through its shared socket.
  ignore: ENGINE !== "embedded",
}, async () => {
  const service = await startService({ env: { NODE_ENV: "production", LOG_LEVEL: "info" } });
  const sql = databaseOf(service);
  try {
    await readyUntil(service, 200);
    await sql`ALTER TABLE settings RENAME TO settings_elsewhere`;
    await probeOutage(service, ["settings", "relation"], /relation "settings" does not exist/);
    await sql`ALTER TABLE settings_elsewhere RENAME TO settings`;
    await readyUntil(service, 200);
    await service.waitForLog((line) => line.msg === "readiness_db_recovered");
  } finally {
    await sql.end();
    await stopAndDrop(service);
  }
});

Deno.test("STOREA_ROOT_CERTS: a warning at a production boot, the variable named when unusable", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-roots-" });
  const db = await freshDatabase();
  try {
    await t.step("production with test roots says so at boot", async () => {
      const rootPath = await writeStoreaRootPem(await createStoreaTestPki(), join(dir, "root.pem"));
      const service = await startService({
        db,
        env: { NODE_ENV: "production", STOREA_ROOT_CERTS: rootPath, LOG_LEVEL: "info" },
      });
      try {
        const warning = service.logs.find((line) => line.msg === "storea_root_certs_replace_pin");
        assert.ok(warning, "a warning before listening");
        assert.equal(warning.level, "warn");
        assert.deepEqual(warning.paths, [rootPath]);
        assert.ok(
          service.logs.indexOf(warning) < service.logs.findIndex((l) => l.msg === "listening"),
        );
      } finally {
        await service.stop();
      }
    });

    await Deno.writeTextFile(join(dir, "garbage.pem"), "not a certificate");
    for (
      const [what, path] of [
        ["a missing file", join(dir, "missing.pem")],
        ["a directory", dir],
        ["a file that is not a certificate", join(dir, "garbage.pem")],
      ]
    ) {
      await t.step(`${what} stops the boot, naming the variable`, async () => {
        const service = await startService({
          db,
          env: { STOREA_ROOT_CERTS: path },
          waitUntilListening: false,
        });
        assert.equal((await service.exited).code, 1);
        const fatal = service.logs.find((line) => line.msg === "startup_failed");
        assert.ok(fatal, "startup_failed");
        assert.equal(fatal.code, "CONFIG_INVALID");
        assert.match(fatal.reason, /^STOREA_ROOT_CERTS: /);
      });
    }
  } finally {
    await db.drop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test("CLI: a webhook secret from a file or standard input, never in the command line", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-cli-secret-" });
  const db = await freshDatabase({ migrated: true });
  const receiver = await startCallbackReceiver();
  const cli = (...args: string[]) => runCli(args, db.env);
  /** Whether the tenant's deliveries are signed with `secret`, asked through `webhook test`. */
  const signsWith = async (tenantId: string, secret: string) => {
    receiver.setSecrets([secret]);
    receiver.deliveries.length = 0;
    const sent = await cli("webhook", "test", tenantId);
    assert.equal(sent.code, 0, sent.stderr);
    const [delivery] = await receiver.waitFor(1);
    return delivery.signatureValid;
  };
  try {
    const fromFile = `whsec_${crypto.randomUUID()}${crypto.randomUUID()}`;
    const secretFile = join(dir, "secret.txt");
    await Deno.writeTextFile(secretFile, `${fromFile}\n`, { mode: 0o600 });
    let tenantId = "";

    await t.step("tenant create --webhook-secret-file PATH", async () => {
      const created = await cli(
        "tenant",
        "create",
        "--name",
        "Secretive",
        "--callback-url",
        receiver.url,
        "--webhook-secret-file",
        secretFile,
      );
      assert.equal(created.code, 0, created.stderr);
      assert.equal(created.json.webhookSecret, fromFile, "the final line break is not kept");
      tenantId = created.json.id;
      assert.equal(await signsWith(tenantId, fromFile), true);
    });

    await t.step("tenant set-callback --webhook-secret-file - reads standard input", async () => {
      const piped = `whsec_${crypto.randomUUID()}${crypto.randomUUID()}`;
      const result = await runCli(
        ["tenant", "set-callback", tenantId, "--url", receiver.url, "--webhook-secret-file", "-"],
        db.env,
        {
          stdin: `${piped}\n`,
          whileRunning: async (pid) => {
            // What another user of the machine sees of the running command, once it runs.
            let cmdline = "";
            for (let i = 0; i < 100 && !cmdline.includes("main.ts"); i++) {
              await sleep(50);
              cmdline = await readProcFile(pid, "cmdline");
            }
            assert.ok(cmdline.includes("--webhook-secret-file"), cmdline);
            assert.ok(!cmdline.includes(piped));
          },
        },
      );
      assert.equal(result.code, 0, result.stderr);
      assert.equal(result.json.webhookSecret, piped);
      assert.equal(await signsWith(tenantId, piped), true);
      assert.equal(await signsWith(tenantId, fromFile), false, "the old secret is replaced");
    });

    await t.step("--webhook-secret still works; both at once is a usage error", async () => {
      const inline = `whsec_${crypto.randomUUID()}${crypto.randomUUID()}`;
      const set = await cli(
        "tenant",
        "set-callback",
        tenantId,
        "--url",
        receiver.url,
        "--webhook-secret",
        inline,
      );
      assert.equal(set.code, 0, set.stderr);
      assert.equal(await signsWith(tenantId, inline), true);
      const both = await cli(
        "tenant",
        "set-callback",
        tenantId,
        "--url",
        receiver.url,
        "--webhook-secret",
        inline,
        "--webhook-secret-file",
        secretFile,
      );
      assert.equal(both.code, 2);
      assert.equal(both.json.error, "USAGE");
    });

    await t.step("a short secret from a file is refused, a missing file named", async () => {
      const short = join(dir, "short.txt");
      await Deno.writeTextFile(short, "whsec_short\n");
      const weak = await cli(
        "tenant",
        "create",
        "--name",
        "Weak",
        "--callback-url",
        receiver.url,
        "--webhook-secret-file",
        short,
      );
      assert.equal(weak.code, 1);
      assert.equal(weak.json.error, "WEAK_WEBHOOK_SECRET");
      const missing = await cli(
        "tenant",
        "set-callback",
        tenantId,
        "--url",
        receiver.url,
        "--webhook-secret-file",
        join(dir, "nowhere.txt"),
      );
      assert.equal(missing.code, 1);
      assert.equal(missing.json.error, "FILE_UNREADABLE");
    });
  } finally {
    await receiver.close();
    await db.drop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
