/**
 * `purchase-relay serve`: boots the service and runs it until SIGINT or SIGTERM.
 *
 * Boot order: database (bounded wait) -> migrations -> encryption canary -> HTTP. Any failure
 * stops the boot; main.ts logs it as `startup_failed` and exits 1.
 */
import { withDeadline } from "./deadline.ts";
import type { Config } from "./config.ts";
import type { Logger } from "./log.ts";
import { connectDatabase, type Database } from "./db/connect.ts";
import { migrate } from "./db/migrate.ts";
import { NOTIFY_POLL_INTERVAL_MS } from "./db/pooler.ts";
import { SecretBox } from "./crypto/secrets.ts";
import { canaryOpens, ensureEncryptionCanary, readEncryptionCanary } from "./db/settings.ts";
import { loadCredentials, type TenantCredentials } from "./db/credentials.ts";
import { loadMasterKey } from "./master_key.ts";
import { Authenticator } from "./auth/authenticator.ts";
import { RateLimiter } from "./auth/rate_limit.ts";
import { Router } from "./http/router.ts";
import { createRequestHandler, InFlight, internalErrorResponse } from "./http/server.ts";
import { newId } from "./ids.ts";
import { healthRoutes, type ReadinessChecks } from "./api/health.ts";
import { storeaVerifyRoute } from "./api/storea_verify.ts";
import { storebVerifyRoute } from "./api/storeb_verify.ts";
import { TtlCache } from "./cache.ts";
import { StorebVerifier } from "./storeb/verify.ts";
import { readRootCertificates, StoreaJwsVerifier } from "./storea/jws.ts";
import { selectEs256Engine } from "./crypto/es256.ts";
import { StoreaApiClient } from "./storea/api_client.ts";
import { StoreaTokenSigner } from "./storea/api_token.ts";
import { StoreaVerifier } from "./storea/verify.ts";
import { SingleFlight } from "./single_flight.ts";
import { ValidationAudit } from "./audit/validation_audit.ts";
import { findTenant, type Tenant } from "./db/tenants.ts";
import { ingestNotification } from "./events/ingest.ts";
import { Dispatcher } from "./delivery/dispatcher.ts";
import { DELIVERY_QUEUE_CHANNEL } from "./delivery/queue.ts";
import { storeaWebhookRoute } from "./api/storea_webhook.ts";
import { storebWebhookRoute } from "./api/storeb_webhook.ts";
import { PushTokenVerifier } from "./storeb/push_token.ts";

/** How long `/ready` waits for the database before reporting it failed. */
const READY_DB_TIMEOUT_MS = 2_000;
/** Credential and tenant changes reach the verify and receive paths within this time. */
const CREDENTIALS_TTL_MS = 1_000;

/** Runs the service; resolves when it has shut down. */
export async function serve(config: Config, log: Logger): Promise<void> {
  const es256Engine = await selectEs256Engine(config.cryptoEngine);
  // Unreadable roots stop the boot here rather than fail every notification later.
  const storeaJws = new StoreaJwsVerifier({
    rootCertificates: await readRootCertificates(config.storeaRootCerts),
    engine: es256Engine,
  });
  const masterKey = await loadMasterKey(config, log);
  const box = new SecretBox(masterKey);
  const db = await connectDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: config.databasePoolSize,
    timeoutMs: config.databaseConnectTimeoutMs,
    shareEmbedded: true,
    pooler: config.databasePooler,
    listenUrl: config.databaseListenUrl,
    caFile: config.databaseCaFile,
  });
  let server: Deno.HttpServer | undefined;
  let authenticator: Authenticator | undefined;
  let audit: ValidationAudit | null = null;
  let dispatcher: Dispatcher | undefined;
  const sweeps = new AbortController();
  try {
    const applied = await migrate(db.sql);
    if (applied.length > 0) log.info("migrations_applied", { migrations: applied });
    await ensureEncryptionCanary(db.sql, box);

    const readiness = new Readiness(db, box);
    const keyMatches = await readiness.encryptionCheck();
    if (keyMatches !== "ok") log.error("encryption_key_mismatch", { check: keyMatches });
    audit = config.validationAuditEnabled ? await startValidationAudit(db, box, config, log) : null;

    authenticator = new Authenticator(db.sql, {
      onFlushError: (error) => log.warn("key_use_flush_failed", log.errorFields(error)),
    });
    authenticator.start();
    const credentials = new TtlCache<TenantCredentials>(CREDENTIALS_TTL_MS);
    // Receivers look tenants up on every notification; activation takes effect within the TTL.
    const tenants = new TtlCache<Tenant | null>(CREDENTIALS_TTL_MS);
    const credentialsOf = (tenantId: string) =>
      credentials.get(tenantId, () => loadCredentials(db.sql, box, tenantId));
    const verifyDeps = {
      version: config.version,
      authenticator,
      rateLimiter: new RateLimiter({
        perSecond: config.rateLimitPerSecond,
        burst: config.rateLimitBurst,
      }),
      credentialsOf,
      flights: new SingleFlight(),
      audit,
    };
    dispatcher = await startDispatcher(db, box, config, log, sweeps.signal);
    const receiverDeps = {
      log,
      findTenant: (tenantId: string) => tenants.get(tenantId, () => findTenant(db.sql, tenantId)),
      credentialsOf,
      ingest: ingestNotification.bind(null, db.sql),
      onEnqueued: () => dispatcher?.kick(),
    };
    const router = new Router([
      ...healthRoutes({ version: config.version, checkReadiness: () => readiness.check() }),
      storeaVerifyRoute({
        ...verifyDeps,
        storea: new StoreaVerifier({
          client: new StoreaApiClient({
            productionUrl: config.storeaApiUrlProduction,
            sandboxUrl: config.storeaApiUrlSandbox,
            tokens: new StoreaTokenSigner(),
          }),
          jws: storeaJws,
          timeoutMs: config.upstreamTimeoutMs,
        }),
      }),
      storebVerifyRoute({
        ...verifyDeps,
        storeb: new StorebVerifier({
          apiUrl: config.storebApiUrl,
          tokenUrl: config.storebTokenUrl,
          timeoutMs: config.upstreamTimeoutMs,
        }),
      }),
      storeaWebhookRoute({ ...receiverDeps, jws: storeaJws }),
      storebWebhookRoute({
        ...receiverDeps,
        pushTokens: new PushTokenVerifier({
          certsUrl: config.storebOidcCertsUrl,
          issuers: config.storebOidcIssuers,
        }),
      }),
    ]);

    const stopped = Promise.withResolvers<string>();
    const onSignal = (signal: Deno.Signal) => () => stopped.resolve(signal);
    const signals: [Deno.Signal, () => void][] = [
      ["SIGTERM", onSignal("SIGTERM")],
      ["SIGINT", onSignal("SIGINT")],
    ];
    for (const [signal, handler] of signals) Deno.addSignalListener(signal, handler);

    const inFlight = new InFlight();
    const handler = createRequestHandler({
      router,
      version: config.version,
      log,
      inFlight,
      deadlineMs: requestDeadlineMs(config.upstreamTimeoutMs),
    });
    server = Deno.serve({
      port: config.port,
      hostname: config.host,
      onListen: () => {},
      onError: (error) => {
        const reqId = newId("req");
        log.error("request_failed", { reqId, code: "INTERNAL_ERROR", ...log.errorFields(error) });
        return internalErrorResponse(reqId, {
          "x-request-id": reqId,
          "x-service-version": config.version,
        });
      },
    }, handler);
    log.info("listening", {
      port: server.addr.transport === "tcp" ? server.addr.port : config.port,
      host: config.host,
      env: config.env,
      version: config.version,
      database: db.engine,
      cryptoEngine: es256Engine,
    });

    const signal = await stopped.promise;
    for (const [name, handler] of signals) Deno.removeSignalListener(name, handler);
    log.info("shutdown", { signal });
    // Let requests in flight finish, but not forever; then stop accepting and close.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const drained = await Promise.race([
      inFlight.drain().then(() => true),
      new Promise<boolean>((resolve) =>
        timer = setTimeout(() => resolve(false), config.shutdownTimeoutMs)
      ),
    ]);
    clearTimeout(timer);
    if (!drained) log.warn("shutdown_timeout", { timeoutMs: config.shutdownTimeoutMs });
    await server.shutdown();
    server = undefined;
    // Stop claiming; attempts in flight finish (each is bounded by DELIVERY_TIMEOUT).
    sweeps.abort();
    await dispatcher.stop();
  } finally {
    sweeps.abort();
    await dispatcher?.stop().catch(() => {});
    await server?.shutdown().catch(() => {});
    await authenticator?.stop();
    await audit?.stop().catch((error) => log.warn("audit_flush_failed", log.errorFields(error)));
    await db.close().catch((error) => log.warn("database_close_failed", log.errorFields(error)));
    log.flush();
  }
}

/**
 * Starts the validation audit: batched background writes, and with a retention period a prune
 * at boot and then daily (a `Deno.cron` job; every replica may run it, deleting is idempotent).
 */
async function startValidationAudit(
  db: Database,
  box: SecretBox,
  config: Config,
  log: Logger,
): Promise<ValidationAudit> {
  const audit = new ValidationAudit(db.sql, box, {
    onFlushError: (error, dropped) =>
      log.warn("audit_flush_failed", { dropped, ...log.errorFields(error) }),
  });
  audit.start();
  const retentionDays = config.validationAuditRetentionDays;
  if (retentionDays === null) {
    log.warn("validation_audit_enabled_no_retention", {
      hint: "set VALIDATION_AUDIT_RETENTION_DAYS to prune old audit rows",
    });
    return audit;
  }
  const prune = async () => {
    try {
      const deleted = await audit.prune(retentionDays);
      log.info("validation_audit_pruned", { deleted, retentionDays });
    } catch (error) {
      log.warn("validation_audit_prune_failed", log.errorFields(error));
    }
  };
  await prune();
  Deno.cron("validation audit retention", "17 3 * * *", prune);
  return audit;
}

/**
 * Starts this process's dispatcher: a sweep now (deliveries left by a stopped or killed process
 * are due again), then every minute from `Deno.cron`, and whenever an admin command requeues
 * deliveries.
 */
async function startDispatcher(
  db: Database,
  box: SecretBox,
  config: Config,
  log: Logger,
  signal: AbortSignal,
): Promise<Dispatcher> {
  const dispatcher = new Dispatcher({
    sql: db.sql,
    box,
    log,
    version: config.version,
    retryScheduleMs: config.deliveryRetryScheduleMs,
    timeoutMs: config.deliveryTimeoutMs,
    concurrency: config.deliveryConcurrency,
    allowInsecure: config.callbackAllowInsecure,
  });
  await db.listen(DELIVERY_QUEUE_CHANNEL, () => dispatcher.kick());
  if (config.databasePooler === "transaction" && config.databaseListenUrl === null) {
    log.info("delivery_wakeup_polling", {
      intervalMs: NOTIFY_POLL_INTERVAL_MS,
      hint: "set DATABASE_LISTEN_URL to a direct connection for immediate wake-ups",
    });
  }
  dispatcher.kick();
  Deno.cron("delivery retry sweep", "* * * * *", { signal }, () => dispatcher.sweep());
  return dispatcher;
}

/** The `/ready` checks (spec 4.6). */
class Readiness {
  #db: Database;
  #box: SecretBox;
  /** The last encryption verdict, kept for when the database cannot be asked. */
  #encryption = "fail: not checked yet";
  #verdicts = new Map<string, boolean>();

  constructor(db: Database, box: SecretBox) {
    this.#db = db;
    this.#box = box;
  }

  async check(): Promise<ReadinessChecks> {
    try {
      const encryption = await withDeadline(this.encryptionCheck(), READY_DB_TIMEOUT_MS);
      return { db: "ok", encryption };
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      return { db: `fail: ${reason}`, encryption: this.#encryption };
    }
  }

  /** Reads the canary (which also proves the database answers) and opens it with our key. */
  async encryptionCheck(): Promise<string> {
    const sealed = await readEncryptionCanary(this.#db.sql);
    if (sealed === null) {
      this.#encryption = "fail: the database has no encryption canary";
      return this.#encryption;
    }
    let opens = this.#verdicts.get(sealed);
    if (opens === undefined) {
      opens = await canaryOpens(this.#box, sealed);
      this.#verdicts.set(sealed, opens);
    }
    this.#encryption = opens
      ? "ok"
      : "fail: ENCRYPTION_KEY is not the key this database was set up with";
    return this.#encryption;
  }
}

/**
 * How long a request may take before it is answered 500: room for the longest legitimate path
 * (store B: a token fetch, the call, and one retry with a fresh token, each bounded by
 * `UPSTREAM_TIMEOUT`) plus the database, and no more, so an unanswering database cannot hold
 * requests open.
 */
export function requestDeadlineMs(upstreamTimeoutMs: number): number {
  return 3 * upstreamTimeoutMs + 5_000;
}
