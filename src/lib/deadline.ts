/** Deadlines on work that may never settle (a database that accepts but never answers). */
import { afterDeadline } from "./shared_timers.ts";
import { RelayError } from "../errors.ts";

/** Work that did not settle within its deadline. */
export class DeadlineExceededError extends RelayError {
  constructor(ms: number) {
    super("DEADLINE_EXCEEDED", `no answer within ${ms} ms`);
  }
}

/**
 * `work`, or a {@linkcode DeadlineExceededError} once `ms` have passed (up to 25 ms later: the
 * deadline is a shared one, src/lib/shared_timers.ts). The work itself runs on (a promise cannot be
 * cancelled); its later rejection is handled here, never unhandled.
 */
export function withDeadline<T>(work: Promise<T>, ms: number): Promise<T> {
  let cancel: () => void = () => {};
  const expired = new Promise<never>((_, reject) => {
    cancel = afterDeadline(ms, () => reject(new DeadlineExceededError(ms)));
  });
  return Promise.race([work, expired]).finally(cancel);
}
