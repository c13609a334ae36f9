/** The one reading of a `Retry-After` header (RFC 9110, delay-seconds or an HTTP date). */

/**
 * Milliseconds to wait from `header` at `now`, or null when it is absent or unreadable. Dates in
 * the past mean no wait (0).
 */
export function parseRetryAfterMs(header: string | null, now = Date.now()): number | null {
  if (header === null) return null;
  const text = header.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  // Every HTTP-date form starts with a day name; Date.parse alone would take "-5" as a year.
  if (!/^[A-Za-z]{3}/.test(text)) return null;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return null;
  return Math.max(0, at - now);
}
