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
