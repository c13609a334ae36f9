/**
 * The admin CLI (decisions.md 5). Every command prints exactly one JSON object on stdout and
 * exits 0; a failed command or a missing target prints `{"error", "message"}` on stderr and exits
 * 1; bad usage exits 2. Secrets are printed once, when created.
 */
import { parseArgs } from "node:util";
import { createPrivateKey } from "node:crypto";
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import { connectDatabase, type Database } from "../db/connect.ts";
import { migrate } from "../db/migrate.ts";
import { base64url, SecretBox } from "../crypto/secrets.ts";
import { loadMasterKey } from "../master_key.ts";
import { canaryOpens, ensureEncryptionCanary, readEncryptionCanary } from "../db/settings.ts";
import {
  findTenant,
  insertTenant,
  listTenants,
  setTenantActive,
  setTenantCallback,
  type Tenant,
} from "../db/tenants.ts";
import { insertApiKey, listApiKeys, revokeApiKey } from "../db/api_keys.ts";
import {
  describeCredentials,
  saveStoreaCredentials,
  saveStorebCredentials,
  type StoreaEnvironment,
} from "../db/credentials.ts";
import { mintApiKey } from "../auth/api_key.ts";
import { newId } from "../ids.ts";
import { callbackUrlProblem } from "../delivery/callback_url.ts";
import { parseDuration } from "../config.ts";
import {
  type DeliveryStatus,
  findDelivery,
  listDeliveries,
  notifyDispatchers,
  requeueDeliveries,
} from "../delivery/queue.ts";
import { sendDelivery } from "../delivery/sender.ts";
import { serializePayload } from "../delivery/payload.ts";
import { loadDeliveryTarget, rotateWebhookSecret } from "../db/tenants.ts";

/** A command that failed; `code` is printed as `error`. Exit 1. */
export class CommandError extends Error {
  readonly code: string;
  /** More fields for the stderr JSON. */
  readonly details?: Record<string, unknown>;
  constructor(code: string, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = "CommandError";
    this.code = code;
    this.details = details;
  }
}

/** Bad usage: unknown command, missing or malformed arguments. Exit 2. */
export class UsageError extends Error {
  readonly code = "USAGE";
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** What a command needs: configuration, the database and the secret box, opened lazily. */
export interface CliContext {
  config: Config;
  log: Logger;
  /** Opens the database, applying pending migrations; `applied` names those this call ran. */
  open(): Promise<{ db: Database; box: SecretBox; applied: string[] }>;
}

type Command = (args: string[], context: CliContext) => Promise<Record<string, unknown>>;

/** The usage text, printed with a usage error. */
export const USAGE = `usage: purchase-relay <command>
  serve | migrate | version
  tenant create --name NAME [--callback-url URL] [--webhook-secret SECRET]
  tenant list | show ID | deactivate ID | activate ID
  tenant set-callback ID --url URL [--webhook-secret SECRET]
  key create TENANT_ID [--env live|test] [--name NAME]
  key list TENANT_ID | revoke KEY_ID
  storea set-credentials TENANT_ID --bundle-id ID --key-id KID --issuer-id UUID
      --private-key-file PATH [--environment auto|production|sandbox] [--app-id NUMBER]
  storeb set-credentials TENANT_ID --package-name NAME --service-account-file PATH
      --push-audience AUDIENCE [--push-service-account EMAIL]
  tenant rotate-secret ID [--grace DURATION]
  deliveries list [--tenant ID] [--status pending|delivered|failed] [--limit N]
  deliveries show ID
  deliveries retry ID | --tenant ID --status failed [--since TIME]
  webhook test TENANT_ID
  audit lookup TENANT_ID --subject TRANSACTION_ID_OR_TOKEN [--limit N]`;

const COMMANDS: Record<string, Command> = {
  // The audit keeps ids only as keyed hashes; this hashes the given id the same way.
  "audit lookup": async (args, context) => {
    const parsed = parse(args, { subject: { type: "string" }, limit: { type: "string" } });
    const tenantId = onePositional(parsed, "TENANT_ID");
    const subject = required(parsed.values, "subject");
    const limit = Number(parsed.values.limit ?? "100");
    if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
      throw new UsageError("--limit must be an integer from 1 to 10000");
    }
    const { db, box } = await context.open();
    await mustFindTenant(db, tenantId);
    const hash = await box.keyedHash("audit-subject", subject);
    const rows = await db.sql`
      SELECT store, outcome, upstream_status, latency_ms, created_at
      FROM validation_audit
      WHERE tenant_id = ${tenantId} AND subject_hash = ${hash}
      ORDER BY created_at DESC, id DESC
      LIMIT ${limit}`;
    return {
      tenantId,
      subjectHash: hash,
      entries: rows.map((row) => ({
        store: row.store,
        outcome: row.outcome,
        upstreamStatus: row.upstream_status,
        latencyMs: row.latency_ms,
        at: new Date(row.created_at).toISOString(),
      })),
    };
  },
  "version": (args, { config }) => {
    parse(args, {});
    return Promise.resolve({ version: config.version });
  },
  "migrate": async (args, context) => {
    parse(args, {});
    const { db, applied } = await context.open();
    return { applied, engine: db.engine };
  },
  "tenant create": async (args, context) => {
    const { values } = parse(args, {
      name: { type: "string" },
      "callback-url": { type: "string" },
      "webhook-secret": { type: "string" },
    });
    const name = required(values, "name");
    const callbackUrl = optionalCallback(values["callback-url"], context.config);
    if (values["webhook-secret"] !== undefined && callbackUrl === null) {
      throw new UsageError("--webhook-secret needs --callback-url");
    }
    const webhookSecret = callbackUrl === null ? null : webhookSecretFrom(values["webhook-secret"]);
    const { db, box } = await context.open();
    const tenant = await insertTenant(db.sql, box, {
      id: newId("tenant"),
      name,
      callbackUrl,
      webhookSecret,
    });
    const printed: Record<string, unknown> = {
      id: tenant.id,
      name: tenant.name,
      active: tenant.active,
      callbackUrl: tenant.callbackUrl,
    };
    if (webhookSecret !== null) printed.webhookSecret = webhookSecret;
    printed.createdAt = tenant.createdAt;
    return printed;
  },
  "tenant list": async (args, context) => {
    parse(args, {});
    const { db } = await context.open();
    return { tenants: await listTenants(db.sql) };
  },
  "tenant show": async (args, context) => {
    const id = onePositional(parse(args, {}), "ID");
    const { db } = await context.open();
    const tenant = await mustFindTenant(db, id);
    return { ...tenant, ...(await describeCredentials(db.sql, id)) };
  },
  "tenant deactivate": (args, context) => setActive(args, context, false),
  "tenant activate": (args, context) => setActive(args, context, true),
  "tenant set-callback": async (args, context) => {
    const parsed = parse(args, { url: { type: "string" }, "webhook-secret": { type: "string" } });
    const id = onePositional(parsed, "ID");
    const callbackUrl = optionalCallback(required(parsed.values, "url"), context.config)!;
    const { db, box } = await context.open();
    const before = await mustFindTenant(db, id);
    // A tenant without a secret gets one; an existing secret is kept unless a new one is given.
    const given = parsed.values["webhook-secret"];
    const webhookSecret = given !== undefined || !before.hasWebhookSecret
      ? webhookSecretFrom(given)
      : null;
    const tenant = (await setTenantCallback(db.sql, box, id, { callbackUrl, webhookSecret }))!;
    const printed: Record<string, unknown> = { id: tenant.id, callbackUrl: tenant.callbackUrl };
    if (webhookSecret !== null) printed.webhookSecret = webhookSecret;
    printed.updatedAt = tenant.updatedAt;
    return printed;
  },
  "tenant rotate-secret": async (args, context) => {
    const parsed = parse(args, { grace: { type: "string" } });
    const id = onePositional(parsed, "ID");
    const graceMs = parseDuration(parsed.values.grace ?? "24h");
    if (graceMs === null) throw new UsageError("--grace must be a duration such as 30m, 24h or 7d");
    const { db, box } = await context.open();
    mustHaveCallback(await mustFindTenant(db, id));
    const webhookSecret = webhookSecretFrom(undefined);
    const rotated =
      (await rotateWebhookSecret(db.sql, box, id, { secret: webhookSecret, graceMs }))!;
    return {
      id,
      webhookSecret,
      previousSecretValidUntil: rotated.previousSecretExpiresAt,
      updatedAt: rotated.tenant.updatedAt,
    };
  },
  "deliveries list": async (args, context) => {
    const { values } = parse(args, {
      tenant: { type: "string" },
      status: { type: "string" },
      limit: { type: "string" },
    });
    const status = deliveryStatus(values.status);
    const limit = Number(values.limit ?? "50");
    if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
      throw new UsageError("--limit must be an integer from 1 to 10000");
    }
    const { db } = await context.open();
    const deliveries = await listDeliveries(db.sql, {
      tenantId: values.tenant ?? null,
      status,
      limit,
    });
    return { deliveries };
  },
  "deliveries show": async (args, context) => {
    const id = onePositional(parse(args, {}), "ID");
    const { db } = await context.open();
    const delivery = await findDelivery(db.sql, id);
    if (delivery === null) throw new CommandError("DELIVERY_NOT_FOUND", `no delivery ${id}`);
    return { ...delivery };
  },
  // Manual re-delivery: an immediate attempt and a fresh retry schedule. Running services are
  // woken through the database; one that cannot hear it picks the work up at its next sweep.
  "deliveries retry": async (args, context) => {
    const parsed = parse(args, {
      tenant: { type: "string" },
      status: { type: "string" },
      since: { type: "string" },
    });
    const { values, positionals } = parsed;
    const { db } = await context.open();
    if (positionals.length === 1 && values.tenant === undefined) {
      if (values.status !== undefined || values.since !== undefined) {
        throw new UsageError("deliveries retry ID takes no --status or --since");
      }
      const id = positionals[0];
      if (await findDelivery(db.sql, id) === null) {
        throw new CommandError("DELIVERY_NOT_FOUND", `no delivery ${id}`);
      }
      const queued = await requeueDeliveries(db.sql, { id });
      if (queued.length === 0) {
        throw new CommandError("DELIVERY_IN_FLIGHT", `delivery ${id} is being sent right now`);
      }
      await notifyDispatchers(db.sql);
      return { queued };
    }
    if (positionals.length !== 0 || values.tenant === undefined) {
      throw new UsageError("expected a delivery ID, or --tenant ID --status failed [--since TIME]");
    }
    const status = deliveryStatus(required(values, "status"))!;
    let since: Date | null = null;
    if (values.since !== undefined) {
      since = new Date(values.since);
      if (Number.isNaN(since.getTime())) {
        throw new UsageError("--since must be an ISO-8601 time such as 2026-01-31T00:00:00Z");
      }
    }
    await mustFindTenant(db, values.tenant);
    const queued = await requeueDeliveries(db.sql, { tenantId: values.tenant, status, since });
    if (queued.length > 0) await notifyDispatchers(db.sql);
    return { queued };
  },
  // Sends a signed `test` event straight to the callback, exactly as the dispatcher would, and
  // reports the answer. Nothing is stored.
  "webhook test": async (args, context) => {
    const tenantId = onePositional(parse(args, {}), "TENANT_ID");
    const { db, box } = await context.open();
    mustHaveCallback(await mustFindTenant(db, tenantId));
    const target = (await loadDeliveryTarget(db.sql, box, tenantId))!;
    const eventId = newId("evt");
    const payload = serializePayload({
      event: "test",
      reason: null,
      platformEvent: "service.test",
      eventId,
      externalId: eventId,
      timestamp: new Date().toISOString(),
      tenantId,
      source: "service",
      subject: null,
      data: { message: "a test delivery sent by purchase-relay webhook test" },
      raw: {},
    });
    const result = await sendDelivery({
      callbackUrl: target.callbackUrl!,
      payload,
      event: "test",
      eventId,
      secrets: target.secrets,
    }, {
      version: context.config.version,
      timeoutMs: context.config.deliveryTimeoutMs,
      allowInsecure: context.config.callbackAllowInsecure,
    });
    const delivered = result.responseCode !== null && result.responseCode >= 200 &&
      result.responseCode < 300;
    const outcome = {
      tenantId,
      callbackUrl: target.callbackUrl,
      eventId,
      delivered,
      responseCode: result.responseCode,
      responseBody: result.responseBody,
      // Why no answer came: refused target, network error or timeout.
      networkError: result.error,
      durationMs: Math.round(result.durationMs),
    };
    if (!delivered) {
      const why = result.error ?? `the callback answered ${result.responseCode}`;
      throw new CommandError("WEBHOOK_TEST_FAILED", why, outcome);
    }
    return outcome;
  },
  "key create": async (args, context) => {
    const parsed = parse(args, { env: { type: "string" }, name: { type: "string" } });
    const tenantId = onePositional(parsed, "TENANT_ID");
    const env = parsed.values.env ?? "live";
    if (env !== "live" && env !== "test") throw new UsageError("--env must be live or test");
    const { db } = await context.open();
    await mustFindTenant(db, tenantId);
    const minted = mintApiKey(env);
    const record = await insertApiKey(db.sql, {
      id: newId("key"),
      tenantId,
      name: parsed.values.name ?? null,
      env,
      keyHash: minted.hash,
      prefix: minted.prefix,
    });
    return {
      id: record.id,
      tenantId,
      name: record.name,
      env,
      key: minted.token,
      createdAt: record.createdAt,
    };
  },
  "key list": async (args, context) => {
    const tenantId = onePositional(parse(args, {}), "TENANT_ID");
    const { db } = await context.open();
    await mustFindTenant(db, tenantId);
    const keys = await listApiKeys(db.sql, tenantId);
    return { keys: keys.map(({ tenantId: _, ...key }) => key) };
  },
  "key revoke": async (args, context) => {
    const id = onePositional(parse(args, {}), "KEY_ID");
    const { db } = await context.open();
    const record = await revokeApiKey(db.sql, id);
    if (record === null) throw new CommandError("KEY_NOT_FOUND", `no API key ${id}`);
    return { id: record.id, revokedAt: record.revokedAt };
  },
  "storea set-credentials": async (args, context) => {
    const parsed = parse(args, {
      "bundle-id": { type: "string" },
      "key-id": { type: "string" },
      "issuer-id": { type: "string" },
      "private-key-file": { type: "string" },
      environment: { type: "string" },
      "app-id": { type: "string" },
    });
    const tenantId = onePositional(parsed, "TENANT_ID");
    const v = parsed.values;
    const bundleId = required(v, "bundle-id");
    const keyId = required(v, "key-id");
    const issuerId = required(v, "issuer-id");
    const keyFile = required(v, "private-key-file");
    const environment = (v.environment ?? "auto") as StoreaEnvironment;
    if (!["auto", "production", "sandbox"].includes(environment)) {
      throw new UsageError("--environment must be auto, production or sandbox");
    }
    if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(issuerId)) {
      throw new UsageError("--issuer-id must be a UUID");
    }
    if (!/^[A-Za-z0-9]{1,64}$/.test(keyId)) throw new UsageError("--key-id must be alphanumeric");
    let appId: number | null = null;
    if (v["app-id"] !== undefined) {
      if (!/^\d{1,15}$/.test(v["app-id"])) throw new UsageError("--app-id must be a number");
      appId = Number(v["app-id"]);
    }
    const privateKeyPem = await readSecretFile(keyFile);
    checkStoreaKey(privateKeyPem);
    const { db, box } = await context.open();
    await mustFindTenant(db, tenantId);
    await saveStoreaCredentials(db.sql, box, tenantId, {
      bundleId,
      keyId,
      issuerId,
      privateKeyPem,
      environment,
      appId,
    });
    return { tenantId, storea: (await describeCredentials(db.sql, tenantId)).storea };
  },
  "storeb set-credentials": async (args, context) => {
    const parsed = parse(args, {
      "package-name": { type: "string" },
      "service-account-file": { type: "string" },
      "push-audience": { type: "string" },
      "push-service-account": { type: "string" },
    });
    const tenantId = onePositional(parsed, "TENANT_ID");
    const v = parsed.values;
    const packageName = required(v, "package-name");
    const accountFile = required(v, "service-account-file");
    const pushAudience = required(v, "push-audience");
    const pushServiceAccount = v["push-service-account"] ?? null;
    if (pushServiceAccount !== null && !/^[^@\s]+@[^@\s]+$/.test(pushServiceAccount)) {
      throw new UsageError("--push-service-account must be an email address");
    }
    const serviceAccountJson = await readSecretFile(accountFile);
    const clientEmail = checkServiceAccount(serviceAccountJson);
    const { db, box } = await context.open();
    await mustFindTenant(db, tenantId);
    await saveStorebCredentials(db.sql, box, tenantId, {
      packageName,
      clientEmail,
      serviceAccountJson,
      pushAudience,
      pushServiceAccount,
    });
    return { tenantId, storeb: (await describeCredentials(db.sql, tenantId)).storeb };
  },
};

/** Runs one admin command; returns the exit code. */
export async function runCli(argv: string[], context: CliContext): Promise<number> {
  let command: Command | undefined;
  let rest: string[] = [];
  // Own properties only: `constructor` or `toString` must not find Object's methods.
  const pair = `${argv[0]} ${argv[1]}`;
  if (argv.length >= 2 && Object.hasOwn(COMMANDS, pair)) {
    command = COMMANDS[pair];
    rest = argv.slice(2);
  } else if (argv.length >= 1 && Object.hasOwn(COMMANDS, argv[0])) {
    command = COMMANDS[argv[0]];
    rest = argv.slice(1);
  }
  try {
    if (!command) throw new UsageError(`unknown command: ${argv.join(" ") || "(none)"}`);
    const output = await command(rest, context);
    await writeLine(Deno.stdout, output);
    return 0;
  } catch (error) {
    if (error instanceof UsageError) {
      await writeLine(Deno.stderr, { error: error.code, message: error.message, usage: USAGE });
      return 2;
    }
    if (error instanceof CommandError) {
      await writeLine(Deno.stderr, { ...error.details, error: error.code, message: error.message });
      return 1;
    }
    const code = (error as { code?: unknown })?.code;
    await writeLine(Deno.stderr, {
      error: typeof code === "string" && /^[A-Z_]+$/.test(code) ? code : "COMMAND_FAILED",
      message: error instanceof Error ? error.message : String(error),
    });
    return 1;
  }
}

/** Opens the database for a command: migrated, with the encryption canary in place. */
export async function openForCli(config: Config, log: Logger) {
  const box = new SecretBox(await loadMasterKey(config, log));
  const db = await connectDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: 2,
    timeoutMs: config.databaseConnectTimeoutMs,
    shareEmbedded: false,
    // Commands never LISTEN, so they leave DATABASE_LISTEN_URL alone.
    pooler: config.databasePooler,
    caFile: config.databaseCaFile,
  });
  try {
    const applied = await migrate(db.sql);
    await ensureEncryptionCanary(db.sql, box);
    // A wrong key would seal secrets that the service can never open: refuse before any write.
    const canary = await readEncryptionCanary(db.sql);
    if (canary === null || !await canaryOpens(box, canary)) {
      throw new CommandError(
        "ENCRYPTION_KEY_MISMATCH",
        "ENCRYPTION_KEY is not the key this database was set up with; nothing was changed",
      );
    }
    return { db, box, applied };
  } catch (error) {
    await db.close().catch(() => {});
    throw error;
  }
}

type Options = Record<string, { type: "string" | "boolean" }>;
interface Parsed {
  values: Record<string, string | undefined>;
  positionals: string[];
}

function parse(args: string[], options: Options): Parsed {
  try {
    const { values, positionals } = parseArgs({ args, options, allowPositionals: true });
    return { values: values as Record<string, string | undefined>, positionals };
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
}

function required(values: Record<string, string | undefined>, name: string): string {
  const value = values[name];
  if (value === undefined || value.trim() === "") throw new UsageError(`--${name} is required`);
  return value;
}

function onePositional(parsed: Parsed, name: string): string {
  if (parsed.positionals.length !== 1) throw new UsageError(`expected exactly one ${name}`);
  return parsed.positionals[0];
}

function optionalCallback(url: string | undefined, config: Config): string | null {
  if (url === undefined) return null;
  const problem = callbackUrlProblem(url, config.callbackAllowInsecure);
  if (problem !== null) throw new CommandError("INVALID_CALLBACK_URL", `callback URL ${problem}`);
  return url;
}

function webhookSecretFrom(given: string | undefined): string {
  if (given === undefined) return `whsec_${base64url(crypto.getRandomValues(new Uint8Array(32)))}`;
  if (given.length < 32) {
    throw new CommandError("WEAK_WEBHOOK_SECRET", "a webhook secret needs at least 32 characters");
  }
  return given;
}

function deliveryStatus(text: string | undefined): DeliveryStatus | null {
  if (text === undefined) return null;
  if (text !== "pending" && text !== "delivered" && text !== "failed") {
    throw new UsageError("--status must be pending, delivered or failed");
  }
  return text;
}

function mustHaveCallback(tenant: Tenant): void {
  if (tenant.callbackUrl === null) {
    throw new CommandError("NO_CALLBACK_URL", "the tenant has no callback URL; set one first");
  }
}

async function mustFindTenant(db: Database, id: string): Promise<Tenant> {
  const tenant = await findTenant(db.sql, id);
  if (tenant === null) throw new CommandError("TENANT_NOT_FOUND", `no tenant ${id}`);
  return tenant;
}

async function setActive(args: string[], context: CliContext, active: boolean) {
  const id = onePositional(parse(args, {}), "ID");
  const { db } = await context.open();
  const tenant = await setTenantActive(db.sql, id, active);
  if (tenant === null) throw new CommandError("TENANT_NOT_FOUND", `no tenant ${id}`);
  // Its waiting deliveries are due again: wake the running dispatchers.
  if (active) await notifyDispatchers(db.sql);
  return { ...tenant };
}

async function readSecretFile(path: string): Promise<string> {
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    throw new CommandError(
      "FILE_UNREADABLE",
      `cannot read ${path}: ${error instanceof Error ? error.name : "error"}`,
    );
  }
}

/** A store A key file must hold an EC P-256 private key (the .p8 App Store Connect issues). */
function checkStoreaKey(pem: string): void {
  let ok = false;
  try {
    const key = createPrivateKey(pem);
    ok = key.asymmetricKeyType === "ec" && key.asymmetricKeyDetails?.namedCurve === "prime256v1";
  } catch {
    ok = false;
  }
  // Never echo the file: it is a secret.
  if (!ok) {
    throw new CommandError(
      "INVALID_PRIVATE_KEY",
      "the key file does not hold an EC P-256 private key",
    );
  }
}

/** A store B file must be a service_account JSON with client_email and an RSA private_key. */
function checkServiceAccount(text: string): string {
  let account: Record<string, unknown>;
  try {
    account = JSON.parse(text);
  } catch {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the service-account file is not JSON");
  }
  if (account?.type !== "service_account") {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", 'the file\'s "type" is not service_account');
  }
  if (typeof account.client_email !== "string" || !account.client_email.includes("@")) {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the file has no client_email");
  }
  let keyOk = false;
  try {
    keyOk = typeof account.private_key === "string" &&
      createPrivateKey(account.private_key).asymmetricKeyType === "rsa";
  } catch {
    keyOk = false;
  }
  if (!keyOk) {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the file has no RSA private_key");
  }
  return account.client_email;
}

async function writeLine(stream: typeof Deno.stdout, value: unknown): Promise<void> {
  const bytes = new TextEncoder().encode(JSON.stringify(value) + "\n");
  let offset = 0;
  while (offset < bytes.length) offset += await stream.write(bytes.subarray(offset));
}
