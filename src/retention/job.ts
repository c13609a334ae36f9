/**
 * A prune that runs by itself: once at boot, in the background, then on a schedule from
 * `Deno.cron`, or on an interval where a minute is too coarse. Every replica runs it; the prunes
 * delete with `SKIP LOCKED` and are idempotent, so replicas running at once share the work. One
 * run at a time in a process, and a run stops between two batches at shutdown.
 */

/** A cron expression (UTC), or an interval for schedules finer than a minute. */
export type PruneSchedule = string | { everyMs: number };

/** A scheduled prune, or the embedded engine's vacuum (src/process/app.ts). */
export class PruneJob {
  #name: string;
  #schedule: PruneSchedule;
  #prune: (signal: AbortSignal) => Promise<void>;
  #stop = new AbortController();
  #running: Promise<void> | null = null;

  /**
   * `prune` deletes what is due, stops between batches when the signal aborts, and logs its own
   * outcome: a failure it lets through is swallowed here, so the next run tries again.
   */
  constructor(
    name: string,
    schedule: PruneSchedule,
    prune: (signal: AbortSignal) => Promise<void>,
  ) {
    this.#name = name;
    this.#schedule = schedule;
    this.#prune = prune;
  }

  /**
   * Starts a run now and schedules the next ones (a run still under way when the next is due is
   * joined, not doubled).
   */
  start(): void {
    this.schedule();
    void this.run();
  }

  /** Schedules the runs, the first at the schedule's next time. */
  schedule(): void {
    const schedule = this.#schedule;
    if (typeof schedule === "string") {
      Deno.cron(this.#name, schedule, { signal: this.#stop.signal }, () => this.run());
      return;
    }
    const timer = setInterval(() => void this.run(), schedule.everyMs);
    this.#stop.signal.addEventListener("abort", () => clearInterval(timer), { once: true });
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
