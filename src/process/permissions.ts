/**
 * The Deno permissions of the service and its admin CLI: never `-A`, and each one scoped to what
 * the configuration needs (docs/deploy.md, "Permissions"). One list for every way `main.ts`
 * runs: `deno task start` and `deno task cli` (scripts/launch.ts computes it from the
 * environment), the compiled executable (scripts/compile.ts bakes in {@linkcode
 * executablePermissions}), the tests, the benchmarks and the demo.
 */
import { type Config, ConfigError, configVariables, readConfig } from "../config.ts";
import { LIBCRYPTO_PATHS } from "../crypto/es256.ts";
import { CLOUD_METADATA_ADDRESSES } from "../delivery/special_addresses.ts";
import { MIGRATIONS_DIR, TEMPLATE_URL } from "../db/files.ts";

/** Where the compiled executable may read and write: the systemd unit's and the image's paths. */
export const EXECUTABLE_PATHS = {
  /** `DATA_DIR`: read and write. */
  dataDir: "/var/lib/purchase-relay",
  /** Files named in the configuration (`STOREA_ROOT_CERTS`) and given to the CLI: read only. */
  configDir: "/etc/purchase-relay",
} as const;

/**
 * What npm:postgres fills in from when DATABASE_URL leaves it out (docs/configuration.md, "Other
 * environment variables"): read only with a DATABASE_URL, so that they cannot steer the embedded
 * engine's client.
 */
export const POSTGRES_CLIENT_VARIABLES = ["PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"];

/** What one process may touch besides the network. */
interface Scope {
  reads: string[];
  writes: string[];
  /** Whether it may open libcrypto (the OpenSSL ES256 engine). */
  ffi: boolean;
  /** Whether it connects to PostgreSQL with DATABASE_URL, which POSTGRES_CLIENT_VARIABLES complete. */
  postgres: boolean;
  /** Whether it may look up its OS user, npm:postgres's user name when DATABASE_URL has none. */
  osUser: boolean;
  /** Whether it runs the embedded engine (PGlite's WebAssembly). */
  embedded: boolean;
}

/**
 * The flags of `deno run main.ts ...args` for the configuration in `env`: reads and writes follow
 * `DATA_DIR` and the files the configuration names, FFI follows `CRYPTO_ENGINE`. `args` are the
 * CLI's arguments: the value of each `--*-file` option is a file the command reads.
 * @throws {Error} when a path has a comma, which Deno's permission flags cannot express.
 */
export function servicePermissions(
  env: Record<string, string | undefined>,
  args: readonly string[] = [],
): string[] {
  let config: Config;
  try {
    config = readConfig(env);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    // The process stops at its first line, on the same error, before it touches any file.
    return permissionFlags({
      reads: [],
      writes: [],
      ffi: false,
      postgres: false,
      osUser: false,
      embedded: false,
    });
  }
  const embedded = config.databaseUrl === null;
  // With PostgreSQL and ENCRYPTION_KEY the service keeps nothing in DATA_DIR, and gets no access.
  const data = embedded || config.encryptionKey === null ? [config.dataDir] : [];
  return permissionFlags({
    reads: [
      pathOf(MIGRATIONS_DIR),
      ...data,
      ...(embedded ? [embeddedEngineFiles(), pathOf(TEMPLATE_URL)] : []),
      ...config.storeaRootCerts,
      ...(config.databaseCaFile === null ? [] : [config.databaseCaFile]),
      ...fileOptions(args),
      // `trigger` finds the simulators of `deno task dev` through a file in DATA_DIR.
      ...(args[0] === "trigger" ? [config.dataDir] : []),
    ],
    writes: data,
    ffi: config.cryptoEngine !== "webcrypto",
    postgres: !embedded,
    osUser: !embedded && new URL(config.databaseUrl!).username === "",
    embedded,
  });
}

/**
 * glibc's malloc settings for a process of the embedded engine: blocks of 32 KB and more are
 * mapped on their own and unmapped when freed. Unpacking a new database and compiling PGlite free
 * tens of MB that glibc's heap would otherwise keep for the life of the process
 * (docs/postgresql.md, "Embedded or PostgreSQL").
 */
export const EMBEDDED_MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=32768";

/**
 * Variables to add to the environment of `deno run main.ts ...` for the configuration in `env`:
 * the embedded engine's malloc settings, unless the operator chose `GLIBC_TUNABLES` or the
 * service runs on PostgreSQL (which keeps glibc's defaults). glibc reads them when the process
 * starts, so they go to the child, not to the process that computes them.
 */
export function serviceEnvironment(
  env: Record<string, string | undefined>,
): Record<string, string> {
  if (env.DATABASE_URL || env.GLIBC_TUNABLES !== undefined) return {};
  return { GLIBC_TUNABLES: EMBEDDED_MALLOC_TUNABLES };
}

/**
 * The flags baked into the compiled executable, which cannot follow a configuration chosen when it
 * runs: the paths of {@linkcode EXECUTABLE_PATHS}. Its own files (the migrations, npm packages)
 * are inside it and readable without a flag.
 */
export function executablePermissions(): string[] {
  return permissionFlags({
    reads: [EXECUTABLE_PATHS.dataDir, EXECUTABLE_PATHS.configDir],
    writes: [EXECUTABLE_PATHS.dataDir],
    ffi: true,
    postgres: true,
    osUser: true,
    embedded: true,
  });
}

/** V8's flags for a service on the embedded engine, chosen for its memory. */
export const EMBEDDED_V8_FLAGS: readonly string[] = ["--liftoff-only", "--max-semi-space-size=2"];

function permissionFlags(scope: Scope): string[] {
  const variables = [...configVariables(), ...(scope.postgres ? POSTGRES_CLIENT_VARIABLES : [])];
  return [
    // Net stays whole: tenants' callback URLs may be any public host, and src/delivery checks
    // each address before it connects, which a fixed list given at start could not do.
    "--allow-net",
    // Except the clouds' metadata services, which hand out the machine's credentials: refused by
    // the runtime too, even where callbacks at private addresses are allowed
    // (docs/security.md, "Callback safety").
    `--deny-net=${CLOUD_METADATA_ADDRESSES.map(netHost).join(",")}`,
    `--allow-env=${variables.join(",")}`,
    // Any other variable reads as unset instead of failing: libraries look up optional ones
    // (npm:postgres reads PGSSL, PGAPPNAME...). The runtime reads its own (DENO_*, OTEL_*,
    // HTTPS_PROXY...) before any permission applies, so telemetry needs no entry here
    // (docs/observability.md, "Turning it on").
    "--ignore-env",
    ...pathFlag("--allow-read", scope.reads),
    ...pathFlag("--allow-write", scope.writes),
    // A refused access fails; on a terminal Deno would otherwise ask whether to allow it.
    "--no-prompt",
    // As libpq does, npm:postgres connects as the OS user when DATABASE_URL names none.
    ...(scope.osUser ? ["--allow-sys=userInfo,uid,gid"] : []),
    ...pathFlag("--allow-ffi", scope.ffi ? [...LIBCRYPTO_PATHS] : []),
    // Not a permission: the embedded engine's WebAssembly stays on V8's baseline compiler, which
    // saves it some 45 MB and CPU, and V8's young generation stays small, which saves 12 MB at
    // no measured cost in time (docs/postgresql.md, "Embedded or PostgreSQL"). A service on
    // PostgreSQL keeps V8's defaults.
    ...(scope.embedded ? [`--v8-flags=${EMBEDDED_V8_FLAGS.join(",")}`] : []),
  ];
}

/**
 * The folder of PGlite's WebAssembly build and data files, which it reads with `node:fs` from
 * Deno's npm cache. (The compiled executable holds them inside, readable without a flag.)
 */
function embeddedEngineFiles(): string {
  const entry = pathOf(new URL(import.meta.resolve("@electric-sql/pglite")));
  return entry.slice(0, entry.lastIndexOf("/"));
}

/**
 * The path of a `file:` URL. Written out rather than node:url's `fileURLToPath`: loading Node's
 * path and URL modules cost `deno task start` about 20 ms before the service starts, and the
 * service runs on Linux and macOS only, where a file URL's path is the path.
 */
function pathOf(url: URL): string {
  if (url.protocol !== "file:") throw new Error(`not a file URL: ${url}`);
  return decodeURIComponent(url.pathname);
}

/** An address as Deno's net flags take it: an IPv6 one in brackets. */
function netHost(address: string): string {
  return address.includes(":") ? `[${address}]` : address;
}

/** `--flag=a,b`, or nothing for no paths: a bare `--flag` would allow every path. */
function pathFlag(flag: string, paths: string[]): string[] {
  const unique = [...new Set(paths)];
  if (unique.length === 0) return [];
  for (const path of unique) {
    if (path.includes(",")) {
      throw new Error(`${path}: a path with a comma cannot be given to ${flag}; rename it`);
    }
  }
  return [`${flag}=${unique.join(",")}`];
}

/** The values of `--*-file PATH` and `--*-file=PATH` options. */
function fileOptions(args: readonly string[]): string[] {
  const paths: string[] = [];
  args.forEach((arg, i) => {
    const inline = /^--[a-z-]+-file=(.+)$/.exec(arg);
    if (inline) paths.push(inline[1]);
    else if (/^--[a-z-]+-file$/.test(arg) && i + 1 < args.length) paths.push(args[i + 1]);
  });
  return paths;
}
