/**
 * One known stray rejection that must not end the process. When PostgreSQL's side of a connection
 * closes (a restart, a failover, a proxy that drops it) while npm:postgres 3.4.9 has a write
 * queued with `setImmediate`, that write reaches Deno's `node:net` socket after the peer's FIN,
 * which rejects a promise nobody holds ("This socket has been ended by the other party", EPIPE)
 * besides failing the connection as it should. Unhandled, Deno ends the process on it: every
 * request in flight is cut, receipts included (docs/architecture.md, "Why it is built this way").
 * The connection's own error still reaches npm:postgres, which fails its queries and reconnects;
 * only this copy is dropped, with a warning. Any other unhandled rejection still ends the process.
 */
import type { Logger } from "../observability/log.ts";

/** The message of the stray rejection; its `code` is `EPIPE`. */
const WRITE_AFTER_END = "This socket has been ended by the other party";

/** Whether `reason` is the stray rejection of a write on a database socket the peer closed. */
export function isStrayWriteAfterEnd(reason: unknown): boolean {
  return reason instanceof Error && reason.message === WRITE_AFTER_END &&
    (reason as { code?: unknown }).code === "EPIPE";
}

/** Drops the stray rejection described above, logging it; undo with the returned disposable. */
export function dropStrayWriteAfterEnd(log: Logger): Disposable {
  const listener = (event: PromiseRejectionEvent) => {
    if (!isStrayWriteAfterEnd(event.reason)) return;
    event.preventDefault();
    log.warn("database_socket_closed_mid_write", { reason: WRITE_AFTER_END });
  };
  globalThis.addEventListener("unhandledrejection", listener);
  return {
    [Symbol.dispose]: () => globalThis.removeEventListener("unhandledrejection", listener),
  };
}
