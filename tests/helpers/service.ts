/**
 * Test harness: fresh databases (PostgreSQL when `TEST_DATABASE_URL` is set, otherwise the
 * embedded engine) and real service processes started with `deno run main.ts`, with the
 * permissions their configuration gives (src/process/permissions.ts), as `deno task start` does.
 */
import postgres from "postgres";
import { join } from "node:path";
import { serviceEnvironment, servicePermissions } from "../../src/process/permissions.ts";
import { migrate } from "../../src/db/migrate.ts";
import { connectDatabase, type Database, sharedEmbeddedClient } from "../../src/db/connect.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** A fixed master key for tests (base64 of 32 bytes). */
export const TEST_ENCRYPTION_KEY = btoa(String.fromCharCode(...new Uint8Array(32).fill(7)));
const ADMIN_URL = Deno.env.get("TEST_DATABASE_URL") ?? null;

/** Which engine this test run uses. */
export const ENGINE: "postgresql" | "embedded" = ADMIN_URL ? "postgresql" : "embedded";

/** A database of its own for one test. */
export interface TestDatabase {
  /** Variables that point the service at it. */
  env: Record<string, string>;
  /** A directory the service may write (its DATA_DIR). */
  dataDir: string;
  drop(): Promise<void>;
}

/** Options of {@linkcode freshDatabase}. */
export interface FreshDatabaseOptions {
  /**
   * `true`: migrated, as `purchase-relay migrate` leaves it, for CLI commands run without a
   * service (only `serve` and `migrate` change the schema). `false`: empty, no schema at all.
   * Unset: whatever is quickest for a service, which migrates at boot (an empty PostgreSQL
   * database; an embedded one copied from a migrated template).
   */
  migrated?: boolean;
}

/**
 * Opens `test`'s database in this process, as the service would, with `poolSize` connections;
 * migrated unless `migrated` is false (for tests of a migration itself).
 */
export async function connectTestDatabase(
  test: TestDatabase,
  options: { poolSize?: number; migrated?: boolean } = {},
): Promise<Database> {
  const db = await connectDatabase({
    databaseUrl: test.env.DATABASE_URL ?? null,
    dataDir: test.dataDir,
    poolSize: options.poolSize ?? 2,
    timeoutMs: 30_000,
    shareEmbedded: false,
  });
  if (options.migrated !== false) await migrate(db.sql);
  return db;
}

/** Creates a database of its own: a PostgreSQL database, or a data directory (embedded). */
export async function freshDatabase(options: FreshDatabaseOptions = {}): Promise<TestDatabase> {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-test-" });
  if (!ADMIN_URL && options.migrated === false) {
    return {
      env: { DATA_DIR: dataDir },
      dataDir,
      async drop() {
        await Deno.remove(dataDir, { recursive: true }).catch(() => {});
      },
    };
  }
  if (ADMIN_URL) {
    const name = `pr_test_${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
    const admin = postgres(ADMIN_URL, { max: 1, onnotice: () => {} });
    await admin.unsafe(`CREATE DATABASE ${name}`);
    await admin.end();
    const url = new URL(ADMIN_URL);
    url.pathname = `/${name}`;
    if (options.migrated) {
      const sql = postgres(url.toString(), { max: 1, onnotice: () => {} });
      try {
        await migrate(sql);
      } finally {
        await sql.end();
      }
    }
    return {
      env: { DATABASE_URL: url.toString(), DATA_DIR: dataDir },
      dataDir,
      async drop() {
        const admin = postgres(ADMIN_URL, { max: 1, onnotice: () => {} });
        await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
        await admin.end();
        await Deno.remove(dataDir, { recursive: true }).catch(() => {});
      },
    };
  }
  // A copy of a migrated database costs less than unpacking a new one and migrating it at boot.
  const template = await embeddedTemplate();
  const target = join(dataDir, "data");
  await run(["cp", "-r", template, target]);
  return {
    env: { DATA_DIR: target },
    dataDir: target,
    async drop() {
      await Deno.remove(dataDir, { recursive: true }).catch(() => {});
    },
  };
}

let templatePromise: Promise<string> | undefined;

function embeddedTemplate(): Promise<string> {
  templatePromise ??= (async () => {
    // Keyed by what makes a migrated database: the migrations, and the engine's own first data
    // directory (a template left by another version in TMPDIR is not reused).
    const migrations = [...Deno.readDirSync(join(ROOT, "migrations"))].map((e) => e.name).sort();
    let hash = Deno.statSync(join(ROOT, "src/db/embedded/pglite_initdb.tar.gz")).size;
    for (const name of migrations) {
      for (const c of Deno.readTextFileSync(join(ROOT, "migrations", name)) + name) {
        hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
      }
    }
    const tmp = Deno.env.get("TMPDIR") ?? "/tmp";
    const dir = join(tmp, `purchase-relay-template-${hash.toString(16)}`);
    try {
      await Deno.stat(join(dir, "ready"));
      return dir;
    } catch {
      // not built yet
    }
    const building = await Deno.makeTempDir({ prefix: "pr-template-" });
    const result = await runCli(["migrate"], { DATA_DIR: building });
    if (result.code !== 0) throw new Error(`template migrate failed: ${result.stderr}`);
    await Deno.writeTextFile(join(building, "ready"), "");
    await Deno.remove(join(building, "pglite.lock")).catch(() => {});
    try {
      await Deno.rename(building, dir);
    } catch {
      await Deno.remove(building, { recursive: true }); // another worker won the race
    }
    return dir;
  })();
  return templatePromise;
}

/** The result of a CLI command. */
export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
  // deno-lint-ignore no-explicit-any
  json: any;
}

/** What a CLI command gets besides its arguments and configuration. */
export interface CliInput {
  /** Written to the command's standard input, which is then closed. */
  stdin?: string;
  /** Called with the command's pid once it runs, before `stdin` is written. */
  whileRunning?: (pid: number) => Promise<void>;
}

/** Runs `main.ts <args>` with the test configuration plus `env`. */
export async function runCli(
  args: string[],
  env: Record<string, string>,
  input: CliInput = {},
): Promise<CliResult> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...servicePermissions(baseEnv(env), args), join(ROOT, "main.ts"), ...args],
    env: { ...baseEnv(env), ...serviceEnvironment(baseEnv(env)) },
    clearEnv: true,
    stdin: input.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  await input.whileRunning?.(child.pid);
  if (input.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(input.stdin));
    await writer.close();
  }
  const output = await child.output();
  const stdout = new TextDecoder().decode(output.stdout);
  const stderr = new TextDecoder().decode(output.stderr);
  let json = null;
  try {
    json = JSON.parse(output.code === 0 ? stdout : stderr.trim().split("\n").at(-1) ?? "");
  } catch {
    json = null;
  }
  return { code: output.code, stdout, stderr, json };
}

function baseEnv(env: Record<string, string>): Record<string, string> {
  return {
    PATH: Deno.env.get("PATH") ?? "",
    HOME: Deno.env.get("HOME") ?? "/tmp",
    DENO_DIR: Deno.env.get("DENO_DIR") ?? join(Deno.env.get("HOME") ?? "/tmp", ".cache/deno"),
    NO_COLOR: "1",
    NODE_ENV: "test",
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    ...(Deno.env.get("DENO_TLS_CA_STORE")
      ? { DENO_TLS_CA_STORE: Deno.env.get("DENO_TLS_CA_STORE")! }
      : {}),
    ...env,
  };
}

/** A log line of the service. */
// deno-lint-ignore no-explicit-any
export type LogLine = Record<string, any>;

/** A running service process. */
export interface RunningService {
  url: string;
  port: number;
  /** The process id, e.g. to read its memory from `/proc`. */
  pid: number;
  db: TestDatabase;
  env: Record<string, string>;
  /** Every JSON log line so far. */
  logs: LogLine[];
  /** Raw stdout text so far (for checks that every line is JSON). */
  rawStdout(): string;
  /** Waits for a log line matching `predicate`. */
  waitForLog(predicate: (line: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
  /** Runs an admin command against the same database. */
  cli(...args: string[]): Promise<CliResult>;
  /** Sends a signal and waits for the exit code. */
  stop(signal?: Deno.Signal): Promise<number>;
  /** The exit status, once it has exited. */
  exited: Promise<Deno.CommandStatus>;
}

/** Options of {@linkcode startService}. */
export interface StartOptions {
  env?: Record<string, string>;
  /** Reuse a database (another replica, or a restart); a fresh one is made otherwise. */
  db?: TestDatabase;
  /** Wait for `listening` (default) or return at once (for boot-failure tests). */
  waitUntilListening?: boolean;
  /**
   * Deno permissions instead of those its configuration gives (`servicePermissions`), or a
   * function of those that returns the ones to use.
   */
  permissions?: string[] | ((computed: string[]) => string[]);
}

/** Starts `main.ts serve` on a free loopback port and waits until it listens. */
export async function startService(options: StartOptions = {}): Promise<RunningService> {
  const db = options.db ?? await freshDatabase();
  const env = { PORT: "0", HOST: "127.0.0.1", LOG_LEVEL: "debug", ...db.env, ...options.env };
  const computed = servicePermissions(baseEnv(env));
  const permissions = typeof options.permissions === "function"
    ? options.permissions(computed)
    : options.permissions ?? computed;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...permissions, join(ROOT, "main.ts"), "serve"],
    env: { ...baseEnv(env), ...serviceEnvironment(baseEnv(env)) },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logs: LogLine[] = [];
  let raw = "";
  const waiters: { predicate: (l: LogLine) => boolean; resolve: (l: LogLine) => void }[] = [];
  const pump = (async () => {
    const decoder = new TextDecoder();
    let pending = "";
    for await (const chunk of child.stdout) {
      const text = decoder.decode(chunk, { stream: true });
      raw += text;
      pending += text;
      let newline;
      while ((newline = pending.indexOf("\n")) !== -1) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        try {
          const parsed = JSON.parse(line);
          logs.push(parsed);
          for (const waiter of [...waiters]) {
            if (waiter.predicate(parsed)) {
              waiters.splice(waiters.indexOf(waiter), 1);
              waiter.resolve(parsed);
            }
          }
        } catch {
          // raw keeps it; a test asserts every line is JSON
        }
      }
    }
  })();
  let stderr = "";
  const stderrPump = (async () => {
    for await (const chunk of child.stderr) stderr += new TextDecoder().decode(chunk);
  })();
  const exited = child.status.then(async (status) => {
    await pump.catch(() => {});
    await stderrPump.catch(() => {});
    return status;
  });

  const waitForLog = (predicate: (line: LogLine) => boolean, timeoutMs = 30_000) => {
    const found = logs.find(predicate);
    if (found) return Promise.resolve(found);
    return new Promise<LogLine>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`log line not seen in ${timeoutMs} ms; stderr: ${stderr.slice(-2000)}`));
      }, timeoutMs);
      waiters.push({
        predicate,
        resolve: (line) => {
          clearTimeout(timer);
          resolve(line);
        },
      });
      exited.then(() => {
        // A process that exited will not print more.
        setTimeout(() => {
          clearTimeout(timer);
          reject(new Error(`service exited; stderr: ${stderr.slice(-2000)}`));
        }, 50);
      });
    });
  };

  let port = 0;
  if (options.waitUntilListening !== false) {
    const listening = await waitForLog((line) =>
      line.msg === "listening" || line.level === "fatal"
    );
    if (listening.msg !== "listening") {
      child.kill("SIGKILL");
      throw new Error(`service failed to start: ${JSON.stringify(listening)}`);
    }
    port = listening.port;
  }
  let stopped: Promise<number> | undefined;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    pid: child.pid,
    db,
    env,
    logs,
    rawStdout: () => raw,
    waitForLog,
    cli: (...args: string[]) => runCli(args, env),
    stop(signal: Deno.Signal = "SIGTERM") {
      stopped ??= (async () => {
        try {
          child.kill(signal);
        } catch {
          // already exited
        }
        return (await exited).code;
      })();
      return stopped;
    },
    exited,
  };
}

async function run(command: string[]): Promise<void> {
  const { code, stderr } = await new Deno.Command(command[0], {
    args: command.slice(1),
    stderr: "piped",
  }).output();
  if (code !== 0) throw new Error(`${command.join(" ")}: ${new TextDecoder().decode(stderr)}`);
}

/** A tenant with an API key, made through the CLI. */
export interface TenantWithKey {
  tenantId: string;
  keyId: string;
  key: string;
}

/** Creates a tenant and a key through the CLI of `service`. */
export async function createTenantWithKey(service: RunningService): Promise<TenantWithKey> {
  const tenant = await service.cli("tenant", "create", "--name", "Test tenant");
  if (tenant.code !== 0) throw new Error(`tenant create failed: ${tenant.stderr}`);
  const key = await service.cli("key", "create", tenant.json.id, "--env", "test");
  if (key.code !== 0) throw new Error(`key create failed: ${key.stderr}`);
  return { tenantId: tenant.json.id, keyId: key.json.id, key: key.json.key };
}

/** Stops a service and drops its database. */
export async function stopAndDrop(service: RunningService): Promise<void> {
  await service.stop();
  await service.db.drop();
}

/**
 * A SQL client on the running service's database: PostgreSQL directly, or the embedded engine
 * through the socket the service shares in its DATA_DIR. The caller ends it.
 */
export function databaseOf(service: RunningService): postgres.Sql {
  const url = service.db.env.DATABASE_URL;
  if (url) return postgres(url, { max: 1, onnotice: () => {} });
  return sharedEmbeddedClient(service.db.dataDir);
}

/**
 * A file of `/proc/<pid>/`, read through `cat`: Deno reads another process's `/proc` entries only
 * with every permission, which the test tasks do not grant.
 */
export async function readProcFile(pid: number, name: string): Promise<string> {
  const { stdout } = await new Deno.Command("cat", { args: [`/proc/${pid}/${name}`] }).output();
  return new TextDecoder().decode(stdout);
}
