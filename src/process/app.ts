/**
 * The composition root: builds the service from its configuration (the database, the store
 * verifiers, the dispatcher, the routes) and returns it ready to serve, with one ordered
 * teardown. Process concerns (signals, the listening socket, exit codes) are src/process/serve.ts's.
 *
 * Boot order: database (bounded wait) -> migrations -> encryption canary -> the rest. Any failure
 * stops the boot; what was already started is torn down, newest first.
 */
import { type Config, ConfigError } from "../config.ts";
import type { Logger } from "../observability/log.ts";
import { connectDatabase, type Database } from "../db/connect.ts";
import { migrate } from "../db/migrate.ts";
import { NOTIFY_POLL_INTERVAL_MS } from "../db/pooler.ts";
import { SecretBox } from "../crypto/secrets.ts";
import { auditHashKey, ensureEncryptionCanary } from "../db/settings.ts";
import { loadCredentials, tenantsWithoutPushServiceAccount } from "../db/credentials.ts";
import { findTenants } from "../db/tenants.ts";
import { loadMasterKey } from "../crypto/master_key.ts";
import { Authenticator } from "../auth/authenticator.ts";
import { RateLimiter } from "../auth/rate_limit.ts";
import { Router } from "../http/router.ts";
import { createRequestHandler, InFlight } from "../http/server.ts";
import { apiRoutes } from "../api/mod.ts";
import { Readiness } from "../api/readiness.ts";
import { loadEach, LookupCache } from "../lib/cache.ts";
import { type Es256Engine, selectEs256Engine } from "../crypto/es256.ts";
import { readRootCertificates, StoreaJwsVerifier } from "../storea/jws.ts";
import { StoreaApiClient } from "../storea/api_client.ts";
import { StoreaTokenSigner } from "../storea/api_token.ts";
import { StoreaVerifier } from "../storea/verify.ts";
import { StorebVerifier } from "../storeb/verify.ts";
import { PushTokenVerifier } from "../storeb/push_token.ts";
import { SingleFlight } from "../lib/single_flight.ts";
import { pruneValidationAudit, ValidationAudit } from "../audit/validation_audit.ts";
import { SubjectHasher } from "../audit/subject_hash.ts";
import { eventKeyDays, pruneRelayHistory } from "../retention/relay_history.ts";
import { PruneJob } from "../retention/job.ts";
import { maintainEmbedded, MAINTENANCE_INTERVAL_MS } from "../db/embedded/maintenance.ts";
import { EMBEDDED_INGEST_IN_FLIGHT, IngestBatcher } from "../events/ingest_batch.ts";
import { type DeliveryStateSource, Dispatcher } from "../delivery/dispatcher.ts";
import { StorebStateSource } from "../events/state.ts";
import { callbackPolicyOf, logCallbackPolicy } from "../delivery/callback_policy.ts";
import { remoteHostWithoutTls } from "../db/postgres_tls.ts";
import { countBacklog, DELIVERY_QUEUE_CHANNEL } from "../delivery/queue.ts";
import {
  observeBacklog,
  recordCacheLookup,
  redactRuntimeUrls,
} from "../observability/telemetry.ts";
import { RecoveryJob } from "../recovery/job.ts";
import { dedupHorizonMs } from "../recovery/window.ts";

/** Credential and tenant changes reach the verify and receive paths within this time. */
const CREDENTIALS_TTL_MS = 1_000;
/** How long the backlog gauge reuses its count: at most one count query per period. */
const BACKLOG_MAX_AGE_MS = 15_000;

/** The service, built and running its background work, but not yet listening. */
export interface App extends AsyncDisposable {
  /** Answers every HTTP request: the pipeline around the route table. */
  handler: (request: Request) => Response | Promise<Response>;
  /** Requests being answered, for a graceful shutdown. */
  inFlight: InFlight;
  readiness: Readiness;
  database: Database["engine"];
  cryptoEngine: Es256Engine;
  /**
   * Stops the background work (delivery claims, retries, audit and key-use flushes) and closes
   * the database, newest first. Call once no request is in flight.
   */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Builds the service from `config`. */
export async function createApp(config: Config, log: Logger): Promise<App> {
  await using stack = new AsyncDisposableStack();
  stack.defer(() => log.flush());

  const cryptoEngine = await selectEs256Engine(config.cryptoEngine);
  const storeaJws = new StoreaJwsVerifier({
    rootCertificates: await storeaRootCertificates(config, log),
    engine: cryptoEngine,
  });
  const box = new SecretBox(await loadMasterKey(config, log), config.encryptionKeyPrevious);
  warnAboutPlainDatabaseConnection(config, log);
  const db = await connectDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: config.databasePoolSize,
    // The dispatcher's claims and records do not queue behind the receivers' statements
    // (docs/postgresql.md, "Connections").
    dispatchPoolSize: DISPATCH_POOL_SIZE,
    timeoutMs: config.databaseConnectTimeoutMs,
    shareEmbedded: true,
    pooler: config.databasePooler,
    listenUrl: config.databaseListenUrl,
    caFile: config.databaseCaFile,
  });
  stack.defer(() =>
    db.close().catch((error) => log.warn("database_close_failed", log.errorFields(error)))
  );

  const applied = await migrate(db.sql, undefined, {
    onLockTimeout: (attempt, pauseMs) =>
      log.warn("migration_lock_timeout", { attempt, retryInMs: pauseMs }),
  });
  if (applied.length > 0) log.info("migrations_applied", { migrations: applied });
  await ensureEncryptionCanary(db.sql, box);
  const readiness = new Readiness(db, box, log);
  const keyMatches = await readiness.encryptionCheck();
  if (keyMatches !== "ok") log.error("encryption_key_mismatch", { check: keyMatches });
  if (box.previous !== null) {
    log.info("encryption_key_previous_set", {
      keyId: box.keyId,
      previousKeyId: box.previous.keyId,
      canaryOpensWith: readiness.canaryOpensWith,
      hint: "once every replica has this configuration, run encryption rotate-key; then remove " +
        'ENCRYPTION_KEY_PREVIOUS (docs/maintenance.md, "Rotating ENCRYPTION_KEY")',
    });
  }
  await warnAboutTenantsWithoutPushAccount(db, log);

  const audit = config.validationAuditEnabled
    ? startValidationAudit(db, box, config, log, stack)
    : null;
  if (audit !== null) {
    stack.defer(() =>
      audit.stop().catch((error) => log.warn("audit_flush_failed", log.errorFields(error)))
    );
  }
  const authenticator = new Authenticator(db.sql, {
    onFlushError: (error) => log.warn("key_use_flush_failed", log.errorFields(error)),
  });
  authenticator.start();
  stack.defer(() => authenticator.stop());
  const credentials = new LookupCache(loadEach((id) => loadCredentials(db.sql, box, id)), {
    ttlMs: CREDENTIALS_TTL_MS,
    onLookup: (hit) => recordCacheLookup("credentials", hit),
  });
  const credentialsOf = async (tenantId: string) => (await credentials.get(tenantId))!;
  // One client per store, shared by the API, the deliveries' state and the recovery.
  const storeaClient = new StoreaApiClient({
    productionUrl: config.storeaApiUrlProduction,
    sandboxUrl: config.storeaApiUrlSandbox,
    tokens: new StoreaTokenSigner(),
  });
  const storea = new StoreaVerifier({
    client: storeaClient,
    jws: storeaJws,
    timeoutMs: config.upstreamTimeoutMs,
  });
  const storeb = new StorebVerifier({
    apiUrl: config.storebApiUrl,
    tokenUrl: config.storebTokenUrl,
    timeoutMs: config.upstreamTimeoutMs,
  });
  const dispatcher = await startDispatcher(db, box, config, log, stack, {
    stateSource: new StorebStateSource({
      storeb,
      credentialsOf,
      // Within the attempt's lease (twice DELIVERY_TIMEOUT and more): the fetch, then the POST.
      timeoutMs: Math.min(config.upstreamTimeoutMs, config.deliveryTimeoutMs),
    }),
  });
  // Receivers share group commits: many notifications per transaction (docs/architecture.md,
  // "Group-commit ingest"), handing new deliveries to the dispatcher when it has room.
  const ingestBatcher = new IngestBatcher(db.sql, {
    handOver: dispatcher.handOver,
    ...(db.engine === "embedded" ? { maxInFlight: EMBEDDED_INGEST_IN_FLIGHT } : {}),
  });
  // The notifications the stores failed to deliver, read back from their own records
  // (docs/recovery.md, "Recovering missed notifications"); stopped before the dispatcher.
  if (config.recoveryIntervalMs > 0) {
    const recovery = new RecoveryJob({
      sql: db.sql,
      log,
      intervalMs: config.recoveryIntervalMs,
      storea: { client: storeaClient, jws: storeaJws },
      storeb,
      credentialsOf,
      upstreamTimeoutMs: config.upstreamTimeoutMs,
      dedupHorizonMs: dedupHorizonMs(config.eventRetentionDays, config.storeaNotificationMaxAgeMs),
      ingest: (notification) => ingestBatcher.ingest(notification),
      onEnqueued: () => dispatcher.kick(),
    });
    recovery.start();
    stack.defer(() => recovery.stop());
  }
  startEventRetention(db, config, log, stack);
  if (db.engine === "embedded") startEmbeddedMaintenance(db, log, stack);

  // Receivers look up the tenant named in the URL, which anyone can make up: a LookupCache
  // (src/lib/cache.ts) keeps unknown ids from evicting real tenants or costing a query each.
  // Activation takes effect within the TTL.
  const tenants = new LookupCache((ids) => findTenants(db.sql, ids), {
    ttlMs: CREDENTIALS_TTL_MS,
    onLookup: (hit) => recordCacheLookup("tenants", hit),
  });
  const router = new Router(apiRoutes({
    version: config.version,
    log,
    checkReadiness: () => readiness.check(),
    authenticator,
    rateLimiter: new RateLimiter({
      perSecond: config.rateLimitPerSecond,
      burst: config.rateLimitBurst,
    }),
    credentialsOf,
    flights: new SingleFlight(),
    audit,
    storea,
    storeb,
    jws: storeaJws,
    storeaNotificationMaxAgeMs: config.storeaNotificationMaxAgeMs,
    pushTokens: new PushTokenVerifier({
      certsUrl: config.storebOidcCertsUrl,
      issuers: config.storebOidcIssuers,
    }),
    findTenant: (tenantId) => tenants.get(tenantId),
    ingest: (notification) => ingestBatcher.ingest(notification),
    onEnqueued: () => dispatcher.kick(),
  }));
  // Deno's spans keep the URL path only for the service's own routes (src/observability/telemetry.ts).
  redactRuntimeUrls((path) => router.match("GET", path).kind !== "not_found");
  const inFlight = new InFlight();
  const handler = createRequestHandler({
    router,
    version: config.version,
    log,
    inFlight,
    deadlineMs: requestDeadlineMs(config.upstreamTimeoutMs),
  });

  const teardown = stack.move();
  return {
    handler,
    inFlight,
    readiness,
    database: db.engine,
    cryptoEngine,
    [Symbol.asyncDispose]: () => teardown.disposeAsync(),
  };
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

/**
 * The roots of `STOREA_ROOT_CERTS`, which replace the Apple root pin: worth a warning at every
 * boot in production. Unreadable roots stop the boot here, naming the variable, rather than fail
 * every notification later.
 */
async function storeaRootCertificates(config: Config, log: Logger): Promise<Uint8Array[]> {
  if (config.storeaRootCerts.length === 0) return [];
  let roots: Uint8Array[];
  try {
    roots = await readRootCertificates(config.storeaRootCerts);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new ConfigError("STOREA_ROOT_CERTS", `cannot be used: ${reason}`);
  }
  if (config.env === "production") {
    log.warn("storea_root_certs_replace_pin", {
      paths: config.storeaRootCerts,
      hint: "signed store A data is trusted up to these roots instead of Apple Root CA - G3; " +
        "unset STOREA_ROOT_CERTS in production",
    });
  }
  return roots;
}

/**
 * A `DATABASE_URL` to another machine with no `sslmode`: worth a warning at each boot, except
 * where development or test was asked for (docs/postgresql.md, "TLS to PostgreSQL").
 */
function warnAboutPlainDatabaseConnection(config: Config, log: Logger): void {
  if (config.setVariables.includes("NODE_ENV") && config.env !== "production") return;
  const host = remoteHostWithoutTls(config.databaseUrl);
  if (host === null) return;
  log.warn("database_tls_unset", {
    host,
    hint: "DATABASE_URL has no sslmode: add ?sslmode=verify-full (with DATABASE_CA_FILE for a " +
      "private CA), or sslmode=disable to say the network is trusted",
  });
}

/** Their store B notifications are refused (docs/configuration.md, "Store B (Google Play)"). */
async function warnAboutTenantsWithoutPushAccount(db: Database, log: Logger): Promise<void> {
  const withoutPushAccount = await tenantsWithoutPushServiceAccount(db.sql);
  if (withoutPushAccount.count > 0) {
    log.warn("tenants_without_push_service_account", {
      ...withoutPushAccount,
      hint: "run storeb set-credentials again with --push-service-account for each",
    });
  }
}

/**
 * Starts the validation audit: batched background writes, and with a retention period a prune
 * at boot, in the background, and then daily (src/retention/job.ts).
 */
function startValidationAudit(
  db: Database,
  box: SecretBox,
  config: Config,
  log: Logger,
  stack: AsyncDisposableStack,
): ValidationAudit {
  const hasher = new SubjectHasher(() => auditHashKey(db.sql, box));
  const audit = new ValidationAudit(db.sql, hasher, {
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
  const prune = new PruneJob("validation audit retention", "17 3 * * *", async (signal) => {
    try {
      const { deleted, complete } = await pruneValidationAudit(db.sql, retentionDays, { signal });
      log.info("validation_audit_pruned", { deleted, retentionDays, complete });
    } catch (error) {
      log.warn("validation_audit_prune_failed", log.errorFields(error));
    }
  });
  prune.start();
  stack.defer(() => prune.stop());
  return audit;
}

/**
 * Starts the retention of events, deliveries and attempts (`EVENT_RETENTION_DAYS`, unless 0): a
 * prune at boot, in the background, then every hour, so that each run has about an hour's worth
 * to delete (docs/relay.md, "Retention").
 */
function startEventRetention(
  db: Database,
  config: Config,
  log: Logger,
  stack: AsyncDisposableStack,
): void {
  const retentionDays = config.eventRetentionDays;
  if (retentionDays === 0) return;
  const keyDays = eventKeyDays(config.storeaNotificationMaxAgeMs);
  const job = new PruneJob("event retention", "41 * * * *", async (signal) => {
    const started = performance.now();
    try {
      const pruned = await pruneRelayHistory(db.sql, retentionDays, { signal, keyDays });
      log.info("event_retention_pruned", {
        ...pruned,
        retentionDays,
        durationMs: Math.round(performance.now() - started),
      });
    } catch (error) {
      log.warn("event_retention_failed", log.errorFields(error));
    }
  });
  job.start();
  stack.defer(() => job.stop());
}

/**
 * Vacuums and analyzes the embedded engine, which has no autovacuum (src/db/embedded/maintenance.ts),
 * every {@linkcode MAINTENANCE_INTERVAL_MS}.
 */
function startEmbeddedMaintenance(db: Database, log: Logger, stack: AsyncDisposableStack): void {
  const every = { everyMs: MAINTENANCE_INTERVAL_MS };
  const job = new PruneJob("embedded engine vacuum", every, async (signal) => {
    const started = performance.now();
    try {
      const run = await maintainEmbedded(db.sql, signal);
      if (run.vacuumed.length + run.analyzed.length === 0 && !run.checkpointed) return;
      log.info("embedded_vacuumed", {
        ...run,
        durationMs: Math.round(performance.now() - started),
      });
    } catch (error) {
      log.warn("embedded_vacuum_failed", log.errorFields(error));
    }
  });
  // Not at boot: the engine's statistics start empty, so only the transaction-id age check could
  // find work, and the check's catalog query would hold the engine while the service starts.
  job.schedule();
  stack.defer(() => job.stop());
}

/** Connections of the dispatcher's own pool, besides `DATABASE_POOL_SIZE`. */
const DISPATCH_POOL_SIZE = 3;

/**
 * Starts this process's dispatcher: a sweep now (deliveries left by a stopped or killed process
 * are due again), then every minute from `Deno.cron`, and whenever an admin command requeues
 * deliveries. Its teardown (stop claiming, wait for attempts in flight) goes on `stack`.
 */
async function startDispatcher(
  db: Database,
  box: SecretBox,
  config: Config,
  log: Logger,
  stack: AsyncDisposableStack,
  options: { stateSource: DeliveryStateSource },
): Promise<Dispatcher> {
  logCallbackPolicy(config, log);
  const dispatcher = new Dispatcher({
    sql: db.dispatchSql,
    box,
    log,
    version: config.version,
    retryScheduleMs: config.deliveryRetryScheduleMs,
    timeoutMs: config.deliveryTimeoutMs,
    concurrency: config.deliveryConcurrency,
    tenantConcurrency: config.deliveryTenantConcurrency,
    callbackPolicy: callbackPolicyOf(config),
    stateSource: options.stateSource,
  });
  stack.defer(() => dispatcher.stop());
  stack.defer(observeBacklog(() => countBacklog(db.sql), BACKLOG_MAX_AGE_MS));
  const sweeps = new AbortController();
  stack.defer(() => sweeps.abort());
  await db.listen(DELIVERY_QUEUE_CHANNEL, () => dispatcher.kick());
  if (config.databasePooler === "transaction" && config.databaseListenUrl === null) {
    log.info("delivery_wakeup_polling", {
      intervalMs: NOTIFY_POLL_INTERVAL_MS,
      hint: "set DATABASE_LISTEN_URL to a direct connection for immediate wake-ups",
    });
  }
  dispatcher.kick();
  Deno.cron(
    "delivery retry sweep",
    "* * * * *",
    { signal: sweeps.signal },
    () => dispatcher.sweep(),
  );
  return dispatcher;
}
