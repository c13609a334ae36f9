/**
 * `notifications recover --tenant ID --since TIME [--until TIME] [--store storea|storeb]
 * [--environment production|sandbox] [--all]`: reads the stores' own records of a window, as the
 * scheduled recovery does, and stores and delivers what the service never received
 * (docs/recovery.md, "Recovering missed notifications"). For after an outage, or a window older
 * than the schedule's checkpoints. It prints one line per store: `{tenantId, store, checked,
 * recovered, known, invalid, failedSendAttempts}`.
 * @module
 */
import { ServiceError } from "../errors.ts";
import type { Database } from "../db/connect.ts";
import { loadCredentials, type TenantCredentials } from "../db/credentials.ts";
import { ingestNotification } from "../events/ingest.ts";
import { notifyDispatchers } from "../delivery/queue.ts";
import {
  type NotificationSendAttempt,
  StoreaApiClient,
  type StoreaEnvironmentName,
} from "../storea/api_client.ts";
import { StoreaTokenSigner } from "../storea/api_token.ts";
import { StorebVerifier } from "../storeb/verify.ts";
import { readStoreaHistory } from "../recovery/storea.ts";
import {
  readVoidedPurchases,
  type UnacknowledgedVoid,
  warnUnacknowledgedVoid,
} from "../recovery/storeb.ts";
import {
  addTally,
  DAY_MS,
  dedupHorizonMs,
  earliestStartMs,
  emptyTally,
  latestEndMs,
  PageTokenRefused,
  type RecoveryEnvironment,
  type RecoveryIngest,
  type RecoveryStore,
  type RecoveryTally,
  storeKeepsMs,
} from "../recovery/window.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import { formatValue, outputStyles, writeText } from "./output.ts";
import { payloadVerifier } from "./storea_test_notification.ts";
import { mustFindTenant } from "./inputs.ts";

/** How often a window is read again from its start after the store refused its page token. */
const MAX_RESTARTS = 3;
/** How often, and how long at most each time, a store's 429 is waited out before giving up. */
const MAX_RATE_LIMIT_WAITS = 5;
const MAX_RATE_LIMIT_WAIT_MS = 5 * 60_000;

/** One store's line of output. */
interface StoreLine extends Record<string, unknown> {
  tenantId: string;
  store: RecoveryStore;
  checked: number;
  recovered: number;
  known: number;
  invalid: number;
  failedSendAttempts: Record<string, number>;
}

/** `notifications recover --tenant ID --since TIME [...]` */
export async function recoverNotifications(
  { options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const tenantId = options.tenant!;
  const nowMs = Date.now();
  const sinceMs = timeOption("since", options.since!);
  const untilMs = options.until === undefined ? nowMs : timeOption("until", options.until);
  if (sinceMs >= untilMs) throw new UsageError("--since must be before --until");
  const onlyStore = options.store as RecoveryStore | undefined;
  const environment = options.environment as StoreaEnvironmentName | undefined;
  if (environment !== undefined && onlyStore === "storeb") {
    throw new UsageError("--environment is for store A; store B has one environment");
  }
  const all = options.all === "true";
  const config = context.config;
  const horizonMs = dedupHorizonMs(config.eventRetentionDays, config.storeaNotificationMaxAgeMs);

  const { db, box } = await context.open();
  const tenant = await mustFindTenant(db, tenantId);
  if (!tenant.active) {
    throw new CommandError(
      "TENANT_INACTIVE",
      `tenant ${tenantId} is inactive: its notifications are neither received nor delivered; ` +
        "activate it first",
    );
  }
  const credentials = await loadCredentials(db.sql, box, tenantId);
  const stores = storesToRead(tenantId, credentials, onlyStore);
  // Every window is checked before any store is asked.
  const plans = stores.map((store) => {
    const environments: RecoveryEnvironment[] = store === "storeb"
      ? ["production"]
      : environment !== undefined
      ? [environment]
      : credentials.storea!.environment === "auto"
      ? ["production", "sandbox"]
      : [credentials.storea!.environment as RecoveryEnvironment];
    return {
      store,
      windows: environments.map((env) =>
        windowOf(store, env, { sinceMs, untilMs, nowMs, horizonMs, config })
      ),
    };
  });

  let enqueued = false;
  const ingest: RecoveryIngest = {
    ingest: (notification) => ingestNotification(db.sql, notification),
    onEnqueued: () => enqueued = true,
  };
  // One App Store client and verifier for every window: an `auto` tenant's two environments
  // share the key import and the checked chains.
  let storea: Promise<StoreaRecoveryDeps> | null = null;
  const lines: StoreLine[] = [];
  let failure: { store: RecoveryStore; tally: RecoveryTally; error: unknown } | null = null;
  for (const plan of plans) {
    const tally = emptyTally();
    try {
      for (const window of plan.windows) {
        const part = emptyTally();
        try {
          const at = { ...window, tenantId };
          if (plan.store === "storea") {
            storea ??= storeaRecoveryDeps(context, ingest);
            await readStoreaWindow(await storea, credentials, { ...at, all }, part);
          } else await readStorebWindow(context, db, credentials, at, ingest, part);
        } finally {
          addTally(tally, part);
        }
      }
      lines.push(lineOf(tenantId, plan.store, tally));
    } catch (error) {
      failure = { store: plan.store, tally, error };
      break;
    }
  }
  // The dispatchers of the running services send what was stored, whatever failed after.
  if (enqueued) await notifyDispatchers(db.sql);

  // One line per store: all but the last are written here, the last is the command's output.
  const style = outputStyles(
    { help: false, pretty: Deno.args.includes("--pretty"), json: Deno.args.includes("--json") },
    { stdout: Deno.stdout.isTerminal(), stderr: Deno.stderr.isTerminal() },
  ).stdout;
  const printed = failure === null ? lines.slice(0, -1) : lines;
  for (const line of printed) await writeText(Deno.stdout, formatValue(line, style));
  if (failure !== null) {
    const { error, store, tally } = failure;
    const details = {
      ...lineOf(tenantId, store, tally),
      ...(error instanceof ServiceError && error.details ? { upstream: error.details } : {}),
    };
    if (error instanceof ServiceError) {
      throw new CommandError(error.code, `${store}: ${error.message}`, details);
    }
    throw error;
  }
  return lines.at(-1)!;
}

/** The stores to read: `--store`, or every store the tenant has credentials for. */
function storesToRead(
  tenantId: string,
  credentials: TenantCredentials,
  only: RecoveryStore | undefined,
): RecoveryStore[] {
  const stores = (["storea", "storeb"] as const).filter((store) =>
    (only === undefined || only === store) && credentials[store] !== null
  );
  if (stores.length === 0) {
    throw new CommandError(
      "CREDENTIALS_MISSING",
      `tenant ${tenantId} has no ${only ?? "store"} credentials: nothing to read`,
    );
  }
  return stores;
}

/** A window of one store and environment, within what the store keeps and the service knows. */
function windowOf(
  store: RecoveryStore,
  environment: RecoveryEnvironment,
  times: {
    sinceMs: number;
    untilMs: number;
    nowMs: number;
    horizonMs: number | null;
    config: { eventRetentionDays: number };
  },
): { environment: RecoveryEnvironment; startMs: number; endMs: number } {
  const { sinceMs, untilMs, nowMs, horizonMs } = times;
  const earliest = earliestStartMs(store, environment, nowMs, horizonMs);
  // A few minutes' leeway at the edge: "30 days ago" means what the store still keeps.
  if (sinceMs < earliest - 60 * 60_000) {
    const keptDays = storeKeepsMs(store, environment) / DAY_MS;
    const byService = horizonMs !== null && nowMs - horizonMs > nowMs - keptDays * DAY_MS;
    const what = store === "storea" ? `store A's ${environment} history` : "store B's voided list";
    throw new UsageError(
      byService
        ? `--since may go back ${Math.floor(horizonMs! / DAY_MS)} days, to ${
          new Date(earliest).toISOString()
        }: older notifications may have been delivered and their events deleted since ` +
          `(EVENT_RETENTION_DAYS is ${times.config.eventRetentionDays}); read again, they would ` +
          "be delivered twice"
        : `--since may go back ${keptDays} days for ${what}, to ${
          new Date(earliest).toISOString()
        }: the store keeps no more`,
    );
  }
  const endMs = Math.min(untilMs, latestEndMs(store, nowMs));
  const startMs = Math.max(sinceMs, earliest);
  return { environment, startMs, endMs: Math.max(endMs, startMs) };
}

/** A window to read to its end. */
interface CliWindow {
  tenantId: string;
  environment: RecoveryEnvironment;
  startMs: number;
  endMs: number;
}

/** What reading store A's history needs: the App Store client and verifier, the ingest. */
type StoreaRecoveryDeps = Parameters<typeof readStoreaHistory>[0];

async function storeaRecoveryDeps(
  context: CliContext,
  ingest: RecoveryIngest,
): Promise<StoreaRecoveryDeps> {
  const config = context.config;
  return {
    ...ingest,
    client: new StoreaApiClient({
      productionUrl: config.storeaApiUrlProduction,
      sandboxUrl: config.storeaApiUrlSandbox,
      tokens: new StoreaTokenSigner(),
    }),
    jws: await payloadVerifier(config.storeaRootCerts, config.cryptoEngine),
    timeoutMs: config.upstreamTimeoutMs,
    log: context.log,
    via: "cli",
  };
}

/** Reads a window of store A's history to its end: every notification with `all`. */
async function readStoreaWindow(
  recovery: StoreaRecoveryDeps,
  credentials: TenantCredentials,
  window: CliWindow & { all: boolean },
  tally: RecoveryTally,
): Promise<void> {
  if (window.startMs >= window.endMs) return;
  const failed: NotificationSendAttempt[] = [];
  await toTheEnd((pageToken, afterPage) =>
    readStoreaHistory(
      recovery,
      {
        tenantId: window.tenantId,
        credentials: credentials.storea!,
        environment: window.environment,
        onlyFailures: !window.all,
        startMs: window.startMs,
        endMs: window.endMs,
        pageToken,
        maxPages: Infinity,
        signal: new AbortController().signal,
        afterPage,
      },
      tally,
      failed,
    )
  );
}

/** Reads a window of store B's voided purchases to its end. */
async function readStorebWindow(
  context: CliContext,
  db: Database,
  credentials: TenantCredentials,
  window: CliWindow,
  ingest: RecoveryIngest,
  tally: RecoveryTally,
): Promise<void> {
  if (window.startMs >= window.endMs) return;
  const config = context.config;
  const recovery = {
    ...ingest,
    storeb: new StorebVerifier({
      apiUrl: config.storebApiUrl,
      tokenUrl: config.storebTokenUrl,
      timeoutMs: config.upstreamTimeoutMs,
    }),
    sql: db.sql,
    timeoutMs: config.upstreamTimeoutMs,
    log: context.log,
    via: "cli" as const,
  };
  // Reported by the log line as it is found; the schedule remembers which it reported.
  const unacknowledged: UnacknowledgedVoid[] = [];
  await toTheEnd((pageToken, afterPage) =>
    readVoidedPurchases(
      recovery,
      {
        tenantId: window.tenantId,
        credentials: credentials.storeb!,
        startMs: window.startMs,
        endMs: window.endMs,
        pageToken,
        maxPages: Infinity,
        signal: new AbortController().signal,
        afterPage,
      },
      tally,
      unacknowledged,
    )
  );
  for (const voided of unacknowledged) {
    warnUnacknowledgedVoid(context.log, window.tenantId, voided);
  }
}

/**
 * Runs `read` from the first page to the last: again from the page it reached after a 429 (once
 * the store's wait is over) and from the first page when the store refuses a page token.
 */
async function toTheEnd(
  read: (
    pageToken: string | null,
    afterPage: (next: string | null) => Promise<void>,
  ) => Promise<unknown>,
): Promise<void> {
  let pageToken: string | null = null;
  let restarts = 0;
  let waits = 0;
  while (true) {
    try {
      await read(pageToken, (next) => {
        pageToken = next;
        return Promise.resolve();
      });
      return;
    } catch (error) {
      if (error instanceof PageTokenRefused && restarts < MAX_RESTARTS) {
        restarts++;
        pageToken = null;
        continue;
      }
      const waitMs = rateLimitWaitMs(error);
      if (waitMs !== null && waits < MAX_RATE_LIMIT_WAITS) {
        waits++;
        await new Promise((resolve) => setTimeout(resolve, waitMs));
        continue;
      }
      throw error;
    }
  }
}

/** How long a store's 429 asks to wait, if it is one and the wait is reasonable. */
function rateLimitWaitMs(error: unknown): number | null {
  if (!(error instanceof ServiceError) || error.code !== "RATE_LIMITED") return null;
  const ms = Number(error.details?.retryAfterSeconds ?? 0) * 1000;
  return ms <= MAX_RATE_LIMIT_WAIT_MS ? Math.max(ms, 1000) : null;
}

function lineOf(tenantId: string, store: RecoveryStore, tally: RecoveryTally): StoreLine {
  return {
    tenantId,
    store,
    checked: tally.checked,
    recovered: tally.recovered,
    known: tally.known,
    invalid: tally.invalid,
    failedSendAttempts: store === "storea" ? tally.failedSendAttempts : {},
  };
}

/** An ISO-8601 time option, in epoch milliseconds. */
function timeOption(name: string, text: string): number {
  const ms = /^\d{4}-\d\d-\d\d/.test(text) ? new Date(text).getTime() : NaN;
  if (Number.isNaN(ms)) {
    throw new UsageError(`--${name} must be an ISO-8601 time such as 2026-01-31T00:00:00Z`);
  }
  return ms;
}
