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
 * - A batch statement that fails is retried row by row, so one bad row fails only its request.
 */
import type { Sql } from "../db/connect.ts";
import {
  ingestPrepared,
  NO_CALLBACK_ERROR,
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

/** Defaults: a few hundred rows, a few megabytes, two statements overlapping. */
export const INGEST_BATCH_DEFAULTS: IngestBatchOptions = {
  maxRows: 256,
  maxBytes: 8 * 1024 * 1024,
  maxInFlight: 2,
};

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
  /** Statements run, and rows they carried: for tests and benchmarks. */
  batches = 0;
  rows = 0;

  constructor(sql: Sql, options: Partial<IngestBatchOptions> = {}) {
    this.#sql = sql;
    this.#options = { ...INGEST_BATCH_DEFAULTS, ...options };
  }

  /** Stores `notification` with its delivery, resolving after the commit. */
  ingest(notification: VerifiedNotification): Promise<Receipt> {
    const key = keyOf(notification);
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
      const batch: Pending[] = [];
      let bytes = 0;
      while (
        this.#queue.length > 0 && batch.length < this.#options.maxRows &&
        (batch.length === 0 ||
          bytes + this.#queue[0].prepared.payload.length <= this.#options.maxBytes)
      ) {
        const pending = this.#queue.shift()!;
        bytes += pending.prepared.payload.length;
        batch.push(pending);
      }
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
        receipts.set(pending, await ingestPrepared(this.#sql, pending.prepared));
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
        duplicate.resolve({
          eventId: outcome.eventId,
          externalId: outcome.externalId,
          isNew: false,
          enqueuedDelivery: false,
          deliveryId: null,
        });
      }
    }
  }

  /**
   * One statement for the whole batch, then one lookup for the rows that were duplicates.
   * Fills `receipts` and returns the rows still to be stored alone: all of them when the
   * statement fails, none or the unresolved duplicates otherwise.
   */
  async #insertBatch(batch: Pending[], receipts: Map<Pending, Receipt | { error: unknown }>) {
    const sql = this.#sql;
    const rows = [...batch].sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
    // One parameter per value (not arrays): a 16 KB payload is not escaped into an array literal.
    const values = rows.map(({ prepared: p }, ord) => [
      p.eventId,
      p.notification.tenantId,
      p.notification.source,
      p.notification.externalId,
      p.notification.entry.event,
      p.notification.entry.platformEvent,
      p.payload,
      p.receivedAt.toISOString(),
      p.deliveryId,
      String(ord),
    ]);
    const stored = await sql`
      WITH input AS (
        SELECT id, tenant_id, source, external_id, event, platform_event, payload,
               received_at::timestamptz AS received_at, delivery_id, ord::int AS ord
        FROM (VALUES ${sql(values)}) AS i(id, tenant_id, source, external_id, event,
                                          platform_event, payload, received_at, delivery_id, ord)
      ), event AS (
        INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload,
                            received_at)
        SELECT id, tenant_id, source, external_id, event, platform_event, payload, received_at
        FROM input ORDER BY ord
        ON CONFLICT (tenant_id, source, external_id) DO NOTHING
        RETURNING id, tenant_id
      ), delivery AS (
        INSERT INTO deliveries (id, event_id, tenant_id, status, next_attempt_at, last_error)
        SELECT input.delivery_id, event.id, event.tenant_id,
               CASE WHEN t.callback_url IS NULL THEN 'failed' ELSE 'pending' END,
               CASE WHEN t.callback_url IS NULL THEN NULL ELSE input.received_at END,
               CASE WHEN t.callback_url IS NULL THEN ${NO_CALLBACK_ERROR} END
        FROM event JOIN input ON input.id = event.id JOIN tenants t ON t.id = event.tenant_id
        RETURNING event_id, status
      )
      SELECT event_id, status FROM delivery`;
    this.batches++;
    this.rows += rows.length;
    const statusOf = new Map<string, string>();
    for (const row of stored) statusOf.set(row.event_id, row.status);
    const duplicates: Pending[] = [];
    for (const pending of rows) {
      const { eventId, deliveryId, notification } = pending.prepared;
      const status = statusOf.get(eventId);
      if (status === undefined) {
        duplicates.push(pending);
        continue;
      }
      receipts.set(pending, {
        eventId,
        externalId: notification.externalId,
        isNew: true,
        enqueuedDelivery: status === "pending",
        deliveryId,
      });
    }
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
                    ${pick((n) => n.externalId)}::text[]) AS k(tenant_id, source, external_id)
          ON e.tenant_id = k.tenant_id AND e.source = k.source
         AND e.external_id = k.external_id`;
      const idOf = new Map<string, string>();
      for (const row of found) {
        const key = keyOf({
          tenantId: row.tenant_id,
          source: row.source,
          externalId: row.external_id,
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
        receipts.set(pending, {
          eventId,
          externalId: pending.prepared.notification.externalId,
          isNew: false,
          enqueuedDelivery: false,
          deliveryId: null,
        });
      }
      return unresolved;
    } catch {
      return duplicates;
    }
  }
}

function keyOf(n: Pick<VerifiedNotification, "tenantId" | "source" | "externalId">): string {
  return JSON.stringify([n.tenantId, n.source, n.externalId]);
}
