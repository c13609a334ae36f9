/** Abort signals that end work: a time limit that can be released, and waiting on a signal. */
import { afterDeadline } from "./shared_timers.ts";

/** A signal that aborts after a time limit, and the way to release it early. */
export interface TimeoutSignal {
  signal: AbortSignal;
  /** Cancels the timer; call it when the work is done, failed or not. */
  clear(): void;
}

/**
 * An `AbortSignal` that aborts after `ms` with a `TimeoutError`, as `AbortSignal.timeout` does, but
 * whose timer can be cleared. `AbortSignal.timeout` keeps its timer, its signal and all that
 * listens on it (a `fetch` and its request) alive until the time is up: with a 10 s upstream
 * deadline and thousands of verifications a second, that held about 150 MB and slowed every garbage
 * collection (measured in the verify benchmark when this was written). The deadline is a shared one
 * (src/lib/shared_timers.ts): it may fire up to 25 ms late, and until it fires or is cleared it keeps
 * the event loop running, so a deadline always ends the work it bounds.
 */
export function timeoutSignal(ms: number): TimeoutSignal {
  const controller = new AbortController();
  const clear = afterDeadline(
    ms,
    () => controller.abort(new DOMException("Signal timed out.", "TimeoutError")),
  );
  return { signal: controller.signal, clear };
}

/** Settles like `promise`, or rejects as soon as `signal` aborts. */
export function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
