/**
 * Identifiers: a prefix and a ULID (decisions.md 10). The factory is monotonic, so ids made in the
 * same millisecond still sort in creation order, and it draws randomness once per millisecond
 * instead of once per id.
 */
import { monotonicFactory } from "ulid";

const nextUlid = monotonicFactory();

/** The prefixes of the service's ids. */
export type IdPrefix = "tenant" | "key" | "evt" | "dlv" | "req" | "dispatcher";

/** A new id such as `tenant_01J...`. */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${nextUlid()}`;
}

const ULID_BODY = "[0-9A-HJKMNP-TV-Z]{26}";

/** Whether `value` has the shape of an id with `prefix`. */
export function isId(prefix: IdPrefix, value: string): boolean {
  return new RegExp(`^${prefix}_${ULID_BODY}$`).test(value);
}
