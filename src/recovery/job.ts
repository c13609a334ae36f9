/**
 * The scheduled recovery of missed notifications (docs/recovery.md, "Recovering missed
 * notifications"): every `RECOVERY_INTERVAL`, each active tenant is reconciled with the stores'
 * own records, store A in each environment its setting covers and store B once, from its
 * checkpoint (minus an overlap), by one replica at a time (a lease on the checkpoint).
 *
 * - Automatic runs ask Apple only for what it failed to deliver (`onlyFailures`): what Apple
 *   delivered, the receiver stored before answering 200, so the rest would cost a call per 20
 *   notifications to find nothing. `notifications recover --all` reads everything.
 * - A run reads at most {@linkcode MAX_PAGES_PER_RUN} pages; a longer window goes on from its page
 *   token at the next run, soon after.
 * - A store's 429 postpones the tenant's next run to its `Retry-After`; another failure backs off
 *   from `RECOVERY_INTERVAL` upwards. Neither touches other tenants.
 * - A tenant's checkpoints are first due one interval after its credentials were set (or this
 *   version first ran); that first run looks back 3 days. A checkpoint due while no replica ran
 *   (after an outage) is read at boot.
 * - Nothing here holds boot or the receivers: it starts after boot, reads one checkpoint at a
 *   time, and its timers do not keep the process alive; stopping cancels the call in flight.
 */
import type { Sql } from "../db/connect.ts";
import type { TenantCredentials } from "../db/credentials.ts";
import { errorCode, RelayError, ServiceError } from "../errors.ts";
import type { Logger } from "../observability/log.ts";
import { ulidFactory } from "../lib/ids.ts";
import type { NotificationSendAttempt, StoreaApiClient } from "../storea/api_client.ts";
import type { StoreaJwsVerifier } from "../storea/jws.ts";
import type { StorebVerifier } from "../storeb/verify.ts";
import { recordStoreSendFailures } from "../observability/telemetry.ts";
import {
  type Checkpoint,
  claimCheckpoint,
  ensureCheckpoints,
  failRun,
  finishRun,
  releaseLease,
  saveProgress,
} from "./checkpoints.ts";
import { readStoreaHistory } from "./storea.ts";
import { readVoidedPurchases, type UnacknowledgedVoid, warnUnacknowledgedVoid } from "./storeb.ts";
import {
  DAY_MS,
  earliestStartMs,
  emptyTally,
  FIRST_LOOKBACK_MS,
  latestEndMs,
  OVERLAP_MS,
  PageTokenRefused,
  type RecoveryIngest,
  type RecoveryTally,
} from "./window.ts";

/** The most pages one run reads of one tenant's store and environment. */
export const MAX_PAGES_PER_RUN = 20;
/** A window left unfinished goes on this soon (or at the interval, when that is sooner). */
const CONTINUE_AFTER_MS = 60_000;
/** How often a replica looks for due checkpoints, at most. */
const MAX_TICK_MS = 60_000;
/** The first look, after boot. */
const FIRST_TICK_MS = 1_000;
/** Runs one tick makes at most, before it lets the next tick (and other replicas) go on. */
const MAX_RUNS_PER_TICK = 100;
/** The longest backoff after failures in a row. */
const MAX_BACKOFF_MS = DAY_MS;

/** What the job needs. */
export interface RecoveryJobOptions extends RecoveryIngest {
  sql: Sql;
  log: Logger;
  /** `RECOVERY_INTERVAL`, above 0. */
  intervalMs: number;
  /** The service's store A client and verifier of Apple's signatures. */
  storea: { client: StoreaApiClient; jws: StoreaJwsVerifier };
  /** The service's store B client (its token cache). */
  storeb: StorebVerifier;
  credentialsOf: (tenantId: string) => Promise<TenantCredentials>;
  /** One store call's deadline (`UPSTREAM_TIMEOUT`). */
  upstreamTimeoutMs: number;
  /** How far back the service remembers notifications; null: forever. */
  dedupHorizonMs: number | null;
  /** The most pages per run (tests); default {@linkcode MAX_PAGES_PER_RUN}. */
  maxPagesPerRun?: number;
}

/** The recovery of one process; every replica runs one, and the leases share the work. */
export class RecoveryJob {
  /** This process, as the checkpoints' leases name it. */
  readonly owner = `recovery_${ulidFactory()()}`;
  #options: RecoveryJobOptions;
  #stop = new AbortController();
  #timer: ReturnType<typeof setTimeout> | null = null;
  #ticking: Promise<void> | null = null;

  constructor(options: RecoveryJobOptions) {
    this.#options = options;
  }

  /** How long a run may go without showing it is alive: a page's calls and what it stores. */
  get #leaseMs(): number {
    return Math.max(5 * 60_000, 4 * this.#options.upstreamTimeoutMs);
  }

  /** Starts looking for due checkpoints, first shortly after boot. */
  start(): void {
    this.#schedule(Math.min(FIRST_TICK_MS, this.#options.intervalMs));
  }

  /** Cancels the schedule and the call in flight, and waits for the run to give its lease back. */
  async stop(): Promise<void> {
    this.#stop.abort();
    if (this.#timer !== null) clearTimeout(this.#timer);
    await this.#ticking;
  }

  #schedule(delayMs: number): void {
    if (this.#stop.signal.aborted) return;
    const timer = setTimeout(() => {
      this.#timer = null;
      this.#ticking = this.#tick().finally(() => {
        this.#ticking = null;
        this.#schedule(Math.min(this.#options.intervalMs, MAX_TICK_MS));
      });
    }, delayMs);
    // Waiting for the next look never keeps the process alive.
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }

  /** Runs the due checkpoints one after another, as long as some are due. */
  async #tick(): Promise<void> {
    const { sql, log } = this.#options;
    try {
      await ensureCheckpoints(sql, this.#options.intervalMs);
      for (let runs = 0; runs < MAX_RUNS_PER_TICK; runs++) {
        if (this.#stop.signal.aborted) return;
        const checkpoint = await claimCheckpoint(sql, this.owner, this.#leaseMs);
        if (checkpoint === null) return;
        await this.#run(checkpoint);
      }
    } catch (error) {
      if (this.#stop.signal.aborted) return;
      // The database, most likely: the next tick tries again.
      log.warn("recovery_tick_failed", log.errorFields(error));
    }
  }

  /** One run of one claimed checkpoint: read, store, report, schedule the next. */
  async #run(checkpoint: Checkpoint): Promise<void> {
    const { sql, log, intervalMs } = this.#options;
    const { tenantId, store, environment } = checkpoint;
    const started = performance.now();
    const tally = emptyTally();
    const failedAttempts: NotificationSendAttempt[] = [];
    const unacknowledged: UnacknowledgedVoid[] = [];
    const nowMs = Date.now();
    const earliest = earliestStartMs(store, environment, nowMs, this.#options.dedupHorizonMs);
    // Go on with a window left unfinished, unless the store has dropped its start meanwhile.
    const unfinished = checkpoint.unfinished !== null && checkpoint.unfinished.startMs >= earliest
      ? checkpoint.unfinished
      : null;
    const startMs = unfinished?.startMs ??
      Math.max(
        earliest,
        checkpoint.checkedUntil === null
          ? nowMs - FIRST_LOOKBACK_MS
          : checkpoint.checkedUntil - OVERLAP_MS,
      );
    const endMs = unfinished?.endMs ?? latestEndMs(store, nowMs);
    const window = {
      tenantId,
      startMs,
      endMs,
      pageToken: unfinished?.pageToken ?? null,
      maxPages: this.#options.maxPagesPerRun ?? MAX_PAGES_PER_RUN,
      signal: this.#stop.signal,
      afterPage: async (pageToken: string | null) => {
        // The window's end: finishRun below records it with the rest, in one statement.
        if (pageToken === null) return;
        const held = await saveProgress(
          sql,
          checkpoint,
          this.owner,
          { startMs, endMs, pageToken },
          this.#leaseMs,
        );
        if (!held) throw new LeaseLost();
      },
    };
    const line = {
      tenantId,
      store,
      environment,
      windowStart: new Date(startMs).toISOString(),
      windowEnd: new Date(endMs).toISOString(),
    };
    let outcome: "complete" | "more_pages" | "not_released" | "failed" = "complete";
    try {
      let nextPageToken: string | null = null;
      if (startMs < endMs) {
        const credentials = await this.#options.credentialsOf(tenantId);
        const context = { ...this.#options, log, via: "schedule" as const };
        if (store === "storea" && credentials.storea !== null) {
          const end = await readStoreaHistory(
            { ...context, ...this.#options.storea, timeoutMs: this.#options.upstreamTimeoutMs },
            { ...window, credentials: credentials.storea, environment, onlyFailures: true },
            tally,
            failedAttempts,
          );
          nextPageToken = end.nextPageToken;
          if (end.notReleased) outcome = "not_released";
        } else if (store === "storeb" && credentials.storeb !== null) {
          const end = await readVoidedPurchases(
            {
              ...context,
              storeb: this.#options.storeb,
              timeoutMs: this.#options.upstreamTimeoutMs,
            },
            { ...window, credentials: credentials.storeb },
            tally,
            unacknowledged,
          );
          nextPageToken = end.nextPageToken;
        }
      }
      if (nextPageToken !== null) outcome = "more_pages";
      const reported = this.#report(checkpoint, failedAttempts, unacknowledged);
      const held = await finishRun(sql, checkpoint, this.owner, {
        nextRunInMs: nextPageToken === null ? intervalMs : Math.min(intervalMs, CONTINUE_AFTER_MS),
        ...(nextPageToken === null ? { checkedUntil: endMs } : {}),
        ...reported,
      });
      if (!held) throw new LeaseLost();
    } catch (error) {
      if (this.#stop.signal.aborted) {
        // Stopping: what was read is saved page by page; another replica may go on at once.
        await releaseLease(sql, checkpoint, this.owner).catch(() => {});
        return;
      }
      if (error instanceof LeaseLost) {
        log.warn("recovery_lease_lost", { ...line, owner: this.owner });
        return;
      }
      outcome = "failed";
      await this.#fail(checkpoint, error, line, tally, failedAttempts, unacknowledged);
    } finally {
      if (!this.#stop.signal.aborted) {
        log.info("recovery_run", {
          ...line,
          outcome,
          storeCalls: tally.storeCalls,
          pages: tally.pages,
          checked: tally.checked,
          recovered: tally.recovered,
          known: tally.known,
          invalid: tally.invalid,
          durationMs: Math.round(performance.now() - started),
        });
      }
    }
  }

  /** Schedules the next run after a failure and says why. */
  async #fail(
    checkpoint: Checkpoint,
    error: unknown,
    line: Record<string, unknown>,
    tally: RecoveryTally,
    failedAttempts: NotificationSendAttempt[],
    unacknowledged: UnacknowledgedVoid[],
  ): Promise<void> {
    const { sql, log, intervalMs } = this.#options;
    const reported = this.#report(checkpoint, failedAttempts, unacknowledged);
    if (error instanceof PageTokenRefused) {
      // Not the tenant's fault nor the store's: read the window again from its start, now.
      await finishRun(sql, checkpoint, this.owner, {
        nextRunInMs: 0,
        dropUnfinished: true,
        ...reported,
      });
      log.info("recovery_window_restarted", { ...line, reason: error.message });
      return;
    }
    const failures = checkpoint.failures + 1;
    const retryAfterSeconds = error instanceof ServiceError && error.code === "RATE_LIMITED"
      ? Number(error.details?.retryAfterSeconds ?? 0)
      : null;
    // The store's own wait after a 429; otherwise the interval, doubled with each failure in a row.
    const nextRunInMs = retryAfterSeconds !== null
      ? Math.max(1_000, retryAfterSeconds * 1000)
      : Math.min(
        intervalMs * 2 ** Math.min(failures - 1, 20),
        Math.max(intervalMs, MAX_BACKOFF_MS),
      );
    await failRun(sql, checkpoint, this.owner, {
      error: `${errorCode(error, "INTERNAL_ERROR")}: ${
        error instanceof Error ? error.message : String(error)
      }`.slice(0, 1000),
      nextRunInMs,
      ...reported,
    });
    log.warn("recovery_failed", {
      ...line,
      error: errorCode(error, "INTERNAL_ERROR"),
      failures,
      retryAt: new Date(Date.now() + nextRunInMs).toISOString(),
      storeCalls: tally.storeCalls,
      pages: tally.pages,
      recovered: tally.recovered,
      ...log.errorFields(error),
      ...(error instanceof ServiceError && error.details ? { details: error.details } : {}),
    });
  }

  /**
   * Reports, once each, store A's failed send attempts (`store_send_failures` and the metric) and
   * store B's purchases voided for want of an acknowledgement; returns what the checkpoint keeps
   * to know them next time.
   */
  #report(
    checkpoint: Checkpoint,
    failedAttempts: NotificationSendAttempt[],
    unacknowledged: UnacknowledgedVoid[],
  ): { sendFailuresUntil: number | null; warnedOrders: string[] } {
    const { log } = this.#options;
    const { tenantId, environment } = checkpoint;
    // The overlap and retried notifications list an attempt again: only later ones are new.
    const since = checkpoint.sendFailuresUntil ?? -Infinity;
    const fresh = failedAttempts.filter((attempt) => attempt.attemptDate > since);
    let sendFailuresUntil = checkpoint.sendFailuresUntil;
    if (fresh.length > 0) {
      const counts: Record<string, number> = {};
      for (const attempt of fresh) {
        counts[attempt.sendAttemptResult] = (counts[attempt.sendAttemptResult] ?? 0) + 1;
      }
      const latest = Math.max(...fresh.map((attempt) => attempt.attemptDate));
      log.warn("store_send_failures", {
        tenantId,
        store: "storea",
        environment,
        attempts: fresh.length,
        results: counts,
        latestAttemptAt: new Date(latest).toISOString(),
        hint: "the App Store could not reach this service's receiver; check its URL in App " +
          "Store Connect, TLS, and what answered in front of the service",
      });
      for (const [result, count] of Object.entries(counts)) {
        recordStoreSendFailures(tenantId, environment, result, count);
      }
      sendFailuresUntil = latest;
    }
    const warned = new Set(checkpoint.warnedOrders);
    const warnedOrders = [...checkpoint.warnedOrders];
    for (const voided of unacknowledged) {
      if (warned.has(voided.orderId)) continue;
      warned.add(voided.orderId);
      warnedOrders.push(voided.orderId);
      warnUnacknowledgedVoid(log, tenantId, voided);
    }
    return { sendFailuresUntil, warnedOrders };
  }
}

/** Another process took the checkpoint over (this one's lease ran out): this run stops. */
class LeaseLost extends RelayError {
  constructor() {
    super("RECOVERY_LEASE_LOST", "the checkpoint's lease was taken over");
  }
}
