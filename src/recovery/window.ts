/**
 * What every recovery from the stores' own records shares (docs/recovery.md, "Recovering missed
 * notifications"): how far back each store keeps its records, where a run's window starts, what a
 * run counts, and the errors that end a run without being the store's fault.
 */
import { RelayError } from "../errors.ts";
import type { Receipt, VerifiedNotification } from "../events/ingest.ts";
import type { Logger } from "../observability/log.ts";
import { recordNotification } from "../observability/telemetry.ts";
import { eventKeyDays } from "../retention/relay_history.ts";

export const DAY_MS = 86_400_000;

/** Where a recovery reads: a store, and for store A an environment (store B has one). */
export type RecoveryStore = "storea" | "storeb";
export type RecoveryEnvironment = "production" | "sandbox";

/**
 * How far back a tenant's first run reads: the days the stores still retry a notification on
 * their own, not their whole history (which a manual `notifications recover` can read).
 */
export const FIRST_LOOKBACK_MS = 3 * DAY_MS;
/**
 * Each run starts this long before the previous one ended: a record the store wrote late (a
 * notification whose first attempt was still under way, a purchase voided a moment before the
 * end) is found by the next run. What the overlap finds again is known, and changes nothing.
 */
export const OVERLAP_MS = 60 * 60_000;
/** Asked a little after the oldest time a store takes, so that the clocks' skew never crosses it. */
const STORE_EDGE_MARGIN_MS = 10 * 60_000;

/**
 * How long a store keeps what the recovery reads: Apple's notification history 180 days in
 * production and 30 in sandbox; Google's voided purchases 30 days.
 */
export function storeKeepsMs(store: RecoveryStore, environment: RecoveryEnvironment): number {
  return store === "storea" && environment === "production" ? 180 * DAY_MS : 30 * DAY_MS;
}

/**
 * How far back the service remembers the notifications it stored, so that one found again is
 * known rather than new: events are kept `EVENT_RETENTION_DAYS`, and their keys at least as long
 * as a store may send them again (docs/relay.md, "Retention"). Null: forever (retention 0).
 */
export function dedupHorizonMs(
  eventRetentionDays: number,
  storeaNotificationMaxAgeMs: number,
): number | null {
  if (eventRetentionDays === 0) return null;
  return Math.max(eventRetentionDays, eventKeyDays(storeaNotificationMaxAgeMs)) * DAY_MS;
}

/**
 * The oldest time a window may start at `nowMs`: what the store still keeps, and what the service
 * still remembers (older records could be notifications delivered long ago whose events were
 * deleted since: read again, they would be delivered twice).
 */
export function earliestStartMs(
  store: RecoveryStore,
  environment: RecoveryEnvironment,
  nowMs: number,
  horizonMs: number | null,
): number {
  const kept = nowMs - storeKeepsMs(store, environment) + STORE_EDGE_MARGIN_MS;
  return horizonMs === null ? kept : Math.max(kept, nowMs - horizonMs);
}

/**
 * The latest time a window may end at `nowMs`. Google refuses an `endTime` in the future, so store
 * B's ends a minute back, out of reach of the clocks' skew; what that leaves out, the next window
 * reads.
 */
export function latestEndMs(store: RecoveryStore, nowMs: number): number {
  return store === "storeb" ? nowMs - 60_000 : nowMs;
}

/** What a recovery found, as `notifications recover` prints it and `recovery_run` logs it. */
export interface RecoveryTally {
  /** Records read from the store. */
  checked: number;
  /** New to the service: stored, and delivered as if the store had posted them. */
  recovered: number;
  /** Already stored: nothing changed. */
  known: number;
  /** Refused as the receiver would refuse them: counted and logged, never relayed. */
  invalid: number;
  /** Store A: the store's failed attempts to post, by `sendAttemptResult`. */
  failedSendAttempts: Record<string, number>;
  /** Calls made to the store. */
  storeCalls: number;
  /** Pages the store answered. */
  pages: number;
}

/** A tally at zero. */
export function emptyTally(): RecoveryTally {
  return {
    checked: 0,
    recovered: 0,
    known: 0,
    invalid: 0,
    failedSendAttempts: {},
    storeCalls: 0,
    pages: 0,
  };
}

/** Adds `more` into `into`. */
export function addTally(into: RecoveryTally, more: RecoveryTally): void {
  into.checked += more.checked;
  into.recovered += more.recovered;
  into.known += more.known;
  into.invalid += more.invalid;
  into.storeCalls += more.storeCalls;
  into.pages += more.pages;
  for (const [result, count] of Object.entries(more.failedSendAttempts)) {
    into.failedSendAttempts[result] = (into.failedSendAttempts[result] ?? 0) + count;
  }
}

/** How recovered notifications are stored: as a receiver stores a posted one. */
export interface RecoveryIngest {
  /** Stores the event and its delivery in one transaction, or finds the one it duplicates. */
  ingest(notification: VerifiedNotification): Promise<Receipt>;
  /** Called after a delivery was committed unclaimed, for the immediate first attempt. */
  onEnqueued(): void;
}

/** What storing a recovered notification needs: the ingest, the log, and who asked. */
export interface RecoveryStoring extends RecoveryIngest {
  log: Logger;
  /** Who asked, for the log lines: the schedule or the CLI. */
  via: "schedule" | "cli";
}

/**
 * Stores a notification read back from a store as a receiver stores a posted one, counts it as
 * recovered or known, and logs `notification_recovered` when it was new. `fields` name where it
 * was read (the source, and store A's environment).
 */
export async function storeRecovered(
  context: RecoveryStoring,
  event: VerifiedNotification,
  tally: RecoveryTally,
  fields: { source: RecoveryStore; environment?: RecoveryEnvironment },
): Promise<Receipt> {
  const receipt = await context.ingest(event);
  if (!receipt.isNew) {
    tally.known++;
    return receipt;
  }
  tally.recovered++;
  recordNotification(event.tenantId, fields.source, event.entry.event, true);
  if (receipt.enqueuedDelivery && !receipt.handedOver) context.onEnqueued();
  context.log.info("notification_recovered", {
    tenantId: event.tenantId,
    ...fields,
    via: context.via,
    eventId: receipt.eventId,
    externalId: receipt.externalId,
    event: event.entry.event,
    platformEvent: event.entry.platformEvent,
    enqueuedDelivery: receipt.enqueuedDelivery,
  });
  return receipt;
}

/** One window of a store's records to read, and how far to read it in this run. */
export interface RecoveryWindow {
  tenantId: string;
  /** Epoch milliseconds. */
  startMs: number;
  endMs: number;
  /** Where to go on, from an earlier run's last page; null: from the first page. */
  pageToken: string | null;
  /** The most pages this run reads. */
  maxPages: number;
  /** Ends the reading (the job stopping); a call in flight is cancelled. */
  signal: AbortSignal;
  /** Called after each page's records were stored, with where the next page starts (or null). */
  afterPage?: (nextPageToken: string | null) => Promise<void>;
}

/** How a window's reading ended. */
export interface WindowEnd {
  /** Null: read to its end. Otherwise the page the next run starts from. */
  nextPageToken: string | null;
}

/**
 * The store no longer takes the page token a run saved (expired, or made for another query): the
 * window is read again from its first page; what was stored already is known.
 */
export class PageTokenRefused extends RelayError {
  constructor(message: string) {
    super("PAGE_TOKEN_REFUSED", message);
  }
}
