/**
 * Timers for deadlines, shared by every deadline that ends in the same 25 ms slot.
 *
 * Nearly every request arms a deadline of seconds (the upstream timeout, the handler's deadline)
 * and clears it a few milliseconds later. A runtime timer each cost about a tenth of the verify
 * routes' throughput in a bare proxy measured alike (the verify benchmark, when this was written):
 * arming one is not free, and a cleared timer's bookkeeping outlived the request and was
 * promoted to the old generation. Here a deadline is an entry in its slot's set, removed the moment
 * it is cancelled; a slot holds one runtime timer, set when its first deadline arrives and cleared
 * when its last one is cancelled, so no timer outlives the work it bounds and an idle process holds
 * none.
 *
 * A deadline fires at the end of its slot: never early, at most {@linkcode SLOT_MS} late.
 */

/** The width of a slot: how late a deadline may fire. */
export const SLOT_MS = 25;

interface Slot {
  timer: ReturnType<typeof setTimeout>;
  callbacks: Set<() => void>;
}

const slots = new Map<number, Slot>();

/**
 * Calls `callback` once `ms` have passed, unless the returned function is called first.
 * Like `setTimeout`, a pending deadline keeps the process running.
 */
export function afterDeadline(ms: number, callback: () => void): () => void {
  const now = Date.now();
  const end = Math.ceil((now + Math.max(0, ms)) / SLOT_MS) * SLOT_MS;
  let slot = slots.get(end);
  if (slot === undefined) {
    const callbacks = new Set<() => void>();
    const timer = setTimeout(() => fire(end, callbacks), end - now);
    slot = { timer, callbacks };
    slots.set(end, slot);
  }
  // A wrapper of its own, so that the same callback armed twice is two deadlines.
  const entry = () => callback();
  slot.callbacks.add(entry);
  const { callbacks, timer } = slot;
  return () => {
    if (!callbacks.delete(entry) || callbacks.size > 0) return;
    clearTimeout(timer);
    if (slots.get(end)?.callbacks === callbacks) slots.delete(end);
  };
}

function fire(end: number, callbacks: Set<() => void>): void {
  if (slots.get(end)?.callbacks === callbacks) slots.delete(end);
  const due = [...callbacks];
  callbacks.clear();
  for (const callback of due) callback();
}
