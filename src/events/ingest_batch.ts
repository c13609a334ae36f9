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
import {
  leasesHeld,
  type SealedTarget,
  sealedTargetColumns,
  sealedTargetOf,
} from "../db/tenants.ts";
import {
  dedupKeyOf,
  deliveryRoute,
  duplicateReceipt,
  ingestPrepared,
  newDeliveryState,
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

/** A delivery committed leased to the dispatcher, with what its first attempt needs. */
export interface HandedOverDelivery {
  id: string;
  eventId: string;
  tenantId: string;
  event: string;
  attempts: 0;
  payload: string;
  /** Its payload still waits for the store B purchase's state (see `DeliveryStateSource`). */
  statePending: boolean;
  receivedAt: Date;
  /** The tenant's target as the statement read it, its secrets still sealed. */
  target: SealedTarget;
}

/**
 * The dispatcher's side of a hand-over. A batch reserves a slot per new delivery it may hand
 * over; the statement leases a delivery only within the tenant's cap, counted as a claim counts
 * it, and only while the tenant's callback is healthy and nothing of the tenant's is waiting;
 * after the commit, each reservation is either started or released.
 */
export interface DeliveryHandOver {
  /** The lease's owner, and its length. */
  readonly owner: string;
  readonly leaseMs: number;
  /** The most leases one tenant may hold at once, across every process. */
  readonly tenantCap: number;
  /** Reserves a slot for a new delivery of `tenantId`; false when it should be claimed instead. */
  reserve(tenantId: string): boolean;
  /** Gives back a reservation whose delivery was not handed over. */
  release(tenantId: string): void;
  /** Starts the first attempt of a delivery committed with the lease, using its reservation. */
  start(delivery: HandedOverDelivery): void;
}

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
    const key = keyOf({ ...notification, dedupKey: dedupKeyOf(notification) });
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
    const cap = handOver?.tenantCap ?? 0;
    // One parameter per value (not arrays): a 16 KB payload is not escaped into an array literal.
    const values = rows.map(({ prepared: p }, ord) => [
      p.eventId,
      p.notification.tenantId,
      p.notification.source,
      dedupKeyOf(p.notification),
      p.notification.entry.event,
      p.notification.entry.platformEvent,
      p.payload,
      p.receivedAt.toISOString(),
      p.deliveryId,
      String(ord),
      // 0: not reserved (the values of a VALUES list cannot be null here).
      String(rankOf[ord] ?? 0),
      p.notification.sandbox === true ? "1" : "0",
      p.notification.needsState === true ? "1" : "0",
      p.subjectHash ?? "",
    ]);
    if (sql.options.prepare) {
      // A client that prepares its statements makes one per VALUES length, each planned afresh at
      // its first runs: padded to a power of two, a connection keeps nine plans, not 256
      // (docs/architecture.md, "Group-commit ingest"). Blank rows are skipped by their empty id;
      // every value stays a string, so the parameter types, part of the statement's name, stay.
      const blank = ["", "", "", "", "", "", "", BLANK_TIME, "", "0", "0", "0", "0", ""];
      while (values.length & (values.length - 1)) values.push(blank);
    }
    const stored = await sql`
      WITH input AS (
        SELECT id, tenant_id, source, external_id, event, platform_event, payload,
               received_at::timestamptz AS received_at, delivery_id, ord::int AS ord,
               hand_rank::int AS hand_rank, sandbox = '1' AS sandbox,
               needs_state = '1' AS needs_state, nullif(subject_hash, '') AS subject_hash
        FROM (VALUES ${sql(values)}) AS i(id, tenant_id, source, external_id, event,
                                          platform_event, payload, received_at, delivery_id, ord,
                                          hand_rank, sandbox, needs_state, subject_hash)
        WHERE id <> ''
      ), event AS (
        INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                            received_at, subject_hash)
        SELECT id, tenant_id, source, external_id, event, platform_event, payload, received_at,
               subject_hash
        FROM input ORDER BY ord
        ON CONFLICT (tenant_id, source, external_id) DO NOTHING
        RETURNING id, tenant_id
      ), delivery AS (
        INSERT INTO deliveries (id, event_id, tenant_id, sandbox, state_pending, status,
                                next_attempt_at, last_error, lease_owner, lease_expires_at)
        SELECT input.delivery_id, event.id, event.tenant_id, input.sandbox,
               input.needs_state AND t.storeb_state_fetch,
               ${newDeliveryState(sql, sql`input.received_at`)},
               CASE WHEN hand.over THEN ${handOver?.owner ?? null}::text END,
               CASE WHEN hand.over
                    THEN now() + ${handOver?.leaseMs ?? 0} * interval '1 millisecond' END
        FROM event JOIN input ON input.id = event.id JOIN tenants t ON t.id = event.tenant_id
        ${deliveryRoute(sql, { event: sql`input.event`, sandbox: sql`input.sandbox` })}
        -- The statement's snapshot does not see the rows it inserts: the leases and the waiting
        -- deliveries counted here are those committed before it (see DeliveryHandOver).
        CROSS JOIN LATERAL (
          SELECT input.hand_rank > 0
             AND t.active AND route.url IS NOT NULL AND route.wanted
             AND t.delivery_failure_streak = 0
             AND input.hand_rank + ${leasesHeld(sql, cap)} <= ${cap}
             -- No delivery of the tenant waits: an ordered probe of the pending index, which stops
             -- at the first. As NOT EXISTS, statistics taken during a backlog made it a scan of
             -- the whole table once the backlog had drained
             -- (docs/architecture.md, "Queue statements and stale statistics").
             AND (SELECT w.id FROM deliveries w
                  WHERE w.tenant_id = t.id AND w.status = 'pending'
                    AND w.next_attempt_at <= now()
                    AND (w.lease_expires_at IS NULL OR w.lease_expires_at <= now())
                  ORDER BY w.next_attempt_at
                  LIMIT 1) IS NULL AS over
        ) hand
        RETURNING event_id, tenant_id, sandbox, state_pending, status,
                  lease_owner IS NOT NULL AS handed
      )
      SELECT d.event_id, d.status, d.handed, d.state_pending,
             ${sealedTargetColumns(sql, sql`d.sandbox`)}
      FROM delivery d JOIN tenants t ON t.id = d.tenant_id`;
    this.batches++;
    this.rows += rows.length;
    const storedOf = new Map(stored.map((row) => [row.event_id as string, row]));
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
          statePending: row.state_pending,
          receivedAt,
          target: sealedTargetOf(row),
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
        const key = keyOf({
          tenantId: row.tenant_id,
          source: row.source,
          dedupKey: row.external_id,
        });
        idOf.set(key, row.id);
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

/** The receipt time of a blank row, which is never stored. */
const BLANK_TIME = new Date(0).toISOString();

function keyOf(n: { tenantId: string; source: string; dedupKey: string }): string {
  return JSON.stringify([n.tenantId, n.source, n.dedupKey]);
}
