/** Deadlines on work that may never settle (a database that accepts but never answers). */

/** Work that did not settle within its deadline. */
export class DeadlineExceededError extends Error {
  readonly code = "DEADLINE_EXCEEDED";
  constructor(ms: number) {
    super(`no answer within ${ms} ms`);
    this.name = "DeadlineExceededError";
  }
}

/**
 * `work`, or a {@linkcode DeadlineExceededError} once `ms` have passed. The work itself runs on
 * (a promise cannot be cancelled); its later rejection is handled here, never unhandled.
 */
export function withDeadline<T>(work: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DeadlineExceededError(ms)), ms);
  });
  return Promise.race([work, expired]).finally(() => clearTimeout(timer));
}

/** A signal that aborts after a time limit, and the way to release it early. */
export interface TimeoutSignal {
  signal: AbortSignal;
  /** Cancels the timer; call it when the work is done, failed or not. */
  clear(): void;
}

/**
 * An `AbortSignal` that aborts after `ms` with a `TimeoutError`, as `AbortSignal.timeout` does,
 * but whose timer can be cleared. `AbortSignal.timeout` keeps its timer, its signal and all that
 * listens on it (a `fetch` and its request) alive until the time is up: with a 10 s upstream
 * deadline and thousands of verifications a second, that held about 150 MB and slowed every
 * garbage collection (docs/benchmarks.md, "Verify").
 */
export function timeoutSignal(ms: number): TimeoutSignal {
  const controller = new AbortController();
  const timer = setTimeout(
    () => controller.abort(new DOMException("Signal timed out.", "TimeoutError")),
    ms,
  );
  // Like AbortSignal.timeout's, the timer alone never keeps the process running.
  Deno.unrefTimer(timer);
  return { signal: controller.signal, clear: () => clearTimeout(timer) };
}
