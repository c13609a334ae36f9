/**
 * TLS to PostgreSQL with certificate verification (docs/postgresql.md, "TLS to PostgreSQL"): a
 * real service process and the real CLI against a TLS-only cluster the test starts itself, with a
 * CA made at test time; and a clear, fast `startup_failed` that never prints the password when
 * the certificate does not match (another CA, another host name).
 *
 * The cluster needs PostgreSQL's server programs, so these run with `TEST_DATABASE_URL` set (the
 * PostgreSQL run) and are skipped on the embedded engine, which has no network server to secure.
 */
import assert from "node:assert/strict";
import { ConfigError } from "../src/config.ts";
import { postgresTls, remoteHostWithoutTls } from "../src/db/postgres_tls.ts";
import { ENGINE, runCli, type RunningService, startService } from "./helpers/service.ts";
import { startTlsCluster, type TlsCluster } from "./helpers/postgres_tls.ts";

const onPostgres = { ignore: ENGINE !== "postgresql" };
if (ENGINE !== "postgresql") {
  console.log(
    "postgres_tls_test: the TLS cluster tests run on PostgreSQL only (TEST_DATABASE_URL)",
  );
}

/** Starts a service that must fail its boot, and returns its `startup_failed` line. */
async function failedBoot(env: Record<string, string>, dataDir: string) {
  const service: RunningService = await startService({
    db: { env: { ...env, DATA_DIR: dataDir }, dataDir, drop: async () => {} },
    waitUntilListening: false,
  });
  try {
    // A certificate that cannot match must not be retried for DATABASE_CONNECT_TIMEOUT (2 min
    // here): the default 30 s wait for this line would run out first.
    const fatal = await service.waitForLog((line) => line.level === "fatal");
    assert.equal((await service.exited).code, 1);
    return { fatal, stdout: service.rawStdout() };
  } finally {
    await service.stop("SIGKILL");
  }
}

Deno.test({
  name: "PostgreSQL over TLS with sslmode=verify-full and DATABASE_CA_FILE",
  ...onPostgres,
}, async (t) => {
  const cluster: TlsCluster = await startTlsCluster();
  const scratch = await Deno.makeTempDir({ prefix: "pr-tls-" });
  try {
    await t.step("the service boots, and every connection it holds is encrypted", async () => {
      const db = await cluster.freshDatabase((name) => ({
        DATABASE_URL: cluster.url(name, "localhost", "?sslmode=verify-full"),
        DATABASE_CA_FILE: cluster.caFile,
      }));
      const service = await startService({ db });
      try {
        const ready = await fetch(`${service.url}/ready`);
        assert.equal(ready.status, 200, await ready.text());
        const created = await service.cli("tenant", "create", "--name", "TLS tenant");
        assert.equal(created.code, 0, created.stderr);
        const admin = cluster.admin();
        try {
          const rows = await admin`
            SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
            WHERE a.application_name = 'purchase-relay'`;
          assert.ok(rows.length > 0, "the service holds connections");
          assert.ok(rows.every((row) => row.ssl === true), "every connection uses TLS");
        } finally {
          await admin.end();
        }
        assert.ok(!service.rawStdout().includes(cluster.password));
      } finally {
        await service.stop();
        await db.drop();
      }
    });

    const dataDir = scratch;
    const base = { DATABASE_CONNECT_TIMEOUT: "2m" };
    await t.step("a certificate of another CA stops the boot at once, naming the CA", async () => {
      const env = {
        ...base,
        DATABASE_URL: cluster.url("postgres", "localhost", "?sslmode=verify-full"),
        DATABASE_CA_FILE: cluster.otherCaFile,
      };
      const { fatal, stdout } = await failedBoot(env, dataDir);
      assert.equal(fatal.msg, "startup_failed");
      assert.equal(fatal.code, "DATABASE_CERT_MISMATCH");
      assert.match(fatal.reason, /certificate of PostgreSQL at localhost:\d+ \(DATABASE_URL/);
      assert.match(fatal.reason, /did not match: it is not signed by a CA of DATABASE_CA_FILE/);
      assert.ok(fatal.reason.includes(cluster.otherCaFile));
      assert.ok(!stdout.includes(cluster.password), "the password is never printed");

      // The CLI says the same on stderr.
      const cli = await runCli(["tenant", "list"], { ...env, DATA_DIR: dataDir });
      assert.equal(cli.code, 1);
      assert.equal(cli.json.error, "DATABASE_CERT_MISMATCH", cli.stderr);
      assert.ok(!(cli.stdout + cli.stderr).includes(cluster.password));
    });

    await t.step("a host name the certificate does not carry stops the boot at once", async () => {
      // The certificate names localhost only; 127.0.0.1 reaches the same server.
      const { fatal, stdout } = await failedBoot({
        ...base,
        DATABASE_URL: cluster.url("postgres", "127.0.0.1", "?sslmode=verify-full"),
        DATABASE_CA_FILE: cluster.caFile,
      }, dataDir);
      assert.equal(fatal.code, "DATABASE_CERT_MISMATCH");
      assert.match(
        fatal.reason,
        /did not match: it does not name 127\.0\.0\.1, the host of DATABASE_URL/,
      );
      assert.ok(!stdout.includes(cluster.password), "the password is never printed");
    });

    await t.step("without DATABASE_CA_FILE the runtime's CAs do not know the test CA", async () => {
      const { fatal } = await failedBoot({
        ...base,
        DATABASE_URL: cluster.url("postgres", "localhost", "?sslmode=verify-full"),
      }, dataDir);
      assert.equal(fatal.code, "DATABASE_CERT_MISMATCH");
      assert.match(fatal.reason, /not signed by a CA the runtime trusts \(set DATABASE_CA_FILE/);
    });

    await t.step("a plain connection is refused by the TLS-only server", async () => {
      const { fatal, stdout } = await failedBoot({
        DATABASE_CONNECT_TIMEOUT: "1s",
        DATABASE_URL: cluster.url("postgres", "localhost", ""),
      }, dataDir);
      assert.equal(fatal.code, "DATABASE_UNAVAILABLE");
      assert.match(fatal.reason, /no pg_hba\.conf entry .* no encryption/);
      assert.ok(!stdout.includes(cluster.password), "the password is never printed");
    });
  } finally {
    await cluster.stop();
    await Deno.remove(scratch, { recursive: true }).catch(() => {});
  }
});

Deno.test("sslmode and DATABASE_CA_FILE: what the service can honour, and what it refuses", () => {
  const ca = { file: "/etc/ssl/db-ca.pem", pem: "-----BEGIN CERTIFICATE-----" };
  const url = "postgres://u:secret-pw@db.internal:6543/app";
  assert.deepEqual(postgresTls(`${url}?sslmode=verify-full`, "DATABASE_URL", ca).ssl, {
    rejectUnauthorized: true,
    host: "db.internal",
    ca: ca.pem,
  });
  assert.deepEqual(postgresTls(`${url}?sslmode=verify-full`, "DATABASE_URL", null).ssl, {
    rejectUnauthorized: true,
    host: "db.internal",
  });
  assert.equal(postgresTls(`${url}?sslmode=require`, "DATABASE_URL", null).ssl, "require");
  assert.equal(postgresTls(url, "DATABASE_URL", null).ssl, false);
  assert.equal(postgresTls(`${url}?sslmode=disable`, "DATABASE_URL", null).ssl, false);
  assert.equal(postgresTls(url, "DATABASE_URL", null).address, "db.internal:6543");

  const refusals: [string, typeof ca | null, string, RegExp][] = [
    [`${url}?sslmode=require`, ca, "DATABASE_CA_FILE", /sslmode=require, which does not check/],
    [url, ca, "DATABASE_CA_FILE", /sslmode=\(none\).*add sslmode=verify-full/],
    [`${url}?sslmode=verify-ca`, null, "DATABASE_LISTEN_URL", /verify-ca is not supported/],
    [`${url}?sslmode=strict`, null, "DATABASE_LISTEN_URL", /sslmode=strict is not one of/],
    [
      `${url}?sslmode=verify-full&sslrootcert=/ca.pem`,
      null,
      "DATABASE_LISTEN_URL",
      /sslrootcert is not read from the URL: give the CA file in DATABASE_CA_FILE/,
    ],
    [
      `${url}?sslmode=require&channel_binding=require`,
      null,
      "DATABASE_LISTEN_URL",
      /channel_binding is a libpq setting .* remove it from the URL/,
    ],
  ];
  for (const [text, caFile, variable, reason] of refusals) {
    assert.throws(() => postgresTls(text, "DATABASE_LISTEN_URL", caFile), (error) => {
      assert.ok(error instanceof ConfigError);
      assert.equal(error.variable, variable);
      assert.match(error.message, reason);
      assert.ok(!error.message.includes("secret-pw"), "the URL is never quoted");
      return true;
    });
  }
});

Deno.test("a DATABASE_URL to another machine without sslmode is named for the boot's warning", () => {
  const cases: [string | null, string | null][] = [
    [null, null],
    ["postgres://u:p@db.internal:5432/relay", "db.internal"],
    ["postgres://u:p@10.0.0.5/relay", "10.0.0.5"],
    ["postgres://u:p@[2001:db8::5]:5432/relay", "2001:db8::5"],
    ["postgres://u:p@localhost/relay?host=db.internal", "db.internal"],
    ["postgres://u:p@db.internal/relay?sslmode=verify-full", null],
    ["postgres://u:p@db.internal/relay?sslmode=disable", null],
    ["postgres://u:p@127.0.0.1:5432/relay", null],
    ["postgres://u:p@localhost/relay", null],
    ["postgres://u:p@[::1]/relay", null],
    ["postgres://u:p@localhost/relay?host=/var/run/postgresql", null],
  ];
  for (const [url, host] of cases) assert.equal(remoteHostWithoutTls(url), host, String(url));
});

Deno.test("the boot warns of a remote DATABASE_URL without sslmode, in production only", async () => {
  // 192.0.2.1 (documentation) never answers: the boot fails after the warning, quickly.
  const env = {
    DATABASE_URL: "postgres://relay@192.0.2.1:5432/relay",
    DATABASE_CONNECT_TIMEOUT: "1s",
    PORT: "0",
  };
  const linesOf = async (nodeEnv: string) => {
    const run = await runCli(["serve"], { ...env, NODE_ENV: nodeEnv });
    assert.equal(run.code, 1, run.stdout);
    return run.stdout.trim().split("\n").map((line) => JSON.parse(line));
  };
  const production = await linesOf("production");
  const warning = production.find((line) => line.msg === "database_tls_unset");
  assert.ok(warning, JSON.stringify(production));
  assert.equal(warning.level, "warn");
  assert.equal(warning.host, "192.0.2.1");
  assert.ok(!JSON.stringify(warning).includes("postgres://"), "the URL stays out of the log");
  assert.ok(production.some((line) => line.msg === "startup_failed"));
  const development = await linesOf("development");
  assert.ok(!development.some((line) => line.msg === "database_tls_unset"));
});
