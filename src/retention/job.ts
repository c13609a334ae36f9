/**
 * A prune that runs by itself: once at boot, in the background, then on a schedule from
 * `Deno.cron`. Every replica runs it; the prunes delete with `SKIP LOCKED` and are idempotent,
 * so replicas running at once share the work. One run at a time in a process, and a run stops
 * between two batches at shutdown.
 */

/** A scheduled prune, or the embedded engine's vacuum (src/app.ts). */
export class PruneJob {
  #name: string;
  #schedule: string;
  #prune: (signal: AbortSignal) => Promise<void>;
  #stop = new AbortController();
  #running: Promise<void> | null = null;

  /**
   * `prune` deletes what is due, stops between batches when the signal aborts, and logs its own
   * outcome: a failure it lets through is swallowed here, so the next run tries again.
   */
  constructor(name: string, schedule: string, prune: (signal: AbortSignal) => Promise<void>) {
    this.#name = name;
    this.#schedule = schedule;
    this.#prune = prune;
  }

  /** Starts a run now and schedules the next ones (`schedule` is a cron expression, UTC). */
  start(): void {
    this.schedule();
    void this.run();
  }

  /** Schedules the runs, the first at the schedule's next time. */
  schedule(): void {
    Deno.cron(this.#name, this.#schedule, { signal: this.#stop.signal }, () => this.run());
  }

  /** Runs the prune now, or joins the run under way. */
  run(): Promise<void> {
    if (this.#stop.signal.aborted) return Promise.resolve();
    this.#running ??= this.#prune(this.#stop.signal)
      .catch(() => {})
      .finally(() => this.#running = null);
    return this.#running;
  }

  /** Cancels the schedule and waits for the run under way to stop at its next batch. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#running;
  }
}
