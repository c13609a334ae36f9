/**
 * The dispatcher: one per process, sharing the queue with any number of replicas.
 *
 * - A receiver's commit is followed by `kick()`: the first attempt is immediate.
 * - `sweep()` runs from a `Deno.cron` job every minute and at boot: it claims what is due, and
 *   sets a timer for the next delivery that falls due (or whose lease ends) within the minute,
 *   so a 30 s retry is not late by up to a minute (docs/relay.md, "Queue and replicas").
 * - Claims are leased for longer than an attempt can take; a process that dies leaves its
 *   claims to be taken over when their leases end (at-least-once).
 * - At most `concurrency` attempts are in flight; claims never exceed the free slots, so a
 *   claimed delivery never waits on a busy process while its lease runs out.
 * - Tenants share the slots fairly, across every process: a tenant holds at most
 *   `tenantConcurrency` leases at once (one while its callback keeps failing), and each claim
 *   interleaves tenants (see `claimDueDeliveries`), so one tenant's broken callback or backlog
 *   does not hold up another's deliveries.
 * - A receiver's batch may hand a new delivery straight to `handOver`: committed leased to this
 *   process, its first attempt starts without a claim (docs/architecture.md, "Handing over the
 *   first attempt").
 * - `stop()` stops claiming and waits for the attempts in flight.
 *
 * Two named states drive it, each changed in one place:
 *
 * - its life ({@linkcode DispatcherLife}): `running` claims, hands over and sets timers;
 *   `draining` (from `stop()`) claims nothing, refuses hand-overs and sets no timer, but still
 *   records the attempts that finish; `stopped` once they are recorded, or the grace is over, and
 *   the kept callback connections are closed. It never goes back.
 * - its pump ({@linkcode PumpState}): `idle`; `pumping` while one statement at a time records
 *   finished attempts and claims for the free slots; `pumping-again` when something asked for a
 *   pump meanwhile (a kick, a finished attempt, a timer), which runs one more cycle rather than a
 *   second pump beside the first.
 */
import { withDeadline } from "../lib/deadline.ts";
import { setBounded } from "../lib/cache.ts";
import type { Sql } from "../db/connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";
import type { Logger } from "../observability/log.ts";
import { newId } from "../lib/ids.ts";
import {
  type AttemptResult,
  type AttemptToRecord,
  type AttemptVerdict,
  type Claim,
  type ClaimedDelivery,
  FAILING_CALLBACK_STREAK,
  nextDueAt,
  notifyDispatchers,
  recordAndClaim,
  recordAttempt,
  type RecordedAttempt,
  releaseClaim,
  storeCompletedPayload,
} from "./queue.ts";
import { sendDelivery } from "./sender.ts";
import type { CallbackPolicy } from "./callback_policy.ts";
import { CallbackConnections } from "./callback_client.ts";
import { CheckedAddresses } from "./callback_target.ts";
import { ATTR, recordDeliveryAttempt, withSpan } from "../observability/telemetry.ts";
import type { DeliveryHandOver } from "./hand_over.ts";

/** The longest wait a callback's `Retry-After` can ask for; beyond it the header is capped. */
const MAX_RETRY_AFTER_MS = 24 * 3_600_000;
/** How far ahead a sweep schedules deliveries precisely: the cron period. */
const SWEEP_HORIZON_MS = 60_000;
/** The most opened webhook secrets kept, by their sealed value. */
const OPENED_SECRETS_SIZE = 10_000;
/** How often, at most, a busy dispatcher asks when the next delivery falls due. */
const NEXT_DUE_INTERVAL_MS = 250;
/** The most attempts recorded in one statement. */
const RECORD_BATCH_ROWS = 500;
/**
 * A tenant is handed deliveries only while its callback's last answer here was a 2xx, at most
 * this long ago: a callback that is new, slow or failing gets its deliveries through claims, which
 * keep the tenant's cap exactly across processes.
 */
const HAND_OVER_HEALTHY_MS = 10_000;
/** The most tenants whose last good answer is remembered. */
const HEALTHY_TENANTS_SIZE = 10_000;

/** Where a dispatcher is in its life; see the module's description. */
export type DispatcherLife = "running" | "draining" | "stopped";
/** Whether a pump runs, and whether another was asked for meanwhile. */
export type PumpState = "idle" | "pumping" | "pumping-again";

/** What the dispatcher needs. */
export interface DispatcherOptions {
  sql: Sql;
  box: SecretBox;
  log: Logger;
  version: string;
  /** Delays after the immediate first attempt; after the last, `failed`. */
  retryScheduleMs: number[];
  timeoutMs: number;
  concurrency: number;
  /** The most attempts in flight to one tenant, across every process sharing the database. */
  tenantConcurrency: number;
  callbackPolicy: CallbackPolicy;
  /** Completes the payloads that wait for their purchase's state; none: they go as they are. */
  stateSource?: DeliveryStateSource;
}

/**
 * Completes a delivery's payload with the purchase's state before its first attempt, off the
 * receivers' path (docs/deliveries.md, "State on every delivery").
 */
export interface DeliveryStateSource {
  /**
   * `payload` with `state`, or `stateError` when the state could not be had: a store's failure
   * is written into the payload, never thrown, and the delivery goes anyway.
   */
  complete(tenantId: string, payload: string): Promise<string>;
}

/** Sends due deliveries, retries them on schedule, and records every attempt. */
export class Dispatcher {
  /** This process's name on the leases it holds. */
  readonly owner = newId("dispatcher");
  #options: DispatcherOptions;
  /** Connections to callbacks kept open between attempts; closed by `stop()`. */
  #connections = new CallbackConnections();
  /** Callback hosts' addresses that passed the send-time check, reused for 30 s. */
  #checkedAddresses = new CheckedAddresses();
  #leaseMs: number;
  #life: DispatcherLife = "running";
  #pumpState: PumpState = "idle";
  /** Settles once `stop()` has drained it; every call of `stop()` waits for the same drain. */
  #drained: Promise<void> | undefined;
  #inFlight = new Set<Promise<void>>();
  /** Attempts' slots and receivers' reservations, in all and per tenant. */
  #slots = new Slots();
  /** The one timer for the next delivery due within the sweep's period. */
  #wakeUp = new WakeUpTimer(() => this.#pump());
  /**
   * Opened webhook secrets by sealed value: the claim reads each tenant's target afresh, and a
   * sealed value always opens to the same secret, so only the decryption is kept.
   */
  #opened = new Map<string, Promise<string>>();
  /** Attempts waiting to be recorded by the next statement. */
  #toRecord: ToRecord[] = [];
  /** When the next due time was last asked of the database. */
  #nextDueCheckedAt = 0;
  /** When each tenant's callback last answered 2xx, while its last answer was a 2xx. */
  #healthySince = new Map<string, number>();
  /** The last claim filled every free slot: deliveries may be waiting, so none is handed over. */
  #backlogged = false;
  /** The receivers' side of the hand-over (see {@linkcode DeliveryHandOver}). */
  readonly handOver: DeliveryHandOver;

  constructor(options: DispatcherOptions) {
    this.#options = options;
    // Longer than any attempt (the timeout bounds it), with room for recording it.
    this.#leaseMs = 2 * options.timeoutMs + 5_000;
    this.handOver = {
      owner: this.owner,
      leaseMs: this.#leaseMs,
      tenantCap: options.tenantConcurrency,
      reserve: (tenantId) => this.#reserve(tenantId),
      release: (tenantId) => this.#release(tenantId),
      start: (delivery) => {
        this.#release(delivery.tenantId);
        if (this.#life !== "running") {
          // Stopping: give the lease back, so another process sends it without waiting for it.
          releaseClaim(this.#options.sql, delivery.id, this.owner).catch(() => {});
          return;
        }
        this.#start(delivery);
      },
    };
  }

  #reserve(tenantId: string): boolean {
    const { concurrency, tenantConcurrency } = this.#options;
    const healthySince = this.#healthySince.get(tenantId);
    if (
      this.#life !== "running" || this.#backlogged ||
      this.#slots.taken >= concurrency ||
      healthySince === undefined || Date.now() - healthySince > HAND_OVER_HEALTHY_MS ||
      this.#slots.ofTenant(tenantId) >= tenantConcurrency
    ) {
      return false;
    }
    this.#slots.reserve(tenantId);
    return true;
  }

  #release(tenantId: string): void {
    this.#slots.release(tenantId);
  }

  /** Remembers whether the tenant's callback just answered 2xx, for {@linkcode #reserve}. */
  #noteAnswer(tenantId: string, delivered: boolean): void {
    if (!delivered) this.#healthySince.delete(tenantId);
    else setBounded(this.#healthySince, tenantId, Date.now(), HEALTHY_TENANTS_SIZE);
  }

  /** Attempts in flight now. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** Where the dispatcher is in its life. */
  get life(): DispatcherLife {
    return this.#life;
  }

  /** A delivery was just committed: claim it (and anything else due) now. */
  kick(): void {
    this.#pump();
  }

  /** The periodic sweep: claim what is due, and schedule what falls due within the period. */
  async sweep(): Promise<void> {
    await this.#pump();
  }

  /**
   * Stops claiming and resolves when the attempts in flight have been recorded, or after
   * `DELIVERY_TIMEOUT` + {@linkcode STOP_GRACE_MS} at most: an attempt still unrecorded then
   * keeps its lease, and is sent again by whichever process claims it when the lease ends.
   */
  stop(): Promise<void> {
    this.#drained ??= this.#drain();
    return this.#drained;
  }

  async #drain(): Promise<void> {
    this.#life = "draining";
    this.#wakeUp.clear();
    const deadline = Date.now() + this.#options.timeoutMs + STOP_GRACE_MS;
    while (this.#inFlight.size > 0 && Date.now() < deadline) {
      await withDeadline(Promise.allSettled([...this.#inFlight]), deadline - Date.now())
        .catch(() => {});
    }
    this.#connections.close();
    this.#life = "stopped";
  }

  /**
   * Runs {@linkcode #cycle} until there is nothing to record or claim. Stopped, it still records
   * what finishes, and claims nothing.
   */
  async #pump(): Promise<void> {
    if (this.#pumpState !== "idle") {
      this.#pumpState = "pumping-again";
      return;
    }
    try {
      do {
        this.#pumpState = "pumping";
        await this.#cycle();
        // An attempt that finishes during this query asks again: its record must not wait.
        if (!this.#askedAgain() && this.#life === "running") await this.#scheduleNextWakeUp();
      } while (this.#askedAgain());
    } catch (error) {
      // The database may be down; the next sweep or timer tries again.
      this.#options.log.warn("delivery_claim_failed", this.#options.log.errorFields(error));
      this.#wakeAt(Date.now() + 5_000);
    } finally {
      this.#pumpState = "idle";
    }
    // Attempts that finished while a claim failed are recorded now, each on its own if need be.
    if (this.#toRecord.length > 0) this.#pump();
  }

  /** Whether a pump was asked for while this one ran a cycle (the state changes under awaits). */
  #askedAgain(): boolean {
    return this.#pumpState === "pumping-again";
  }

  /**
   * One statement at a time: it records the attempts that finished and claims for the slots free
   * once they are recorded (docs/architecture.md, "Batched delivery"); again while attempts wait
   * to be recorded or the claim filled every slot (more may be due).
   */
  async #cycle(): Promise<void> {
    const { concurrency, tenantConcurrency } = this.#options;
    while (true) {
      const batch = this.#toRecord.splice(0, RECORD_BATCH_ROWS);
      const free = this.#life !== "running" ? 0 : concurrency - this.#slots.taken + batch.length;
      if (batch.length === 0 && free <= 0) return; // a finishing attempt pumps again
      const claimed = free <= 0
        ? await this.#recordAnd(batch, null)
        : await withSpan("purchase_relay.delivery.claim", {}, async (span) => {
          const claimed = await this.#recordAnd(batch, {
            owner: this.owner,
            limit: free,
            leaseMs: this.#leaseMs,
            tenantCap: tenantConcurrency,
          });
          span?.setAttribute("purchase_relay.claimed", claimed.length);
          return claimed;
        });
      for (const delivery of claimed) this.#start(delivery);
      if (free > 0) this.#backlogged = claimed.length === free;
      if (this.#toRecord.length === 0 && (free <= 0 || claimed.length < free)) return;
    }
  }

  /**
   * Records `batch` and, given `claim`, claims in the same statement; frees the batch's slots once
   * its records are committed. After a failing statement the batch's attempts are recorded one by
   * one, so one bad row does not fail the others, and the claim is left to the next cycle.
   */
  async #recordAnd(batch: ToRecord[], claim: Claim | null): Promise<ClaimedDelivery[]> {
    const { sql, log } = this.#options;
    let outcome: { recorded: RecordedAttempt[]; claimed: ClaimedDelivery[] };
    try {
      outcome = await recordAndClaim(sql, this.owner, batch.map((b) => b.attempt), claim);
    } catch (error) {
      if (batch.length === 0) throw error; // the claim alone: the pump says so and tries later
      log.warn("delivery_record_batch_failed", {
        attempts: batch.length,
        ...log.errorFields(error),
      });
      await Promise.all(batch.map(async ({ attempt, slot, done }) => {
        const recorded = recordAttempt(sql, this.owner, attempt);
        await recorded.catch(() => {});
        this.#freeSlot(slot);
        done(recorded);
      }));
      return [];
    }
    batch.forEach(({ slot, done }, i) => {
      this.#freeSlot(slot);
      done(Promise.resolve(outcome.recorded[i]));
    });
    return outcome.claimed;
  }

  #start(delivery: ClaimedDelivery): void {
    const slot = this.#slots.take(delivery.tenantId);
    // An attempt that outlives its lease (a database call that never answers) gives up its
    // slot: the delivery is claimed again when the lease ends, so the slot must not stay taken.
    const attempt = withDeadline(this.#attempt(delivery, slot), this.#leaseMs).catch((error) => {
      this.#options.log.error("delivery_attempt_failed", {
        deliveryId: delivery.id,
        ...this.#options.log.errorFields(error),
      });
    }).finally(() => {
      this.#inFlight.delete(attempt);
      this.#freeSlot(slot);
      this.#pump();
    });
    this.#inFlight.add(attempt);
  }

  #freeSlot(slot: Slot): void {
    this.#slots.free(slot);
  }

  #attempt(delivery: ClaimedDelivery, slot: Slot): Promise<void> {
    return withSpan("purchase_relay.delivery.attempt", {
      [ATTR.tenant]: delivery.tenantId,
      [ATTR.event]: delivery.event,
      [ATTR.eventId]: delivery.eventId,
      [ATTR.deliveryId]: delivery.id,
      [ATTR.attempt]: delivery.attempts + 1,
    }, async (span) => {
      const { outcome, responseCode } = await this.#attemptOnce(delivery, slot);
      span?.setAttribute(ATTR.outcome, outcome);
      if (responseCode !== null) span?.setAttribute("http.response.status_code", responseCode);
      recordDeliveryAttempt(delivery.tenantId, delivery.event, outcome, delivery.receivedAt);
    });
  }

  /**
   * One attempt, recorded; returns its outcome for telemetry: `delivered`, `retry`, `failed`,
   * or `lease_lost` (recorded too late: another process has it); and the callback's HTTP status,
   * if it answered. Claims and hand-overs take only active tenants' deliveries, and the attempt
   * goes ahead on what they read (docs/relay.md, "Inactive tenants").
   */
  async #attemptOnce(
    claimed: ClaimedDelivery,
    slot: Slot,
  ): Promise<{ outcome: string; responseCode: number | null }> {
    const { log } = this.#options;
    const delivery = claimed.statePending && claimed.target.callbackUrl !== null
      ? await this.#withState(claimed)
      : claimed;
    const target = {
      callbackUrl: delivery.target.callbackUrl,
      secrets: await Promise.all(
        delivery.target.sealedSecrets.map((sealed) => this.#open(delivery.tenantId, sealed)),
      ),
    };
    const result: AttemptResult = target.callbackUrl === null ? noCallback() : await sendDelivery({
      callbackUrl: target.callbackUrl,
      payload: delivery.payload,
      event: delivery.event,
      eventId: delivery.eventId,
      secrets: target.secrets,
    }, {
      version: this.#options.version,
      timeoutMs: this.#options.timeoutMs,
      policy: this.#options.callbackPolicy,
      connections: this.#connections,
      checkedAddresses: this.#checkedAddresses,
    });
    const verdict = this.#verdictOf(delivery.attempts, result);
    this.#noteAnswer(delivery.tenantId, verdict.status === "delivered");
    const recorded = await withSpan(
      "purchase_relay.delivery.record",
      { [ATTR.deliveryId]: delivery.id },
      () =>
        this.#record(
          { deliveryId: delivery.id, tenantId: delivery.tenantId, result, verdict },
          slot,
        ),
    );
    const fields = {
      deliveryId: delivery.id,
      eventId: delivery.eventId,
      tenantId: delivery.tenantId,
      attempt: delivery.attempts + 1,
      responseCode: result.responseCode,
      error: result.error,
      durationMs: Math.round(result.durationMs),
      status: verdict.status,
      nextAttemptAt: verdict.status === "pending" ? verdict.nextAttemptAt.toISOString() : null,
    };
    if (!recorded.kept) log.warn("delivery_lease_lost", fields);
    else if (verdict.status === "failed") log.warn("delivery_failed", fields);
    else log.info("delivery_attempt", fields);
    this.#logCallbackHealth(delivery.tenantId, recorded);
    if (verdict.status === "pending") this.#wakeAt(verdict.nextAttemptAt.getTime());
    const outcome = !recorded.kept
      ? "lease_lost"
      : verdict.status === "pending"
      ? "retry"
      : verdict.status;
    return { outcome, responseCode: result.responseCode };
  }

  /**
   * The delivery with its payload completed by the state source, and stored so that every later
   * attempt sends the same bytes. A completion that cannot be stored (a lease lost, the database
   * gone) is sent all the same; the next attempt completes it again.
   */
  async #withState(delivery: ClaimedDelivery): Promise<ClaimedDelivery> {
    const { stateSource, sql, log } = this.#options;
    if (stateSource === undefined) return delivery;
    let payload: string;
    try {
      payload = await stateSource.complete(delivery.tenantId, delivery.payload);
    } catch (error) {
      log.warn("delivery_state_failed", { deliveryId: delivery.id, ...log.errorFields(error) });
      return delivery;
    }
    try {
      await storeCompletedPayload(sql, { ...delivery, owner: this.owner, payload });
    } catch (error) {
      log.warn("delivery_state_unsaved", { deliveryId: delivery.id, ...log.errorFields(error) });
    }
    return { ...delivery, payload, statePending: false };
  }

  /** Opens a tenant's sealed webhook secret, once per sealed value. */
  #open(tenantId: string, sealed: string): Promise<string> {
    const key = `${tenantId}\u0000${sealed}`;
    const cached = this.#opened.get(key);
    if (cached !== undefined) return cached;
    const opened = this.#options.box.open("webhook-secret", tenantId, sealed);
    setBounded(this.#opened, key, opened, OPENED_SECRETS_SIZE);
    // A value that does not open (a master key not configured) is not kept.
    opened.catch(() => this.#opened.delete(key));
    return opened;
  }

  /**
   * Queues an attempt for the next statement, which records every attempt that finished while the
   * one before it ran (docs/architecture.md, "Batched delivery").
   */
  #record(attempt: AttemptToRecord, slot: Slot): Promise<RecordedAttempt> {
    return new Promise<RecordedAttempt>((resolve, reject) => {
      this.#toRecord.push({ attempt, slot, done: (r) => r.then(resolve, reject) });
      this.#pump();
    });
  }

  /** Says when a tenant's callback starts failing (one delivery at a time) and recovers. */
  #logCallbackHealth(tenantId: string, recorded: RecordedAttempt): void {
    const { log } = this.#options;
    if (recorded.failureStreak === FAILING_CALLBACK_STREAK) {
      log.warn("delivery_callback_failing", {
        tenantId,
        failedInARow: recorded.failureStreak,
        tenantConcurrency: 1,
      });
    } else if (
      recorded.failureStreak === 0 && (recorded.previousStreak ?? 0) >= FAILING_CALLBACK_STREAK
    ) {
      log.info("delivery_callback_recovered", {
        tenantId,
        failedInARow: recorded.previousStreak,
        tenantConcurrency: this.#options.tenantConcurrency,
      });
      // The tenant's share is back: this process refills only the slots it frees, so the other
      // processes are woken to claim the rest now rather than at their next sweep.
      notifyDispatchers(this.#options.sql).catch(() => {});
    }
  }

  /** 2xx delivers; otherwise the retry schedule, lengthened by a 429/503 `Retry-After`. */
  #verdictOf(previousAttempts: number, result: AttemptResult): AttemptVerdict {
    const code = result.responseCode;
    if (code !== null && code >= 200 && code < 300) return { status: "delivered" };
    const schedule = this.#options.retryScheduleMs;
    if (previousAttempts >= schedule.length) return { status: "failed" };
    const retryAfter = Math.min(result.retryAfterMs ?? 0, MAX_RETRY_AFTER_MS);
    const delay = Math.max(schedule[previousAttempts], retryAfter);
    return { status: "pending", nextAttemptAt: new Date(result.attemptedAt.getTime() + delay) };
  }

  async #scheduleNextWakeUp(): Promise<void> {
    // While every slot is busy, each finishing attempt pumps; a timer would only spin.
    if (this.#slots.busy >= this.#options.concurrency) return;
    // While attempts are in flight, each finishing one pumps again, and this process's own
    // retries set their timers: the query is needed only for other processes' work, so once per
    // NEXT_DUE_INTERVAL_MS is enough, rather than once per finishing attempt.
    const now = Date.now();
    if (this.#slots.busy > 0 && now - this.#nextDueCheckedAt < NEXT_DUE_INTERVAL_MS) return;
    this.#nextDueCheckedAt = now;
    const due = await nextDueAt(this.#options.sql, SWEEP_HORIZON_MS, {
      tenantCap: this.#options.tenantConcurrency,
    });
    if (due !== null) this.#wakeAt(due.getTime());
  }

  /** Wakes the pump at `at`, while running and within the sweep's period. */
  #wakeAt(at: number): void {
    if (this.#life !== "running") return;
    if (at > Date.now() + SWEEP_HORIZON_MS) return; // the next sweep schedules it
    this.#wakeUp.at(at);
  }
}

/** A delivery slot, held by one attempt. */
interface Slot {
  tenantId: string;
}

/**
 * The slots taken: an attempt holds one from its start until its record is committed (or it ends
 * unrecorded), so a crash loses at most the records of `concurrency` attempts. Receivers' batches
 * reserve slots for deliveries they may hand over; both count against a tenant's cap.
 */
class Slots {
  #held = new Set<Slot>();
  #reserved = 0;
  #perTenant = new Map<string, number>();

  /** Slots held by attempts. */
  get busy(): number {
    return this.#held.size;
  }

  /** Slots held or reserved. */
  get taken(): number {
    return this.#held.size + this.#reserved;
  }

  /** Slots held or reserved for `tenantId`. */
  ofTenant(tenantId: string): number {
    return this.#perTenant.get(tenantId) ?? 0;
  }

  take(tenantId: string): Slot {
    const slot = { tenantId };
    this.#held.add(slot);
    this.#count(tenantId, 1);
    return slot;
  }

  /** Frees `slot`; freeing it twice frees it once. */
  free(slot: Slot): void {
    if (this.#held.delete(slot)) this.#count(slot.tenantId, -1);
  }

  reserve(tenantId: string): void {
    this.#reserved++;
    this.#count(tenantId, 1);
  }

  release(tenantId: string): void {
    this.#reserved--;
    this.#count(tenantId, -1);
  }

  #count(tenantId: string, change: number): void {
    const count = (this.#perTenant.get(tenantId) ?? 0) + change;
    if (count > 0) this.#perTenant.set(tenantId, count);
    else this.#perTenant.delete(tenantId);
  }
}

/** One timer, kept for the earliest time asked for. */
class WakeUpTimer {
  #wake: () => void;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #at = Infinity;

  constructor(wake: () => void) {
    this.#wake = wake;
  }

  /** Sets the timer for `at`, unless one is set for an earlier time still to come. */
  at(at: number): void {
    if (this.#timer !== undefined && this.#at <= at && this.#at > Date.now()) return;
    clearTimeout(this.#timer);
    this.#at = at;
    // A few ms late rather than early: the database's now() must have passed the due time.
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#at = Infinity;
      this.#wake();
    }, Math.max(0, at - Date.now()) + 20);
  }

  clear(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#at = Infinity;
  }
}

/** An attempt waiting to be recorded, the slot it frees, and its caller's answer. */
interface ToRecord {
  attempt: AttemptToRecord;
  slot: Slot;
  done: (recorded: Promise<RecordedAttempt>) => void;
}

function noCallback(): AttemptResult {
  return {
    attemptedAt: new Date(),
    durationMs: 0,
    responseCode: null,
    responseBody: null,
    error: "the tenant has no callback URL",
    retryAfterMs: null,
  };
}

/** How long a stopping dispatcher waits beyond `DELIVERY_TIMEOUT` for attempts to be recorded. */
export const STOP_GRACE_MS = 5_000;
