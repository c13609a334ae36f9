/**
 * Configuration: the environment read once at boot into a typed, validated object
 * (decisions.md 4). Nothing else in the service reads the environment.
 */
import { BUILD_VERSION } from "./version.ts";

/** The deployment mode, logged as `env` in the `listening` line. */
export type RuntimeEnv = "production" | "development" | "test";

/** A log level, lowest first. */
export type LogLevel = "debug" | "info" | "warn" | "error";

/** The service's configuration. */
export interface Config {
  port: number;
  host: string;
  env: RuntimeEnv;
  logLevel: LogLevel;
  version: string;
  /** PostgreSQL URL; `null` selects the embedded engine in `dataDir`. */
  databaseUrl: string | null;
  databasePoolSize: number;
  /** A transaction pooler (`transaction`) gets no prepared statements and no LISTEN. */
  databasePooler: "none" | "transaction";
  /** A URL that gives LISTEN a session of its own, past a transaction pooler. */
  databaseListenUrl: string | null;
  /** CA certificates (PEM) that PostgreSQL's certificate must chain to with `verify-full`. */
  databaseCaFile: string | null;
  /** How long boot waits for the database before giving up. */
  databaseConnectTimeoutMs: number;
  dataDir: string;
  /** The 32-byte master key, or `null` when it is to be generated (outside production only). */
  encryptionKey: Uint8Array | null;
  rateLimitPerSecond: number;
  rateLimitBurst: number;
  validationAuditEnabled: boolean;
  validationAuditRetentionDays: number | null;
  storeaApiUrlProduction: string;
  storeaApiUrlSandbox: string;
  /** Paths of root certificates that replace the built-in pin; empty keeps the pin. */
  storeaRootCerts: string[];
  /** What checks ES256 signatures: OpenSSL through FFI, WebCrypto, or the first that works. */
  cryptoEngine: "auto" | "openssl" | "webcrypto";
  /** The deadline of one verification's store calls, retries included. */
  upstreamTimeoutMs: number;
  storebApiUrl: string;
  storebTokenUrl: string;
  storebOidcCertsUrl: string;
  storebOidcIssuers: string[];
  /** Delays after the immediate first attempt, in milliseconds. */
  deliveryRetryScheduleMs: number[];
  deliveryTimeoutMs: number;
  deliveryConcurrency: number;
  /** Delivery attempts in flight to one tenant, across every process. */
  deliveryTenantConcurrency: number;
  /** `CALLBACK_ALLOW_HTTP`: plain http callback URLs are allowed. */
  callbackAllowHttp: boolean;
  /** `CALLBACK_ALLOW_PRIVATE_NETWORKS`: callbacks at localhost and non-public addresses too. */
  callbackAllowPrivateNetworks: boolean;
  /** Deprecated variables that are set (the boot warns about them). */
  deprecatedVariables: string[];
  /** How long shutdown waits for requests in flight. */
  shutdownTimeoutMs: number;

  // Retention and encryption key rotation: read by `retentionAndRotation` below.
  /** Days a finished delivery is kept, with its attempts and event; 0 keeps them forever. */
  eventRetentionDays: number;
  /** The master key being rotated away from (`ENCRYPTION_KEY_PREVIOUS`), or `null`. */
  encryptionKeyPrevious: Uint8Array | null;
}

/** A variable that is missing or invalid. The message names the variable, never a secret value. */
export class ConfigError extends Error {
  readonly code = "CONFIG_INVALID";
  readonly variable: string;

  constructor(variable: string, reason: string) {
    super(`${variable}: ${reason}`);
    this.name = "ConfigError";
    this.variable = variable;
  }
}

type Env = Record<string, string | undefined>;

/** Reads and validates the configuration from `env` (a plain object, for tests). */
export function readConfig(env: Env): Config {
  const value = (name: string) => {
    const raw = env[name];
    return raw === undefined || raw.trim() === "" ? undefined : raw.trim();
  };
  const runtimeEnv = oneOf(
    "NODE_ENV",
    value("NODE_ENV") ?? "development",
    ["production", "development", "test"] as const,
  );
  const production = runtimeEnv === "production";
  const encryptionKeyText = value("ENCRYPTION_KEY");
  if (production && encryptionKeyText === undefined) {
    throw new ConfigError("ENCRYPTION_KEY", "is required when NODE_ENV is production");
  }
  const retentionText = value("VALIDATION_AUDIT_RETENTION_DAYS");
  // The deprecated CALLBACK_ALLOW_INSECURE sets both callback allowances unless they are set.
  const insecureText = value("CALLBACK_ALLOW_INSECURE");
  const insecure = insecureText === undefined
    ? !production
    : boolean("CALLBACK_ALLOW_INSECURE", insecureText);
  const allowHttpText = value("CALLBACK_ALLOW_HTTP");
  const allowPrivateText = value("CALLBACK_ALLOW_PRIVATE_NETWORKS");

  return {
    port: integer("PORT", value("PORT") ?? "8080", 0, 65535),
    host: value("HOST") ?? "0.0.0.0",
    env: runtimeEnv,
    logLevel: oneOf(
      "LOG_LEVEL",
      value("LOG_LEVEL") ?? "info",
      ["debug", "info", "warn", "error"] as const,
    ),
    version: serviceVersion(value("SERVICE_VERSION") ?? BUILD_VERSION),
    databaseUrl: databaseUrl(value("DATABASE_URL")),
    databasePoolSize: integer("DATABASE_POOL_SIZE", value("DATABASE_POOL_SIZE") ?? "10", 1, 1000),
    databasePooler: oneOf(
      "DATABASE_POOLER",
      withDatabaseUrl("DATABASE_POOLER", value("DATABASE_POOLER"), value("DATABASE_URL")) ??
        "none",
      ["none", "transaction"] as const,
    ),
    databaseListenUrl: databaseUrl(
      withDatabaseUrl("DATABASE_LISTEN_URL", value("DATABASE_LISTEN_URL"), value("DATABASE_URL")),
      "DATABASE_LISTEN_URL",
    ),
    databaseCaFile:
      withDatabaseUrl("DATABASE_CA_FILE", value("DATABASE_CA_FILE"), value("DATABASE_URL")) ??
        null,
    databaseConnectTimeoutMs: duration(
      "DATABASE_CONNECT_TIMEOUT",
      value("DATABASE_CONNECT_TIMEOUT") ?? "30s",
    ),
    dataDir: value("DATA_DIR") ?? "./data",
    encryptionKey: encryptionKeyText === undefined ? null : decodeMasterKey(encryptionKeyText),
    rateLimitPerSecond: positiveNumber(
      "RATE_LIMIT_PER_SECOND",
      value("RATE_LIMIT_PER_SECOND") ?? "100",
    ),
    rateLimitBurst: integer("RATE_LIMIT_BURST", value("RATE_LIMIT_BURST") ?? "200", 1, 1e9),
    validationAuditEnabled: boolean(
      "VALIDATION_AUDIT_ENABLED",
      value("VALIDATION_AUDIT_ENABLED") ?? "false",
    ),
    validationAuditRetentionDays: retentionText === undefined
      ? null
      : integer("VALIDATION_AUDIT_RETENTION_DAYS", retentionText, 1, 36500),
    storeaApiUrlProduction: httpUrl(
      "STOREA_API_URL_PRODUCTION",
      value("STOREA_API_URL_PRODUCTION") ?? "https://api.storekit.apple.com",
    ),
    storeaApiUrlSandbox: httpUrl(
      "STOREA_API_URL_SANDBOX",
      value("STOREA_API_URL_SANDBOX") ?? "https://api.storekit-sandbox.apple.com",
    ),
    storeaRootCerts: list(value("STOREA_ROOT_CERTS") ?? ""),
    cryptoEngine: oneOf(
      "CRYPTO_ENGINE",
      value("CRYPTO_ENGINE") ?? "auto",
      ["auto", "openssl", "webcrypto"] as const,
    ),
    storebApiUrl: httpUrl(
      "STOREB_API_URL",
      value("STOREB_API_URL") ?? "https://androidpublisher.googleapis.com",
    ),
    storebTokenUrl: httpUrl(
      "STOREB_TOKEN_URL",
      value("STOREB_TOKEN_URL") ?? "https://oauth2.googleapis.com/token",
    ),
    storebOidcCertsUrl: httpUrl(
      "STOREB_OIDC_CERTS_URL",
      value("STOREB_OIDC_CERTS_URL") ?? "https://www.googleapis.com/oauth2/v3/certs",
    ),
    storebOidcIssuers: nonEmptyList(
      "STOREB_OIDC_ISSUERS",
      value("STOREB_OIDC_ISSUERS") ?? "https://accounts.google.com,accounts.google.com",
    ),
    deliveryRetryScheduleMs: list(value("DELIVERY_RETRY_SCHEDULE") ?? "30s,2m,10m,1h,6h").map((
      item,
    ) => duration("DELIVERY_RETRY_SCHEDULE", item)),
    upstreamTimeoutMs: duration("UPSTREAM_TIMEOUT", value("UPSTREAM_TIMEOUT") ?? "10s"),
    deliveryTimeoutMs: duration("DELIVERY_TIMEOUT", value("DELIVERY_TIMEOUT") ?? "10s"),
    deliveryConcurrency: integer(
      "DELIVERY_CONCURRENCY",
      value("DELIVERY_CONCURRENCY") ?? "32",
      1,
      10000,
    ),
    deliveryTenantConcurrency: integer(
      "DELIVERY_TENANT_CONCURRENCY",
      value("DELIVERY_TENANT_CONCURRENCY") ?? "8",
      1,
      10000,
    ),
    callbackAllowHttp: allowHttpText === undefined
      ? insecure
      : boolean("CALLBACK_ALLOW_HTTP", allowHttpText),
    callbackAllowPrivateNetworks: allowPrivateText === undefined
      ? insecure
      : boolean("CALLBACK_ALLOW_PRIVATE_NETWORKS", allowPrivateText),
    deprecatedVariables: insecureText === undefined ? [] : ["CALLBACK_ALLOW_INSECURE"],
    shutdownTimeoutMs: duration("SHUTDOWN_TIMEOUT", value("SHUTDOWN_TIMEOUT") ?? "10s"),
    ...retentionAndRotation(value("EVENT_RETENTION_DAYS") ?? "90", {
      previous: value("ENCRYPTION_KEY_PREVIOUS"),
      current: encryptionKeyText,
    }),
  };
}

/**
 * `EVENT_RETENTION_DAYS` (default 90, 0 keeps forever: docs/operations.md, "Retention") and
 * `ENCRYPTION_KEY_PREVIOUS` (docs/operations.md, "Rotating `ENCRYPTION_KEY`"), which needs an
 * `ENCRYPTION_KEY` to rotate to and must differ from it.
 */
function retentionAndRotation(
  retentionText: string,
  keys: { previous: string | undefined; current: string | undefined },
): Pick<Config, "eventRetentionDays" | "encryptionKeyPrevious"> {
  const name = "ENCRYPTION_KEY_PREVIOUS";
  let previous: Uint8Array | null = null;
  if (keys.previous !== undefined) {
    if (keys.current === undefined) {
      throw new ConfigError(name, "is set, but ENCRYPTION_KEY is not");
    }
    previous = decodeMasterKey(keys.previous, name);
    const current = decodeMasterKey(keys.current);
    if (previous.every((byte, i) => byte === current[i])) {
      throw new ConfigError(name, "is the same key as ENCRYPTION_KEY");
    }
  }
  return {
    eventRetentionDays: integer("EVENT_RETENTION_DAYS", retentionText, 0, 36500),
    encryptionKeyPrevious: previous,
  };
}

/**
 * The names of the variables {@linkcode readConfig} reads, found by running it on an empty
 * environment: a variable added there is on this list without another edit. The service may
 * read these and no others (`--allow-env=<names>`, src/permissions.ts); tests/permissions_test.ts
 * fails if a variable is read only under a condition and so missed here.
 */
export function configVariables(): string[] {
  const names = new Set<string>();
  readConfig(
    new Proxy<Env>({}, {
      get(_target, name) {
        if (typeof name === "string") names.add(name);
        return undefined;
      },
    }),
  );
  return [...names].sort();
}

/**
 * The process's configuration variables, read one by one: a scoped `--allow-env` refuses
 * `Deno.env.toObject()`.
 */
export function readEnvironment(): Env {
  return Object.fromEntries(configVariables().map((name) => [name, Deno.env.get(name)]));
}

/** Decodes `ENCRYPTION_KEY` (or `variable`): standard or URL-safe base64 of exactly 32 bytes. */
export function decodeMasterKey(text: string, variable = "ENCRYPTION_KEY"): Uint8Array {
  const normalized = text.replaceAll("-", "+").replaceAll("_", "/");
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.from(atob(normalized), (c) => c.charCodeAt(0));
  } catch {
    throw new ConfigError(variable, "is not valid base64");
  }
  if (bytes.length !== 32) {
    throw new ConfigError(variable, `must decode to 32 bytes, got ${bytes.length}`);
  }
  return bytes;
}

/** Parses a duration such as `500ms`, `30s`, `2m`, `1h` or `1d` into milliseconds. */
export function parseDuration(text: string): number | null {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(text.trim());
  if (!match) return null;
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[match[2]]!;
  return Math.round(Number(match[1]) * unit);
}

function duration(name: string, text: string): number {
  const ms = parseDuration(text);
  if (ms === null) {
    throw new ConfigError(name, `"${text}" is not a duration such as 500ms, 30s, 2m, 1h or 1d`);
  }
  return ms;
}

function integer(name: string, text: string, min: number, max: number): number {
  if (!/^\d+$/.test(text)) throw new ConfigError(name, `"${text}" is not an integer`);
  const n = Number(text);
  if (n < min || n > max) throw new ConfigError(name, `must be between ${min} and ${max}`);
  return n;
}

function positiveNumber(name: string, text: string): number {
  const n = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text) || !(n > 0)) {
    throw new ConfigError(name, `"${text}" is not a positive number`);
  }
  return n;
}

function boolean(name: string, text: string): boolean {
  const lower = text.toLowerCase();
  if (["true", "1", "yes"].includes(lower)) return true;
  if (["false", "0", "no"].includes(lower)) return false;
  throw new ConfigError(name, `"${text}" is not true or false`);
}

function oneOf<T extends string>(name: string, text: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(text)) {
    throw new ConfigError(name, `"${text}" is not one of ${allowed.join(", ")}`);
  }
  return text as T;
}

function serviceVersion(text: string): string {
  if (text !== "dev" && !/^v\d+\.\d+\.\d+$/.test(text)) {
    throw new ConfigError("SERVICE_VERSION", `"${text}" is not v<major>.<minor>.<patch> or dev`);
  }
  return text;
}

function httpUrl(name: string, text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ConfigError(name, `"${text}" is not a URL`);
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    throw new ConfigError(name, "must be an http or https URL");
  }
  return text.replace(/\/+$/, "");
}

function databaseUrl(text: string | undefined, name = "DATABASE_URL"): string | null {
  if (text === undefined) return null;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    // The URL may hold a password: name the variable, not the value.
    throw new ConfigError(name, "is not a URL");
  }
  if (url.protocol !== "postgres:" && url.protocol !== "postgresql:") {
    throw new ConfigError(name, "must start with postgres:// or postgresql://");
  }
  return text;
}

/** A variable about the way to PostgreSQL: refused without DATABASE_URL, which would ignore it. */
function withDatabaseUrl(
  name: string,
  text: string | undefined,
  databaseUrl: string | undefined,
): string | undefined {
  if (text !== undefined && databaseUrl === undefined) {
    throw new ConfigError(name, "is set, but DATABASE_URL is not");
  }
  return text;
}

function list(text: string): string[] {
  return text.split(",").map((item) => item.trim()).filter((item) => item !== "");
}

function nonEmptyList(name: string, text: string): string[] {
  const items = list(text);
  if (items.length === 0) throw new ConfigError(name, "must list at least one value");
  return items;
}
