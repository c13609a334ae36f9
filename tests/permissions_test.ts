/**
 * The service's Deno permissions as computed from its configuration (src/process/permissions.ts): scoped
 * for every configuration, following DATA_DIR, the files it names, CRYPTO_ENGINE and the CLI's
 * file arguments; and the one list of variables, the table of src/config.ts.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { CONFIG_VARIABLES, configVariables, readConfig } from "../src/config.ts";
import { LIBCRYPTO_PATHS } from "../src/crypto/es256.ts";
import { TEMPLATE_URL } from "../src/db/embedded/template.ts";
import {
  EMBEDDED_MALLOC_TUNABLES,
  EXECUTABLE_PATHS,
  executablePermissions,
  POSTGRES_CLIENT_VARIABLES,
  serviceEnvironment,
  servicePermissions,
} from "../src/process/permissions.ts";
import { readProcFile } from "./helpers/service.ts";

const ROOT = new URL("../", import.meta.url);
const MIGRATIONS = fileURLToPath(new URL("migrations/", ROOT));
const KEY = btoa(String.fromCharCode(...new Uint8Array(32).fill(7)));
const POSTGRES = "postgres://relay:secret@db.internal:5432/relay";

/** The paths of `--flag=a,b` in `flags`, or null when the flag is absent. */
function scopeOf(flags: string[], flag: string): string[] | null {
  const found = flags.filter((f) => f === flag || f.startsWith(`${flag}=`));
  assert.ok(found.length <= 1, `${flag} given twice: ${found.join(" ")}`);
  if (found.length === 0) return null;
  assert.notEqual(found[0], flag, `${flag} without a scope allows everything`);
  return found[0].slice(flag.length + 1).split(",");
}

/**
 * What holds for every configuration: nothing unscoped but the network, nothing to run, and the
 * configuration's variables, with npm:postgres's own on PostgreSQL.
 */
function assertLeastPrivilege(flags: string[], postgres = false): void {
  for (const flag of flags) {
    assert.ok(
      !["-A", "--allow-all", "--allow-run", "--allow-import"].some((f) => flag.startsWith(f)),
      `${flag} is never given`,
    );
  }
  for (
    const flag of ["--allow-read", "--allow-write", "--allow-env", "--allow-ffi", "--allow-sys"]
  ) {
    scopeOf(flags, flag);
  }
  assert.deepEqual(scopeOf(flags, "--allow-env"), [
    ...configVariables(),
    ...(postgres ? POSTGRES_CLIENT_VARIABLES : []),
  ]);
  assert.ok(flags.includes("--ignore-env") && flags.includes("--no-prompt"));
  assert.ok(flags.includes("--allow-net"));
}

function pgliteFiles(flags: string[]): string[] {
  return (scopeOf(flags, "--allow-read") ?? []).filter((p) => p.includes("pglite"));
}

Deno.test("permissions: the variables are exactly those of the configuration table", () => {
  const names = CONFIG_VARIABLES.map((row) => row.name);
  assert.deepEqual(configVariables(), [...new Set(names)].sort());
  assert.ok(configVariables().includes("DATA_DIR") && configVariables().includes("ENCRYPTION_KEY"));
  // readConfig asks the environment for the table's variables and for nothing else, whatever
  // the configuration: a variable read around the table would be refused by --allow-env.
  for (
    const env of [
      {},
      { NODE_ENV: "production", ENCRYPTION_KEY: KEY, CALLBACK_ALLOW_INSECURE: "true" },
      { DATABASE_URL: POSTGRES, DATABASE_POOLER: "transaction", DATABASE_LISTEN_URL: POSTGRES },
    ]
  ) {
    const asked = new Set<string>();
    readConfig(
      new Proxy<Record<string, string | undefined>>(env, {
        get(target, name) {
          if (typeof name === "string") asked.add(name);
          return Reflect.get(target, name);
        },
      }),
    );
    assert.deepEqual([...asked].sort(), configVariables(), JSON.stringify(env));
  }
  // Nothing else in the service reads the environment, so the list is complete.
  for (const file of ["main.ts", ...sourceFiles("src")]) {
    if (file === "src/config.ts") continue;
    const text = Deno.readTextFileSync(new URL(file, ROOT));
    assert.doesNotMatch(text, /Deno\.env\.|process\.env/, `${file} reads the environment`);
  }
});

Deno.test("permissions: the embedded engine in DATA_DIR, with a generated key", () => {
  const flags = servicePermissions({ DATA_DIR: "/srv/relay/state" });
  assertLeastPrivilege(flags);
  assert.deepEqual(scopeOf(flags, "--allow-write"), ["/srv/relay/state"]);
  const reads = scopeOf(flags, "--allow-read")!;
  assert.deepEqual(reads.slice(0, 2), [MIGRATIONS, "/srv/relay/state"]);
  // PGlite's own files, and the initdb output a new database starts from.
  assert.equal(pgliteFiles(flags).length, 2);
  assert.match(pgliteFiles(flags)[0], /@electric-sql\/pglite\/[\d.]+\/dist$/);
  assert.equal(pgliteFiles(flags)[1], fileURLToPath(TEMPLATE_URL));
  assert.equal(reads.length, 4);
  assert.deepEqual(scopeOf(flags, "--allow-ffi"), [...LIBCRYPTO_PATHS]);
  assert.equal(scopeOf(flags, "--allow-sys"), null);
  assert.ok(flags.includes("--v8-flags=--liftoff-only,--max-semi-space-size=2"));
});

Deno.test("permissions: the default DATA_DIR is ./data, relative to where it runs", () => {
  const flags = servicePermissions({});
  assert.deepEqual(scopeOf(flags, "--allow-write"), ["./data"]);
  assertLeastPrivilege(flags);
});

Deno.test("permissions: PostgreSQL with ENCRYPTION_KEY writes nothing and reads no DATA_DIR", () => {
  const flags = servicePermissions({
    DATABASE_URL: POSTGRES,
    ENCRYPTION_KEY: KEY,
    DATA_DIR: "/srv/relay/state",
  });
  assertLeastPrivilege(flags, true);
  assert.equal(scopeOf(flags, "--allow-write"), null);
  assert.deepEqual(scopeOf(flags, "--allow-read"), [MIGRATIONS]);
  assert.equal(scopeOf(flags, "--allow-sys"), null);
});

Deno.test("permissions: PostgreSQL without a key writes only the generated key's DATA_DIR", () => {
  const flags = servicePermissions({ DATABASE_URL: POSTGRES, DATA_DIR: "/srv/relay/state" });
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-write"), ["/srv/relay/state"]);
  assert.deepEqual(pgliteFiles(flags), []);
});

Deno.test("permissions: a DATABASE_URL without a user may look up the OS user, as libpq", () => {
  const flags = servicePermissions({ DATABASE_URL: "postgres://db.internal/relay" });
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-sys"), ["userInfo", "uid", "gid"]);
});

Deno.test("permissions: STOREA_ROOT_CERTS files are readable, and only they", () => {
  const flags = servicePermissions({
    DATABASE_URL: POSTGRES,
    ENCRYPTION_KEY: KEY,
    STOREA_ROOT_CERTS: "/etc/relay/root-a.pem, /etc/relay/root-b.der",
  });
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-read"), [
    MIGRATIONS,
    "/etc/relay/root-a.pem",
    "/etc/relay/root-b.der",
  ]);
});

Deno.test("permissions: DATABASE_CA_FILE is readable", () => {
  const flags = servicePermissions({
    DATABASE_URL: `${POSTGRES}?sslmode=verify-full`,
    DATABASE_CA_FILE: "/etc/relay/db-ca.pem",
    ENCRYPTION_KEY: KEY,
  });
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-read"), [MIGRATIONS, "/etc/relay/db-ca.pem"]);
});

Deno.test("permissions: CRYPTO_ENGINE=webcrypto loads no library", () => {
  const flags = servicePermissions({ CRYPTO_ENGINE: "webcrypto" });
  assertLeastPrivilege(flags);
  assert.equal(scopeOf(flags, "--allow-ffi"), null);
  for (const path of LIBCRYPTO_PATHS) assert.ok(path.startsWith("/"), path);
});

Deno.test("permissions: a CLI command may read the files named by its --*-file options", () => {
  const flags = servicePermissions(
    { DATABASE_URL: POSTGRES, ENCRYPTION_KEY: KEY },
    [
      "storea",
      "set-credentials",
      "tenant_1",
      "--private-key-file",
      "./AuthKey.p8",
      "--service-account-file=/tmp/account.json",
      "--bundle-id",
      "com.example.app",
    ],
  );
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-read"), [
    MIGRATIONS,
    "./AuthKey.p8",
    "/tmp/account.json",
  ]);
});

Deno.test("permissions: an invalid configuration gets no file, library or user access", () => {
  const flags = servicePermissions({ NODE_ENV: "production", DATA_DIR: "/srv/relay" });
  assertLeastPrivilege(flags);
  for (const flag of ["--allow-read", "--allow-write", "--allow-ffi", "--allow-sys"]) {
    assert.equal(scopeOf(flags, flag), null, flag);
  }
});

Deno.test("permissions: a path with a comma is refused, not split into two grants", () => {
  assert.throws(() => servicePermissions({ DATA_DIR: "/srv/a,/etc" }), /comma/);
});

Deno.test("permissions: the executable's are fixed to the unit's and the image's paths", () => {
  const flags = executablePermissions();
  assertLeastPrivilege(flags, true);
  assert.deepEqual(scopeOf(flags, "--allow-read"), [
    EXECUTABLE_PATHS.dataDir,
    EXECUTABLE_PATHS.configDir,
  ]);
  assert.deepEqual(scopeOf(flags, "--allow-write"), [EXECUTABLE_PATHS.dataDir]);
  assert.deepEqual(scopeOf(flags, "--allow-ffi"), [...LIBCRYPTO_PATHS]);
  const dockerfile = Deno.readTextFileSync(new URL("Dockerfile", ROOT));
  assert.match(dockerfile, new RegExp(`ENV DATA_DIR=${EXECUTABLE_PATHS.dataDir} `));
  const unit = Deno.readTextFileSync(new URL("deploy/purchase-relay.service", ROOT));
  assert.match(unit, new RegExp(`^Environment=DATA_DIR=${EXECUTABLE_PATHS.dataDir}$`, "m"));
  assert.match(unit, new RegExp(`^ReadWritePaths=${EXECUTABLE_PATHS.dataDir}$`, "m"));
  const compile = Deno.readTextFileSync(new URL("scripts/compile.ts", ROOT));
  assert.match(compile, /\.\.\.executablePermissions\(\)/);
});

Deno.test("permissions: deno task start and cli compute them; no task runs main.ts itself", () => {
  const tasks: Record<string, string> = JSON.parse(
    Deno.readTextFileSync(new URL("deno.json", ROOT)),
  ).tasks;
  for (const name of ["start", "cli"]) {
    assert.match(tasks[name], /--allow-env --allow-run="\$\(deno eval .*\)" scripts\/launch\.ts/);
    assert.doesNotMatch(tasks[name], /--allow-(read|write|ffi|net)/);
  }
  for (const [name, line] of Object.entries(tasks)) {
    assert.doesNotMatch(line, /deno run[^&|;]* main\.ts/, `task ${name} runs main.ts itself`);
  }
});

Deno.test("permissions: the embedded engine's process gets glibc's malloc settings", () => {
  assert.deepEqual(serviceEnvironment({ DATA_DIR: "/srv/relay/state" }), {
    GLIBC_TUNABLES: EMBEDDED_MALLOC_TUNABLES,
  });
  assert.deepEqual(serviceEnvironment({ DATABASE_URL: "postgres://db/relay" }), {}, "PostgreSQL");
  assert.deepEqual(serviceEnvironment({ GLIBC_TUNABLES: "" }), {}, "the operator's choice");
});

Deno.test("permissions: deno task start gives the service process its malloc settings", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "purchase-relay-launch-" });
  const launcher = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-env", `--allow-run=${Deno.execPath()}`, "scripts/launch.ts", "serve"],
    cwd: fileURLToPath(ROOT),
    env: { PATH: Deno.env.get("PATH") ?? "", DATA_DIR: dataDir, PORT: "0", HOST: "127.0.0.1" },
    clearEnv: true,
    stdout: "piped",
    stderr: "null",
  }).spawn();
  try {
    const reader = launcher.stdout.pipeThrough(new TextDecoderStream()).getReader();
    for (let text = ""; !text.includes('"listening"');) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the service exited before listening");
      text += value;
    }
    reader.releaseLock();
    launcher.stdout.cancel().catch(() => {});
    const children = (await readProcFile(launcher.pid, `task/${launcher.pid}/children`))
      .trim().split(" ");
    assert.equal(children.length, 1);
    const environ = (await readProcFile(Number(children[0]), "environ")).split("\0");
    assert.ok(environ.includes(`GLIBC_TUNABLES=${EMBEDDED_MALLOC_TUNABLES}`), environ.join(" "));
  } finally {
    launcher.kill("SIGTERM");
    await launcher.status;
    await Deno.remove(dataDir, { recursive: true });
  }
});

function sourceFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(new URL(`${dir}/`, ROOT))) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) files.push(...sourceFiles(path));
    else if (entry.name.endsWith(".ts")) files.push(path);
  }
  return files;
}
