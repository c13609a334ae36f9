/**
 * The validation audit (docs/configuration.md, "Validation audit"): every verify outcome, recorded in
 * the background so the verify path never waits for the database. Entries are buffered and written
 * in one INSERT per flush; when the database is away the buffer is bounded and the oldest entries
 * are dropped (and counted) rather than growing without limit.
 */
import type { Sql } from "../db/connect.ts";
import type { SubjectHasher } from "./subject_hash.ts";
import { BatchPacer, type PruneOptions } from "../retention/batches.ts";

/** One verify outcome. */
export interface AuditEntry {
  tenantId: string;
  store: "storea" | "storeb";
  /** The transaction id or purchase token; only its keyed hash is stored. */
  subject: string;
  /** `valid`, or the domain or error code the client received. */
  outcome: string;
  /** The last upstream HTTP status, null when the store was not asked or not reached. */
  upstreamStatus: number | null;
  latencyMs: number;
}

/** Options of {@linkcode ValidationAudit}. */
export interface ValidationAuditOptions {
  /** How often buffered entries are written. */
  flushIntervalMs?: number;
  /** Entries kept while the database cannot be written. */
  bufferLimit?: number;
  /** Told about a failed write (the entries stay buffered for the next flush). */
  onFlushError?: (error: unknown, dropped: number) => void;
}

interface BufferedEntry extends AuditEntry {
  at: Date;
}

/** Buffers audit entries and writes them in batches. */
export class ValidationAudit {
  #sql: Sql;
  #hasher: SubjectHasher;
  #buffer: BufferedEntry[] = [];
  #dropped = 0;
  #timer: ReturnType<typeof setInterval> | undefined;
  #flushing: Promise<void> | null = null;
  #flushIntervalMs: number;
  #bufferLimit: number;
  #onFlushError: (error: unknown, dropped: number) => void;

  constructor(sql: Sql, hasher: SubjectHasher, options: ValidationAuditOptions = {}) {
    this.#sql = sql;
    this.#hasher = hasher;
    this.#flushIntervalMs = options.flushIntervalMs ?? 1_000;
    this.#bufferLimit = options.bufferLimit ?? 50_000;
    this.#onFlushError = options.onFlushError ?? (() => {});
  }

  /** Queues one outcome; never blocks and never throws. */
  record(entry: AuditEntry): void {
    if (this.#buffer.length >= this.#bufferLimit) {
      this.#buffer.shift();
      this.#dropped++;
    }
    this.#buffer.push({ ...entry, at: new Date() });
  }

  /** Starts the periodic flush. */
  start(): void {
    this.#timer ??= setInterval(() => void this.flush(), this.#flushIntervalMs);
  }

  /** Stops the periodic flush and writes what is buffered. */
  async stop(): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    await this.flush();
  }

  /** Writes buffered entries now; concurrent calls share one write. */
  flush(): Promise<void> {
    this.#flushing ??= this.#write().finally(() => this.#flushing = null);
    return this.#flushing;
  }

  async #write(): Promise<void> {
    if (this.#buffer.length === 0) return;
    const batch = this.#buffer.splice(0, 1_000);
    try {
      const rows = await Promise.all(batch.map(async (entry) => ({
        tenant_id: entry.tenantId,
        store: entry.store,
        subject_hash: await this.#hasher.hash(entry.subject),
        outcome: entry.outcome,
        upstream_status: entry.upstreamStatus,
        latency_ms: Math.round(entry.latencyMs),
        created_at: entry.at,
      })));
      await this.#sql`INSERT INTO validation_audit ${this.#sql(rows)}`;
      this.#dropped = 0;
    } catch (error) {
      // Put the batch back in front; the next flush tries again.
      this.#buffer.unshift(...batch);
      const excess = this.#buffer.length - this.#bufferLimit;
      if (excess > 0) {
        this.#buffer.splice(0, excess);
        this.#dropped += excess;
      }
      this.#onFlushError(error, this.#dropped);
      return;
    }
    if (this.#buffer.length > 0) await this.#write();
  }
}

/** What a prune of the audit deleted. */
export interface AuditPruneResult {
  deleted: number;
  /** False when it was stopped (shutdown) before it ran out of rows to delete. */
  complete: boolean;
}

/**
 * Deletes audit entries older than `retentionDays`, in batches paced as every prune is
 * (src/retention/batches.ts), with `SKIP LOCKED` so that replicas pruning at once share the rows.
 */
export async function pruneValidationAudit(
  sql: Sql,
  retentionDays: number,
  options: PruneOptions = {},
): Promise<AuditPruneResult> {
  const pacer = new BatchPacer(options);
  let deleted = 0;
  while (true) {
    const batch = await pacer.run(() =>
      sql`
        WITH chosen AS (
          SELECT id FROM validation_audit
          WHERE created_at < now() - make_interval(days => ${retentionDays})
          ORDER BY created_at
          LIMIT ${pacer.batchSize}
          FOR UPDATE SKIP LOCKED
        )
        DELETE FROM validation_audit a USING chosen WHERE a.id = chosen.id`
    );
    if (batch === null) return { deleted, complete: false };
    deleted += batch.count;
    if (batch.count < pacer.batchSize) return { deleted, complete: true };
  }
}
