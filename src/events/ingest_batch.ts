/**
 * Group-commit ingest (docs/architecture.md, "Group-commit ingest"): receivers enqueue their
 * notifications; while a batch's statement is in flight, arrivals accumulate, and the next batch
 * stores them all in one multi-row statement, so one transaction and one WAL flush carry many
 * notifications. Each caller's promise resolves only after the statement holding its row has
 * committed, so a 200 still follows its own commit.
 *
 * - Duplicates inside the batcher (queued or in flight) share the first's fate: they answer with
 *   its event id as duplicates; duplicates of an event already stored are found after the insert.
 * - Rows are inserted in key order, so two batches (of two replicas) never wait on each other's
 *   unique keys in opposite orders.
 * - A batch statement that fails is retried row by row, so one bad row fails only its request; a
 *   row that fails on its connection (not in the database) is tried once more.
 * - With a {@linkcode DeliveryHandOver}, a new delivery can be committed leased to this process's
 *   dispatcher and its first attempt started at once, without a claim (docs/architecture.md,
 *   "Handing over the first attempt").
 */
import postgres from "postgres";
import type { Sql } from "../db/connect.ts";
import { insertEvents } from "../delivery/enqueue.ts";
import type { DeliveryHandOver } from "../delivery/hand_over.ts";
import {
  dedupKeyOf,
  duplicateReceipt,
  eventRowOf,
  ingestPrepared,
  type PreparedIngest,
  prepareIngest,
  type Receipt,
  type VerifiedNotification,
} from "./ingest.ts";

/** Bounds of one batch. */
export interface IngestBatchOptions {
  /** The most notifications in one statement. */
  maxRows: number;
  /** The most payload bytes (UTF-16 code units, near enough) in one statement. */
  maxBytes: number;
  /** Batch statements in flight at once. */
  maxInFlight: number;
}

/**
 * Defaults: a few hundred rows, a few megabytes, four statements overlapping. Under load arrivals
 * queue behind the statements in flight and the next one takes them all, so the batches grow
 * anyway; below it, a notification that waits for a statement to finish waits longer than its own
 * statement takes: with two in flight the receivers' p99 was about 40% longer at half load
 * (docs/architecture.md, "Group-commit ingest").
 */
export const INGEST_BATCH_DEFAULTS: IngestBatchOptions = {
  maxRows: 256,
  maxBytes: 8 * 1024 * 1024,
  maxInFlight: 4,
};

/**
 * The embedded engine runs one statement at a time on its one session: statements in flight beyond
 * two would only wait there, each taking fewer rows.
 */
export const EMBEDDED_INGEST_IN_FLIGHT = 2;

interface Waiter {
  resolve: (receipt: Receipt) => void;
  reject: (error: unknown) => void;
}

interface Pending {
  key: string;
  prepared: PreparedIngest;
  /** The first caller, then any duplicates that arrived before the first was stored. */
  waiters: Waiter[];
}

/** Batches ingests into group commits; see the module comment. */
export class IngestBatcher {
  #sql: Sql;
  #options: IngestBatchOptions;
  #queue: Pending[] = [];
  /** Queued or in-flight notifications by deduplication key. */
  #byKey = new Map<string, Pending>();
  #inFlight = 0;
  #handOver: DeliveryHandOver | null;
  /** Statements run, and rows they carried: for tests and benchmarks. */
  batches = 0;
  rows = 0;

  constructor(
    sql: Sql,
    options: Partial<IngestBatchOptions> & { handOver?: DeliveryHandOver } = {},
  ) {
    this.#sql = sql;
    const { handOver, ...bounds } = options;
    this.#options = { ...INGEST_BATCH_DEFAULTS, ...bounds };
    this.#handOver = handOver ?? null;
  }

  /** Stores `notification` with its delivery, resolving after the commit. */
  ingest(notification: VerifiedNotification): Promise<Receipt> {
    const key = keyOf(notification.tenantId, notification.source, dedupKeyOf(notification));
    return new Promise<Receipt>((resolve, reject) => {
      const first = this.#byKey.get(key);
      if (first !== undefined) {
        first.waiters.push({ resolve, reject });
        return;
      }
      const pending = {
        key,
        prepared: prepareIngest(notification),
        waiters: [{ resolve, reject }],
      };
      this.#byKey.set(key, pending);
      this.#queue.push(pending);
      this.#next();
    });
  }

  #next(): void {
    while (this.#inFlight < this.#options.maxInFlight && this.#queue.length > 0) {
      let rows = 0;
      let bytes = 0;
      while (
        rows < this.#queue.length && rows < this.#options.maxRows &&
        (rows === 0 || bytes + this.#queue[rows].prepared.payload.length <= this.#options.maxBytes)
      ) {
        bytes += this.#queue[rows].prepared.payload.length;
        rows++;
      }
      const batch = this.#queue.splice(0, rows);
      this.#inFlight++;
      this.#run(batch).finally(() => {
        this.#inFlight--;
        this.#next();
      });
    }
  }

  async #run(batch: Pending[]): Promise<void> {
    const receipts = new Map<Pending, Receipt | { error: unknown }>();
    let alone: Pending[];
    try {
      alone = await this.#insertBatch(batch, receipts);
    } catch {
      // One bad row fails the statement (and so stores none): each row alone, so only it fails.
      alone = batch;
    }
    await Promise.all(alone.map(async (pending) => {
      try {
        receipts.set(pending, await this.#storeAlone(pending));
      } catch (error) {
        receipts.set(pending, { error });
      }
    }));
    for (const pending of batch) {
      this.#byKey.delete(pending.key);
      const outcome = receipts.get(pending)!;
      const [first, ...duplicates] = pending.waiters;
      if ("error" in outcome) {
        for (const waiter of pending.waiters) waiter.reject(outcome.error);
        continue;
      }
      first.resolve(outcome);
      for (const duplicate of duplicates) {
        duplicate.resolve(duplicateReceipt(outcome.eventId, outcome.externalId));
      }
    }
  }

  /**
   * Stores one row on its own, trying a second time when the first failed on the connection
   * rather than in the database: after an outage the pool can hold connections whose socket the
   * server has closed, and the first statement on each fails without reaching the database. A
   * second try is safe even if the first did commit: its `ON CONFLICT` finds that row and answers
   * with its event id, as for a duplicate. An error the database answered is final.
   */
  async #storeAlone(pending: Pending): Promise<Receipt> {
    try {
      return await ingestPrepared(this.#sql, pending.prepared);
    } catch (error) {
      if (error instanceof postgres.PostgresError) throw error;
      return await ingestPrepared(this.#sql, pending.prepared);
    }
  }

  /**
   * One statement for the whole batch, then one lookup for the rows that were duplicates.
   * Fills `receipts` and returns the rows still to be stored alone: all of them when the
   * statement fails, none or the unresolved duplicates otherwise.
   */
  async #insertBatch(batch: Pending[], receipts: Map<Pending, Receipt | { error: unknown }>) {
    const rows = [...batch].sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
    // Each reserved row's rank among the tenant's reserved rows, counted against its free slots.
    const handOver = this.#handOver;
    const ranks = new Map<string, number>();
    const rankOf = rows.map(({ prepared: { notification: { tenantId } } }) => {
      if (handOver === null || !handOver.reserve(tenantId)) return null;
      const rank = (ranks.get(tenantId) ?? 0) + 1;
      ranks.set(tenantId, rank);
      return rank;
    });
    const handed = new Set<number>();
    try {
      return await this.#insertRows(rows, rankOf, handed, receipts);
    } finally {
      rows.forEach((pending, ord) => {
        if (rankOf[ord] === null || handed.has(ord)) return;
        handOver!.release(pending.prepared.notification.tenantId);
      });
    }
  }

  async #insertRows(
    rows: Pending[],
    rankOf: (number | null)[],
    handed: Set<number>,
    receipts: Map<Pending, Receipt | { error: unknown }>,
  ): Promise<Pending[]> {
    const sql = this.#sql;
    const handOver = this.#handOver;
    const storedOf = await insertEvents(
      sql,
      rows.map(({ prepared }) => eventRowOf(prepared)),
      rankOf.map((rank) => rank ?? 0),
      handOver === null
        ? null
        : { owner: handOver.owner, leaseMs: handOver.leaseMs, cap: handOver.tenantCap },
    );
    this.batches++;
    this.rows += rows.length;
    const duplicates: Pending[] = [];
    rows.forEach((pending, ord) => {
      const { eventId, deliveryId, notification, payload, receivedAt } = pending.prepared;
      const row = storedOf.get(eventId);
      if (row === undefined) {
        duplicates.push(pending);
        return;
      }
      if (row.handed) {
        handed.add(ord);
        handOver!.start({
          id: deliveryId,
          eventId,
          tenantId: notification.tenantId,
          event: notification.entry.event,
          attempts: 0,
          payload,
          statePending: row.statePending,
          receivedAt,
          target: row.target,
        });
      }
      receipts.set(pending, {
        eventId,
        externalId: notification.externalId,
        isNew: true,
        enqueuedDelivery: row.status === "pending",
        deliveryId,
        handedOver: row.handed,
      });
    });
    if (duplicates.length === 0) return [];
    // A duplicate answers with the first receipt's event id, committed before this statement or
    // beside it (ON CONFLICT waited for that one). From here on the batch is committed: a
    // failure sends only the duplicates to be stored alone, which finds them again.
    try {
      const pick = <T>(f: (n: VerifiedNotification) => T) =>
        duplicates.map((d) => f(d.prepared.notification));
      const found = await sql`
        SELECT e.id, e.tenant_id, e.source, e.external_id
        FROM events e
        JOIN unnest(${pick((n) => n.tenantId)}::text[], ${pick((n) => n.source)}::text[],
                    ${pick(dedupKeyOf)}::text[]) AS k(tenant_id, source, external_id)
          ON e.tenant_id = k.tenant_id AND e.source = k.source
         AND e.external_id = k.external_id`;
      const idOf = new Map<string, string>();
      for (const row of found) {
        idOf.set(keyOf(row.tenant_id, row.source, row.external_id), row.id);
      }
      const unresolved: Pending[] = [];
      for (const pending of duplicates) {
        const eventId = idOf.get(pending.key);
        if (eventId === undefined) {
          unresolved.push(pending);
          continue;
        }
        receipts.set(pending, duplicateReceipt(eventId, pending.prepared.notification.externalId));
      }
      return unresolved;
    } catch {
      return duplicates;
    }
  }
}

function keyOf(tenantId: string, source: string, dedupKey: string): string {
  return JSON.stringify([tenantId, source, dedupKey]);
}
