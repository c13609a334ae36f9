/**
 * A PgBouncer of the test's own in front of the test PostgreSQL server (`TEST_DATABASE_URL`):
 * a generated ini in a temporary directory, a free loopback port, and the process stopped and
 * the directory removed afterwards.
 */
import { join } from "node:path";
import {
  findExecutable,
  freePort,
  handOver,
  runningAsRoot,
  serverDirectory,
  waitForPort,
} from "./local_servers.ts";

/** A running PgBouncer. */
export interface PgBouncer {
  port: number;
  /** `url` (a URL of the PostgreSQL server) with its host and port replaced by PgBouncer's. */
  through(url: string): string;
  /** Its log so far. */
  log(): Promise<string>;
  stop(): Promise<void>;
}

/** Options of {@linkcode startPgBouncer}. */
export interface PgBouncerOptions {
  /** The PostgreSQL server it pools, with credentials if it needs them. */
  upstream: string;
  poolMode: "transaction" | "session";
  /** Server connections per database and user: few, so clients share them. */
  poolSize: number;
}

/** Starts PgBouncer; fails with a clear message when it is not installed. */
export async function startPgBouncer(options: PgBouncerOptions): Promise<PgBouncer> {
  const binary = await findExecutable("pgbouncer");
  if (binary === null) {
    throw new Error(
      "pgbouncer is not installed: apt-get install -y pgbouncer (.ci/run installs it)",
    );
  }
  const upstream = new URL(options.upstream);
  const user = decodeURIComponent(upstream.username || "postgres");
  const password = decodeURIComponent(upstream.password);
  const dir = await serverDirectory("pr-pgbouncer-");
  const port = freePort();
  const serverParams = [
    `host=${upstream.hostname}`,
    `port=${upstream.port || "5432"}`,
    ...(password ? [`password=${password}`] : []),
  ].join(" ");
  await Deno.writeTextFile(
    join(dir, "pgbouncer.ini"),
    [
      "[databases]",
      `* = ${serverParams}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      "unix_socket_dir =",
      "auth_type = trust",
      `auth_file = ${join(dir, "users.txt")}`,
      `pool_mode = ${options.poolMode}`,
      `default_pool_size = ${options.poolSize}`,
      "max_client_conn = 500",
      `logfile = ${join(dir, "pgbouncer.log")}`,
      "",
    ].join("\n"),
  );
  await Deno.writeTextFile(join(dir, "users.txt"), `"${user}" ""\n`);
  await handOver(dir);
  // It refuses to run as root: `-u` makes it switch to the server user itself, so the child is
  // PgBouncer and not a wrapper that would have to pass signals on.
  const args = [...await runningAsRoot() ? ["-u", "postgres"] : [], join(dir, "pgbouncer.ini")];
  const child = new Deno.Command(binary, { args, stdout: "null", stderr: "null" }).spawn();
  const log = () => Deno.readTextFile(join(dir, "pgbouncer.log")).catch(() => "");
  try {
    await Promise.race([
      waitForPort(port, 10_000, "pgbouncer"),
      child.status.then(async () => {
        throw new Error(`pgbouncer exited: ${await log()}`);
      }),
    ]);
  } catch (error) {
    try {
      child.kill("SIGTERM");
    } catch {
      // already exited
    }
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw error;
  }
  return {
    port,
    through(url) {
      const routed = new URL(url);
      routed.hostname = "127.0.0.1";
      routed.port = String(port);
      return routed.toString();
    },
    log,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch {
        // already exited
      }
      await child.status;
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}
