/**
 * A tenant's event filter (docs/configuration.md, "Routing deliveries"): event names and `prefix.*`
 * patterns; an event that matches none is stored but not delivered. Null is no filter: every event
 * is delivered. The receivers' statements match in SQL (`eventFilterMatch`, `delivery/enqueue.ts`)
 * exactly as {@linkcode matchesEventFilter} does here; change both together.
 */
import { UNIFIED_EVENTS } from "./catalog.ts";

/** What `tenant set-events --events` takes to clear the filter. */
export const ALL_EVENTS = "all";

/**
 * The filter written as a comma-separated list, or null for `all`. Each item is an event name of
 * the catalog or `prefix.*` that matches at least one: a typo would silently drop events.
 * @throws {Error} naming the items that match no event.
 */
export function parseEventFilter(text: string): string[] | null {
  const items = [...new Set(text.split(",").map((item) => item.trim()).filter((item) => item))];
  if (items.length === 1 && items[0] === ALL_EVENTS) return null;
  if (items.length === 0) throw new Error(`give event names or patterns, or ${ALL_EVENTS}`);
  const unknown = items.filter((item) => !UNIFIED_EVENTS.some((event) => matches(event, item)));
  if (unknown.length > 0) {
    throw new Error(
      `${unknown.join(", ")} ${unknown.length === 1 ? "matches" : "match"} no event; events are ` +
        `${UNIFIED_EVENTS.join(", ")}; a pattern is a prefix and .* (subscription.*)`,
    );
  }
  return items;
}

/** Whether `event` is delivered under `filter` (null: every event is). */
export function matchesEventFilter(event: string, filter: readonly string[] | null): boolean {
  return filter === null || filter.some((pattern) => matches(event, pattern));
}

function matches(event: string, pattern: string): boolean {
  return pattern.endsWith(".*") ? event.startsWith(pattern.slice(0, -1)) : event === pattern;
}
