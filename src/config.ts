/**
 * Configuration: the environment read once at boot into a typed, validated object. Nothing else
 * in the service reads the environment.
 *
 * {@linkcode CONFIG_GROUPS} is the one table of variables: each row names a variable once, with
 * the kind of value it holds, its default, the {@linkcode Config} field it fills and one line of
 * documentation. {@linkcode readConfig} walks it; the `--allow-env` list (src/process/permissions.ts), the
 * reference in docs/operations.md ("All variables") and deploy/purchase-relay.env.example are made
 * from it (`deno task docs:config`). Adding a variable is a row here and its field in `Config`.
 * @module
 */
import { BUILD_VERSION } from "./version.ts";
import { RelayError } from "./errors.ts";
import {
  boolean,
  duration,
  durationList,
  httpUrl,
  integer,
  InvalidValue,
  list,
  masterKey,
  nonEmptyList,
  oneOf,
  type Parser,
  positiveNumber,
  postgresUrl,
  serviceVersion,
  text,
} from "./config_parsers.ts";

export { parseDuration } from "./config_parsers.ts";

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
  /** How old a posted store A notification may be, by its `signedDate`. */
  storeaNotificationMaxAgeMs: number;
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
  /** The names of the variables set in the environment (never their values): what was asked for. */
  setVariables: string[];
  /** How long shutdown waits for requests in flight. */
  shutdownTimeoutMs: number;
  /** Days a finished delivery is kept, with its attempts and event; 0 keeps them forever. */
  eventRetentionDays: number;
  /** The master key being rotated away from (`ENCRYPTION_KEY_PREVIOUS`), or `null`. */
  encryptionKeyPrevious: Uint8Array | null;
  /** How often each tenant is reconciled with the stores' records; 0: never. */
  recoveryIntervalMs: number;
}

/** A variable that is missing or invalid. The message names the variable, never a secret value. */
export class ConfigError extends RelayError {
  readonly variable: string;

  constructor(variable: string, reason: string) {
    super("CONFIG_INVALID", `${variable}: ${reason}`);
    this.variable = variable;
  }
}

type Env = Record<string, string | undefined>;

/**
 * The value read for another variable of the table: what a computed default may depend on; and
 * whether that variable was set at all.
 */
export type ValueOf = ((name: string) => unknown) & { isSet(name: string): boolean };

/** One variable, as {@linkcode readConfig} and the reference see it. */
export interface ConfigVariable<K extends keyof Config = keyof Config> {
  /** Its name in the environment. */
  readonly name: string;
  /** The field it fills; `null` for a deprecated variable, which the rows replacing it read. */
  readonly field: K | null;
  /** The kind of value it holds. */
  readonly parser: Parser<unknown>;
  /** Text read in its place when it is unset (or empty), as if it were set. */
  readonly default?: string;
  /** The value when it is unset, from other variables; may refuse with {@linkcode InvalidValue}. */
  readonly unset?: (valueOf: ValueOf) => unknown;
  /** What being unset means, for the reference; without it, `default` in backticks. */
  readonly defaultText?: string;
  /** A variable it is refused without, because that one's absence would make it ignored. */
  readonly needs?: string;
  /** Checks a set value against other variables; refuses with {@linkcode InvalidValue}. */
  readonly check?: (value: unknown, valueOf: ValueOf) => void;
  /** Its value is never quoted in a refusal. */
  readonly secret: boolean;
  /** The boot warns while it is set (`config_variable_deprecated`). */
  readonly deprecated: boolean;
  /** One line for the reference (Markdown); links are to docs/operations.md's headings. */
  readonly description: string;
  /**
   * How deploy/purchase-relay.env.example, a production deployment, shows it: `set` to a value,
   * or commented out with the value `shown`; without it, commented out with its default.
   */
  readonly example?: { set: string } | { shown: string };
}

/** Variables shown together, under a title, in the example environment file. */
export interface ConfigGroup {
  readonly title: string;
  readonly variables: readonly ConfigVariable[];
}

/**
 * A row as written in the table: its parser and its value when unset are checked against the
 * field it fills, and a default computed from other variables says what it is.
 */
type Row<K extends keyof Config> =
  & Omit<ConfigVariable<K>, "field" | "parser" | "default" | "unset" | "secret" | "deprecated">
  & { field: K; parser: Parser<Config[K]>; secret?: boolean }
  & ({ default: string } | { unset: (valueOf: ValueOf) => Config[K]; defaultText: string });

/** A row of the table, type-checked against the field it fills. */
function variable<K extends keyof Config>(row: Row<K>): ConfigVariable<K> {
  return { secret: false, ...row, deprecated: false };
}

/** A deprecated variable: it fills no field; the rows that replace it read its value. */
function deprecatedVariable(
  row: Omit<ConfigVariable<never>, "field" | "secret" | "deprecated" | "default"> & {
    defaultText: string;
  },
): ConfigVariable<never> {
  return { ...row, field: null, secret: false, deprecated: true };
}

function isProduction(valueOf: ValueOf): boolean {
  return valueOf("NODE_ENV") === "production";
}

/**
 * A callback allowance: the deprecated CALLBACK_ALLOW_INSECURE when set; else on only when
 * development or test was asked for, since an unset NODE_ENV must be as safe as production.
 */
function callbackAllowanceDefault(valueOf: ValueOf): boolean {
  return (valueOf("CALLBACK_ALLOW_INSECURE") as boolean | null) ??
    (valueOf.isSet("NODE_ENV") && !isProduction(valueOf));
}

const CALLBACK_ALLOWANCE_DEFAULT =
  "`true` when `NODE_ENV` is `development` or `test`, else `false`, as in production (or `CALLBACK_ALLOW_INSECURE` when set)";

/**
 * Every variable the service reads, by group, in the order the reference and the example file
 * show them. A default may depend on any other row (`valueOf`), whatever its place.
 */
export const CONFIG_GROUPS = [
  {
    title: "Required in production",
    variables: [
      variable({
        name: "NODE_ENV",
        field: "env",
        parser: oneOf(["production", "development", "test"]),
        default: "development",
        description:
          "Deployment mode, logged as `env` in `listening`. `production` requires `ENCRYPTION_KEY`, keeps stack traces and error messages out of the logs, and allows only https callback URLs that resolve to public addresses: see [Production settings](configuration.md#production-settings). Unset, it is `development` for the logs and the generated key, but callbacks follow production's rules until `development` or `test` is asked for (`deno task dev` does); the `listening` line says which rules apply and why.",
        example: { set: "production" },
      }),
      variable({
        name: "ENCRYPTION_KEY",
        field: "encryptionKey",
        parser: masterKey,
        secret: true,
        unset: (valueOf) => {
          if (isProduction(valueOf)) {
            throw new InvalidValue("is required when NODE_ENV is production");
          }
          return null;
        },
        defaultText:
          "required in production; otherwise generated once into `DATA_DIR/encryption.key` (mode 0600) with a `warn` line",
        description:
          "The master key that seals store credentials and webhook secrets, for example from `openssl rand -base64 32`. The same on every replica and for the CLI. Back it up apart from the database: without it the sealed values cannot be opened. See [Secrets at rest](security.md#secrets-at-rest).",
        example: { set: "" },
      }),
      variable({
        name: "ENCRYPTION_KEY_PREVIOUS",
        field: "encryptionKeyPrevious",
        parser: masterKey,
        secret: true,
        needs: "ENCRYPTION_KEY",
        check: (previous, valueOf) => {
          const current = valueOf("ENCRYPTION_KEY") as Uint8Array;
          if ((previous as Uint8Array).every((byte, i) => byte === current[i])) {
            throw new InvalidValue("is the same key as ENCRYPTION_KEY");
          }
        },
        unset: () => null,
        defaultText: "unset: values are sealed and opened with `ENCRYPTION_KEY` alone",
        description:
          "The key being rotated away from, while `ENCRYPTION_KEY` is the new one: values sealed with either open, new ones are sealed with `ENCRYPTION_KEY`. Set it on every replica, run `encryption rotate-key`, then remove it. See [Rotating `ENCRYPTION_KEY`](maintenance.md#rotating-encryption_key).",
      }),
      variable({
        name: "DATABASE_URL",
        field: "databaseUrl",
        parser: postgresUrl,
        secret: true,
        unset: () => null,
        defaultText:
          "unset: the embedded engine in `DATA_DIR`, for one process on one machine only",
        description:
          "The PostgreSQL server, `postgres://USER:PASSWORD@HOST:PORT/DATABASE` with the password's special characters percent-encoded. Never logged. TLS: `?sslmode=verify-full` checks the server (with `DATABASE_CA_FILE` when its CA is not a public one), `require` only encrypts; a host other than this machine without `sslmode` logs `database_tls_unset` at boot unless `NODE_ENV` is `development` or `test`. See [TLS to PostgreSQL](postgresql.md#tls-to-postgresql).",
        example: {
          set:
            "postgres://purchase_relay:CHANGE_ME@db.internal:5432/purchase_relay?sslmode=verify-full",
        },
      }),
    ],
  },
  {
    title: "Listening",
    variables: [
      variable({
        name: "HOST",
        field: "host",
        parser: text(
          "an address or host name of this machine; not checked at boot, a bad one fails `listen` (`startup_failed`)",
        ),
        default: "0.0.0.0",
        description:
          "Listen address. The systemd unit sets `127.0.0.1`, for a reverse proxy on the same machine; the environment file overrides it. In a container, leave it unset.",
      }),
      variable({
        name: "PORT",
        field: "port",
        parser: integer(0, 65535),
        default: "8080",
        description: "Listen port. 0 picks a free port, reported in the `listening` line.",
      }),
    ],
  },
  {
    title: "Logs and version",
    variables: [
      variable({
        name: "LOG_LEVEL",
        field: "logLevel",
        parser: oneOf(["debug", "info", "warn", "error"]),
        default: "info",
        description: "Lowest level written; `fatal` is always written.",
      }),
      variable({
        name: "SERVICE_VERSION",
        field: "version",
        parser: serviceVersion,
        default: BUILD_VERSION,
        defaultText: "the build version: stamped by `deno task compile`, `dev` from a checkout",
        description: "Sent as `X-Service-Version`, in `version` body fields and in `listening`.",
        example: { shown: "" },
      }),
    ],
  },
  {
    title: "Database",
    variables: [
      variable({
        name: "DATABASE_POOL_SIZE",
        field: "databasePoolSize",
        parser: integer(1, 1000),
        default: "10",
        description:
          "Database connections per service process for requests; on PostgreSQL each process holds 4 more, 3 for its dispatcher and one listening for the dispatchers' wake-up ([Connections](postgresql.md#connections)). CLI commands use 2 whatever this says.",
      }),
      variable({
        name: "DATABASE_CONNECT_TIMEOUT",
        field: "databaseConnectTimeoutMs",
        parser: duration,
        default: "30s",
        description:
          "How long boot (or a CLI command) waits for the database before giving up with `DATABASE_UNAVAILABLE`.",
      }),
      variable({
        name: "DATABASE_CA_FILE",
        field: "databaseCaFile",
        parser: text("a PEM file path; the URLs must say `sslmode=verify-full`"),
        needs: "DATABASE_URL",
        unset: () => null,
        defaultText: "unset: the CAs the runtime trusts",
        description:
          "CA certificates that replace the runtime's for `sslmode=verify-full`, on `DATABASE_URL` and `DATABASE_LISTEN_URL` (one file: put several CAs in it if the two need different ones). Read at boot. See [TLS to PostgreSQL](postgresql.md#tls-to-postgresql).",
        example: { shown: "/etc/purchase-relay/db-ca.pem" },
      }),
      variable({
        name: "DATABASE_POOLER",
        field: "databasePooler",
        parser: oneOf(["none", "transaction"]),
        needs: "DATABASE_URL",
        default: "none",
        description:
          "`none` for a direct connection or a pooler in session mode; `transaction` when `DATABASE_URL` goes through a pooler in transaction mode (PgBouncer `pool_mode = transaction`, Supavisor port 6543, Neon's `-pooler` host): no named prepared statements, and no `LISTEN` through it. With `none`, a boot that finds such a pooler stops with `POOLER_MODE_MISMATCH`. See [Connection poolers](postgresql.md#connection-poolers).",
      }),
      variable({
        name: "DATABASE_LISTEN_URL",
        field: "databaseListenUrl",
        parser: postgresUrl,
        secret: true,
        needs: "DATABASE_URL",
        unset: () => null,
        defaultText:
          "unset: `LISTEN` through `DATABASE_URL`; with `DATABASE_POOLER=transaction`, polling every 5 s",
        description:
          "A connection of its own for the dispatchers' `LISTEN`, so that `deliveries retry` wakes them at once: PostgreSQL directly, or a pooler in session mode (checked at boot). Never logged.",
        example: {
          shown: "postgres://purchase_relay:CHANGE_ME@db.internal:5432/purchase_relay",
        },
      }),
      variable({
        name: "DATA_DIR",
        field: "dataDir",
        parser: text(
          "a directory path; on the embedded engine at most 86 characters once made absolute",
        ),
        default: "./data",
        description:
          "The embedded database (`DATA_DIR/pglite`), its socket and lock file, and the generated development key. Relative to the working directory. The systemd unit and the image set `/var/lib/purchase-relay`, the only place the compiled executable may write, so leave it there ([Permissions](deploy.md#permissions)); `deno task start` follows any value.",
      }),
    ],
  },
  {
    title: "Rate limit (per tenant, per process)",
    variables: [
      variable({
        name: "RATE_LIMIT_PER_SECOND",
        field: "rateLimitPerSecond",
        parser: positiveNumber,
        default: "100",
        description:
          "Token-bucket refill per tenant, per process. See [Rate limiting](configuration.md#rate-limiting).",
      }),
      variable({
        name: "RATE_LIMIT_BURST",
        field: "rateLimitBurst",
        parser: integer(1, 1e9),
        default: "200",
        description: "Token-bucket capacity per tenant, per process.",
      }),
    ],
  },
  {
    title: "Validation audit",
    variables: [
      variable({
        name: "VALIDATION_AUDIT_ENABLED",
        field: "validationAuditEnabled",
        parser: boolean,
        default: "false",
        description:
          "Records every verify outcome in the `validation_audit` table, in the background. See [Validation audit](configuration.md#validation-audit).",
      }),
      variable({
        name: "VALIDATION_AUDIT_RETENTION_DAYS",
        field: "validationAuditRetentionDays",
        parser: integer(1, 36500),
        unset: () => null,
        defaultText: "unset: audit rows are kept forever",
        description:
          "Days of audit rows to keep; older rows are deleted at boot and daily. While the audit is enabled and this is unset, boot logs `validation_audit_enabled_no_retention`.",
        example: { shown: "90" },
      }),
    ],
  },
  {
    title: "Retention",
    variables: [
      variable({
        name: "EVENT_RETENTION_DAYS",
        field: "eventRetentionDays",
        parser: integer(0, 36500),
        default: "90",
        description:
          "Days a delivered or failed delivery is kept, with its attempts and its event; `0` keeps them forever. Pending deliveries are never deleted. Pruned at boot and every hour, in small batches. Keep at least 31 so that a notification a store sends again is still recognised as a duplicate (a shorter period logs `event_retention_short` at boot). See [Retention](relay.md#retention).",
      }),
    ],
  },
  {
    title: "Store A (Apple App Store)",
    variables: [
      variable({
        name: "STOREA_API_URL_PRODUCTION",
        field: "storeaApiUrlProduction",
        parser: httpUrl,
        default: "https://api.storekit.apple.com",
        description: "App Store Server API, production.",
      }),
      variable({
        name: "STOREA_API_URL_SANDBOX",
        field: "storeaApiUrlSandbox",
        parser: httpUrl,
        default: "https://api.storekit-sandbox.apple.com",
        description: "App Store Server API, sandbox.",
      }),
      variable({
        name: "STOREA_ROOT_CERTS",
        field: "storeaRootCerts",
        parser: list("comma-separated file paths; PEM (one or more certificates) or DER"),
        unset: () => [],
        defaultText: "unset: the built-in Apple Root CA - G3 pin",
        description:
          "Root certificates trusted for signed store A data instead of the pin, for the simulators' test PKI. Read at boot: an unreadable or invalid file stops it (`CONFIG_INVALID`). Leave unset in production (where it logs `storea_root_certs_replace_pin`).",
      }),
      variable({
        name: "STOREA_NOTIFICATION_MAX_AGE",
        field: "storeaNotificationMaxAgeMs",
        parser: duration,
        default: "10d",
        check: (value) => {
          if ((value as number) < 3_600_000) throw new InvalidValue("is shorter than 1h");
        },
        description:
          "How long after Apple signed it (`signedDate`) a notification posted to the receiver is still accepted; older ones get 401 `SIGNATURE_INVALID` and the log line `storea_notification_too_old`, since anyone holding an old genuine notification could post it again. The default covers Apple's retries (five, the last about 6.5 days after the first attempt) with room to spare; keys of events are kept at least this long (see [Retention](relay.md#retention)). Notifications recovered from Apple's history are not subject to it. See [Old notifications](security.md#old-notifications).",
      }),
      variable({
        name: "CRYPTO_ENGINE",
        field: "cryptoEngine",
        parser: oneOf(["auto", "openssl", "webcrypto"]),
        default: "auto",
        defaultText: "`auto`: OpenSSL when it opens, else WebCrypto",
        description:
          "What checks ES256 signatures; see [ES256 engine](configuration.md#es256-engine). `openssl` stops the boot when libcrypto cannot be used (`CRYPTO_ENGINE_UNAVAILABLE`). The `listening` line says which engine runs.",
      }),
      variable({
        name: "UPSTREAM_TIMEOUT",
        field: "upstreamTimeoutMs",
        parser: duration,
        default: "10s",
        description:
          "Deadline of one verification's store calls, retries and the production-then-sandbox fallback included; past it (at most 25 ms later) the client gets 502. Any request still unanswered after 3 x this + 5 s gets 500 (a database that never answers).",
      }),
    ],
  },
  {
    title: "Store B (Google Play)",
    variables: [
      variable({
        name: "STOREB_API_URL",
        field: "storebApiUrl",
        parser: httpUrl,
        default: "https://androidpublisher.googleapis.com",
        description: "Play Developer API.",
      }),
      variable({
        name: "STOREB_TOKEN_URL",
        field: "storebTokenUrl",
        parser: httpUrl,
        default: "https://oauth2.googleapis.com/token",
        description:
          "OAuth token endpoint for service accounts; also the `aud` of the signed assertion.",
      }),
      variable({
        name: "STOREB_OIDC_CERTS_URL",
        field: "storebOidcCertsUrl",
        parser: httpUrl,
        default: "https://www.googleapis.com/oauth2/v3/certs",
        description:
          "Keys (JWKS) of the issuer of store B push tokens, kept for their `Cache-Control: max-age` (clamped to 60 s to 24 h; 1 h without one), and fetched again, at most once per 30 s, when a token names a key not held.",
      }),
      variable({
        name: "STOREB_OIDC_ISSUERS",
        field: "storebOidcIssuers",
        parser: nonEmptyList,
        default: "https://accounts.google.com,accounts.google.com",
        description: "Accepted `iss` values of store B push tokens.",
      }),
    ],
  },
  {
    title: "Recovery of missed notifications",
    variables: [
      variable({
        name: "RECOVERY_INTERVAL",
        field: "recoveryIntervalMs",
        parser: {
          accepts: "duration, or `0` to turn it off",
          parse: (text) => text === "0" ? 0 : duration.parse(text),
        },
        default: "1h",
        description:
          "How often each active tenant is reconciled with the stores' own records, by one replica at a time: store A's notification history (the notifications Apple failed to deliver, in each environment the tenant's setting covers) and store B's voided purchases, from where the last run ended; what the service never received is stored and delivered like a notification. A run costs about one call per store and environment. `0` turns it off; `notifications recover` still works. See [Recovering missed notifications](recovery.md#recovering-missed-notifications).",
      }),
    ],
  },
  {
    title: "Delivery to tenants' callback URLs",
    variables: [
      variable({
        name: "DELIVERY_RETRY_SCHEDULE",
        field: "deliveryRetryScheduleMs",
        parser: durationList,
        default: "30s,2m,10m,1h,6h",
        description:
          "Delays of the automatic retries after the immediate first delivery attempt, each measured from the previous attempt. When the attempt after the last delay fails, the delivery is `failed`. The default makes at most 6 attempts over about 7 h 13 min.",
      }),
      variable({
        name: "DELIVERY_TIMEOUT",
        field: "deliveryTimeoutMs",
        parser: duration,
        default: "10s",
        description:
          "Time limit of one delivery attempt, resolving the callback's host name included (and of `webhook test`). A claimed delivery is leased for twice this plus 5 s. Part of the shutdown drain ([Shutdown](deploy.md#shutdown)): raising it needs a longer `TimeoutStopSec` in the systemd unit.",
      }),
      variable({
        name: "DELIVERY_CONCURRENCY",
        field: "deliveryConcurrency",
        parser: integer(1, 10000),
        default: "64",
        description:
          "Delivery attempts in flight per service process, shared among tenants: slow callbacks need more ([Sizing](deploy.md#sizing)).",
      }),
      variable({
        name: "DELIVERY_TENANT_CONCURRENCY",
        field: "deliveryTenantConcurrency",
        parser: integer(1, 10000),
        default: "8",
        description:
          "Delivery attempts in flight to one tenant's callback, across every replica sharing the database; the tenant's other deliveries wait their turn. One while the callback is failing. See [Delivery scheduling across tenants](relay.md#delivery-scheduling-across-tenants).",
      }),
      variable({
        name: "CALLBACK_ALLOW_HTTP",
        field: "callbackAllowHttp",
        parser: boolean,
        unset: callbackAllowanceDefault,
        defaultText: CALLBACK_ALLOWANCE_DEFAULT,
        description:
          "Allows `http://` callback URLs. Checked by the CLI when a callback URL is set, and again before every delivery attempt. Give the CLI the same value.",
        example: { shown: "false" },
      }),
      variable({
        name: "CALLBACK_ALLOW_PRIVATE_NETWORKS",
        field: "callbackAllowPrivateNetworks",
        parser: boolean,
        unset: callbackAllowanceDefault,
        defaultText: CALLBACK_ALLOWANCE_DEFAULT,
        description:
          "Allows callbacks at localhost and at addresses that are not globally reachable ([Callback safety](security.md#callback-safety)). Checked when a callback URL is set, and before every attempt on the addresses its name resolves to. Give the CLI the same value.",
        example: { shown: "false" },
      }),
      deprecatedVariable({
        name: "CALLBACK_ALLOW_INSECURE",
        parser: boolean,
        unset: () => null,
        defaultText: "unset",
        description:
          "Deprecated: sets both `CALLBACK_ALLOW_HTTP` and `CALLBACK_ALLOW_PRIVATE_NETWORKS`, where they are not set themselves. The boot logs `config_variable_deprecated` while it is set.",
      }),
    ],
  },
  {
    title: "Shutdown",
    variables: [
      variable({
        name: "SHUTDOWN_TIMEOUT",
        field: "shutdownTimeoutMs",
        parser: duration,
        default: "10s",
        description:
          "How long shutdown waits for requests in flight. Part of the shutdown drain ([Shutdown](deploy.md#shutdown)): raising it needs a longer `TimeoutStopSec` in the systemd unit.",
      }),
    ],
  },
] as const satisfies readonly ConfigGroup[];

/** Every variable of {@linkcode CONFIG_GROUPS}, in its order. */
export const CONFIG_VARIABLES: readonly ConfigVariable[] = CONFIG_GROUPS.flatMap(
  (group: ConfigGroup) => group.variables,
);

// Every field of Config is some row's, or the one readConfig fills itself: a field added to
// Config without its row fails `deno task check` here.
type FilledByRows = (typeof CONFIG_GROUPS)[number]["variables"][number]["field"];
type Unfilled = Exclude<keyof Config, FilledByRows | "deprecatedVariables" | "setVariables">;
const _everyFieldHasItsRow: [Unfilled] extends [never] ? true : Unfilled = true;

const VARIABLES_BY_NAME = new Map(CONFIG_VARIABLES.map((row) => [row.name, row]));

/** Reads and validates the configuration from `env` (a plain object, for tests). */
export function readConfig(env: Env): Config {
  const values = new Map<string, unknown>();
  const reading = new Set<string>();
  const valueOf: ValueOf = Object.assign((name: string) => {
    const row = VARIABLES_BY_NAME.get(name);
    if (row === undefined) throw new Error(`${name} is not in the configuration table`);
    if (!values.has(name)) {
      if (reading.has(name)) throw new Error(`${name}: its default depends on itself`);
      reading.add(name);
      values.set(name, readVariable(row, env, valueOf));
    }
    return values.get(name);
  }, { isSet: (name: string) => textOf(env, name) !== undefined });

  const config: Record<string, unknown> = {};
  for (const row of CONFIG_VARIABLES) {
    const value = valueOf(row.name);
    if (row.field !== null) config[row.field] = value;
  }
  const set = CONFIG_VARIABLES.filter((row) => valueOf.isSet(row.name));
  config.deprecatedVariables = set.filter((row) => row.deprecated).map((row) => row.name);
  config.setVariables = set.map((row) => row.name);
  return config as unknown as Config;
}

/**
 * The names of the table's variables. The service may read these and no others
 * (`--allow-env=<names>`, src/process/permissions.ts).
 */
export function configVariables(): string[] {
  return CONFIG_VARIABLES.map((row) => row.name).sort();
}

/**
 * The process's configuration variables, read one by one: a scoped `--allow-env` refuses
 * `Deno.env.toObject()`.
 */
export function readEnvironment(): Env {
  return Object.fromEntries(configVariables().map((name) => [name, Deno.env.get(name)]));
}

/** Decodes `ENCRYPTION_KEY`: standard or URL-safe base64 of exactly 32 bytes. */
export function decodeMasterKey(text: string): Uint8Array {
  return parseVariable(VARIABLES_BY_NAME.get("ENCRYPTION_KEY")!, text) as Uint8Array;
}

/** A variable's trimmed text, or `undefined` when it is unset or empty. */
function textOf(env: Env, name: string): string | undefined {
  const raw = env[name];
  return raw === undefined || raw.trim() === "" ? undefined : raw.trim();
}

function readVariable(row: ConfigVariable, env: Env, valueOf: ValueOf): unknown {
  const text = textOf(env, row.name);
  if (text === undefined) {
    return row.unset === undefined
      ? parseVariable(row, row.default!)
      : refusedAs(row, () => row.unset!(valueOf));
  }
  if (row.needs !== undefined && textOf(env, row.needs) === undefined) {
    throw new ConfigError(row.name, `is set, but ${row.needs} is not`);
  }
  const value = parseVariable(row, text);
  if (row.check !== undefined) refusedAs(row, () => row.check!(value, valueOf));
  return value;
}

function parseVariable(row: ConfigVariable, text: string): unknown {
  return refusedAs(row, () => row.parser.parse(text));
}

/** Runs `read`, naming `row`'s variable in its refusal, without the value of a secret. */
function refusedAs<T>(row: ConfigVariable, read: () => T): T {
  try {
    return read();
  } catch (error) {
    if (!(error instanceof InvalidValue)) throw error;
    throw new ConfigError(row.name, row.secret ? error.reason : error.message);
  }
}
