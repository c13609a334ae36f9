/**
 * The pace of a prune: old rows are deleted in small batches, each one short statement, and the
 * next batch waits as long as the last one took. So a prune never holds row locks for long, never
 * keeps the database busy for more than one batch at a time (the embedded engine runs one
 * statement at a time: a receiver's insert waits for at most one batch), and uses at most about
 * half of the database's time however much there is to delete (docs/relay.md, "Retention").
 */

/**
 * Rows a batch takes, unless told otherwise: milliseconds of work on PostgreSQL, about a tenth of
 * a second on the embedded engine (with payloads of a realistic size).
 */
export const DEFAULT_BATCH_SIZE = 200;
/** The shortest pause between two batches. */
const MIN_PAUSE_MS = 20;

/** Options of a prune. */
export interface PruneOptions {
  /** Rows per batch, by default {@linkcode DEFAULT_BATCH_SIZE}. */
  batchSize?: number;
  /** Ends the prune between two batches (shutdown). */
  signal?: AbortSignal;
}

/** Spaces the batches of one prune and stops them when its signal aborts. */
export class BatchPacer {
  readonly batchSize: number;
  #signal: AbortSignal | undefined;
  #lastBatchMs: number | null = null;

  constructor(options: PruneOptions = {}) {
    this.batchSize = options.batchSize ?? DEFAULT_BATCH_SIZE;
    this.#signal = options.signal;
  }

  /** Whether the prune was stopped before it ran out of rows. */
  get stopped(): boolean {
    return this.#signal?.aborted ?? false;
  }

  /**
   * Runs one batch, after the pause the previous one earned; resolves `null`, running nothing,
   * once the prune is stopped.
   */
  async run<T>(batch: () => Promise<T>): Promise<T | null> {
    if (this.#lastBatchMs !== null) await this.#pause(Math.max(MIN_PAUSE_MS, this.#lastBatchMs));
    if (this.stopped) return null;
    const started = performance.now();
    try {
      return await batch();
    } finally {
      this.#lastBatchMs = performance.now() - started;
    }
  }

  #pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#signal?.addEventListener("abort", done, { once: true });
    });
  }
}
