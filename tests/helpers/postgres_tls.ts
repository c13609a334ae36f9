/**
 * A PostgreSQL cluster of the test's own that accepts TLS connections only: `initdb` into a
 * temporary directory, a CA and a server certificate for `localhost` made with `openssl` at test
 * time, password authentication, started with `pg_ctl` on a free port and removed afterwards.
 */
import postgres from "postgres";
import { join } from "node:path";
import { asServerUser, freePort, handOver, output, serverDirectory } from "./local_servers.ts";
import type { TestDatabase } from "./service.ts";

/** A running TLS-only cluster. */
export interface TlsCluster {
  port: number;
  /** The CA that signed the server's certificate (PEM file). */
  caFile: string;
  /** Another CA, which signed nothing the server presents (PEM file). */
  otherCaFile: string;
  /** The password of the `relay` role, which the URLs carry. */
  password: string;
  /** A URL of database `database` as the `relay` role, on `host`, with `query` appended. */
  url(database: string, host: string, query: string): string;
  /** An empty database of the cluster for a service, pointed at by `env`. */
  freshDatabase(env: (database: string) => Record<string, string>): Promise<TestDatabase>;
  /** A client of the cluster's superuser, over its Unix socket. The caller ends it. */
  admin(): postgres.Sql;
  stop(): Promise<void>;
}

/** Where the PostgreSQL server programs are (`pg_config --bindir`, or Debian's layout). */
async function serverBinDir(): Promise<string> {
  const candidates: string[] = [];
  try {
    candidates.push((await output("pg_config", ["--bindir"])).trim());
  } catch {
    // no pg_config on PATH
  }
  try {
    const versions = [...Deno.readDirSync("/usr/lib/postgresql")].map((e) => e.name)
      .sort((a, b) => Number(b) - Number(a));
    candidates.push(...versions.map((v) => `/usr/lib/postgresql/${v}/bin`));
  } catch {
    // not Debian's layout
  }
  for (const dir of candidates) {
    try {
      await Deno.stat(join(dir, "initdb"));
      return dir;
    } catch {
      // not here
    }
  }
  throw new Error("initdb not found: install PostgreSQL's server package (postgresql-15)");
}

/**
 * Makes two CAs and a server certificate for `localhost` (and no other name) signed by the first.
 */
async function makeCertificates(dir: string): Promise<{ ca: string; other: string }> {
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  const ca = join(dir, "ca.crt");
  const other = join(dir, "other-ca.crt");
  for (const [name, cert] of [["Relay test CA", ca], ["Unrelated test CA", other]]) {
    await output("openssl", [
      "req",
      "-x509",
      ...ec,
      "-keyout",
      cert.replace(/\.crt$/, ".key"),
      "-out",
      cert,
      "-days",
      "2",
      "-subj",
      `/CN=${name}`,
    ]);
  }
  await output("openssl", [
    "req",
    ...ec,
    "-keyout",
    join(dir, "server.key"),
    "-out",
    join(dir, "server.csr"),
    "-subj",
    "/CN=localhost",
  ]);
  await Deno.writeTextFile(join(dir, "server.ext"), "subjectAltName=DNS:localhost\n");
  await output("openssl", [
    "x509",
    "-req",
    "-in",
    join(dir, "server.csr"),
    "-CA",
    ca,
    "-CAkey",
    join(dir, "ca.key"),
    "-CAcreateserial",
    "-out",
    join(dir, "server.crt"),
    "-days",
    "2",
    "-extfile",
    join(dir, "server.ext"),
  ]);
  await Deno.chmod(join(dir, "server.key"), 0o600);
  return { ca, other };
}

/** Starts a TLS-only cluster; stop it with {@linkcode TlsCluster.stop}. */
export async function startTlsCluster(): Promise<TlsCluster> {
  const bin = await serverBinDir();
  const dir = await serverDirectory("pr-tls-cluster-");
  const data = join(dir, "data");
  const port = freePort();
  const password = `pw-${crypto.randomUUID()}`;
  const run = async (command: string, args: string[]) => {
    const [cmd, argv] = await asServerUser(join(bin, command), args);
    await output(cmd, argv);
  };
  let started = false;
  try {
    const { ca, other } = await makeCertificates(dir);
    await handOver(dir);
    await run("initdb", [
      "-D",
      data,
      "-U",
      "postgres",
      "-E",
      "UTF8",
      "--auth-local=trust",
      "--auth-host=scram-sha-256",
      "--no-sync",
      "--no-instructions",
    ]);
    // TLS only: no `host` line, so a plain TCP connection has no pg_hba entry.
    await Deno.writeTextFile(
      join(data, "pg_hba.conf"),
      "local all all trust\n" +
        "hostssl all all 127.0.0.1/32 scram-sha-256\n" +
        "hostssl all all ::1/128 scram-sha-256\n",
    );
    await Deno.writeTextFile(
      join(data, "postgresql.conf"),
      [
        `port = ${port}`,
        "listen_addresses = '127.0.0.1'",
        `unix_socket_directories = '${dir}'`,
        "ssl = on",
        `ssl_cert_file = '${join(dir, "server.crt")}'`,
        `ssl_key_file = '${join(dir, "server.key")}'`,
        "fsync = off",
        "max_connections = 40",
        "shared_buffers = 16MB",
        "",
      ].join("\n"),
      { append: true },
    );
    await handOver(dir);
    await run("pg_ctl", ["-D", data, "-l", join(dir, "server.log"), "-w", "-t", "30", "start"]);
    started = true;
    const admin = () =>
      postgres({
        host: dir,
        port,
        user: "postgres",
        database: "postgres",
        max: 1,
        onnotice: () => {},
      });
    const sql = admin();
    try {
      await sql.unsafe(`CREATE ROLE relay LOGIN PASSWORD '${password}'`);
    } finally {
      await sql.end();
    }
    const url = (database: string, host: string, query: string) =>
      `postgres://relay:${password}@${host}:${port}/${database}${query}`;
    return {
      port,
      caFile: ca,
      otherCaFile: other,
      password,
      url,
      admin,
      async freshDatabase(env) {
        const name = `pr_tls_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
        const sql = admin();
        try {
          await sql.unsafe(`CREATE DATABASE ${name} OWNER relay`);
        } finally {
          await sql.end();
        }
        const dataDir = await Deno.makeTempDir({ prefix: "pr-test-" });
        return {
          env: { ...env(name), DATA_DIR: dataDir },
          dataDir,
          async drop() {
            const sql = admin();
            await sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
            await sql.end();
            await Deno.remove(dataDir, { recursive: true }).catch(() => {});
          },
        };
      },
      async stop() {
        await run("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"]).catch(() => {});
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      },
    };
  } catch (error) {
    if (started) await run("pg_ctl", ["-D", data, "-m", "immediate", "stop"]).catch(() => {});
    const log = await Deno.readTextFile(join(dir, "server.log")).catch(() => "");
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw new Error(`the TLS cluster did not start: ${error}\n${log.slice(-2000)}`);
  }
}
