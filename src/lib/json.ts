/**
 * Small helpers for JSON from outside: strict decoding, depth limits and shape checks. Shared by
 * the HTTP layer and the store modules, which must apply the same rules to what they parse.
 */

/**
 * How deep a JSON document from outside may nest. A document of 500,000 nested arrays (a 1 MB
 * body holds that many levels) parses, but overflows the stack when the service serializes it
 * again to store it: a 500 rather than a 400.
 */
export const MAX_JSON_DEPTH = 64;

const strictUtf8Decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * `bytes` as text, refusing malformed UTF-8 rather than replacing it with U+FFFD: what is
 * verified or stored must be exactly what was sent.
 * @throws {TypeError} when `bytes` is not valid UTF-8.
 */
export function decodeUtf8Strict(bytes: Uint8Array): string {
  return strictUtf8Decoder.decode(bytes);
}

/** Whether parsed JSON `value` nests arrays and objects more than `max` levels deep. */
export function nestsDeeperThan(value: unknown, max: number): boolean {
  // Iterative: the documents it looks for are too deep for recursion.
  const pending: [node: unknown, depth: number][] = [[value, 0]];
  while (pending.length > 0) {
    const [node, depth] = pending.pop()!;
    if (typeof node !== "object" || node === null) continue;
    if (depth >= max) return true;
    for (const child of Object.values(node)) pending.push([child, depth + 1]);
  }
  return false;
}

/** Whether `value` is a JSON object (not null, not an array). */
export function isJsonObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `value` if it is a JSON object, else null. */
export function objectOrNull(value: unknown): Record<string, unknown> | null {
  return isJsonObject(value) ? value : null;
}

/** `value` if it is a JSON object, else an empty one: for reading optional nested fields. */
export function objectOrEmpty(value: unknown): Record<string, unknown> {
  return isJsonObject(value) ? value : {};
}
