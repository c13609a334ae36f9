/**
 * Identifiers: a prefix naming the kind of thing ({@linkcode IdPrefix}: `tenant_`, `evt_`, ...) and
 * a ULID.
 *
 * ULIDs are made here rather than by a library because every request makes one (its `req_` id):
 * the time part is encoded once per millisecond and the random part is drawn once per
 * millisecond, then counted up, so ids made in the same millisecond still sort in creation order
 * (a monotonic ULID). A request pays for one 8-character string.
 */

/** The prefixes of the service's ids. */
export type IdPrefix = "tenant" | "key" | "evt" | "dlv" | "req" | "dispatcher";

/** Crockford's base 32, as ULIDs use it. */
const ENCODING = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/** The 80 random bits are kept as two 40-bit halves: each fits a double exactly. */
const HALF = 2 ** 40;

/** Makes monotonic ULIDs from a clock and a source of random bytes (both injectable for tests). */
export function ulidFactory(
  now: () => number = Date.now,
  fillRandom: (bytes: Uint8Array) => void = (bytes) => crypto.getRandomValues(bytes),
): () => string {
  const bytes = new Uint8Array(10);
  let lastMs = -1;
  let timePart = "";
  let high = 0;
  let highPart = "";
  let low = 0;

  const draw = (ms: number) => {
    lastMs = ms;
    timePart = encodeTime(ms);
    fillRandom(bytes);
    high = fortyBits(bytes, 0);
    highPart = encode40(high);
    low = fortyBits(bytes, 5);
  };

  return () => {
    const ms = now();
    if (ms > lastMs) {
      draw(ms);
    } else if (++low === HALF) {
      // Same millisecond, or a clock that stepped back: count up, carrying into the high half.
      low = 0;
      if (++high === HALF) {
        draw(lastMs + 1); // 2^80 ids in one millisecond: borrow the next one
      } else {
        highPart = encode40(high);
      }
    }
    return timePart + highPart + encode40(low);
  };
}

function fortyBits(bytes: Uint8Array, at: number): number {
  const top = bytes[at];
  const rest = ((bytes[at + 1] << 24) | (bytes[at + 2] << 16) | (bytes[at + 3] << 8) |
    bytes[at + 4]) >>> 0;
  return top * 2 ** 32 + rest;
}

/** Character codes of {@linkcode ENCODING}, by digit. */
const CODES = Array.from(ENCODING, (char) => char.charCodeAt(0));

/** `value` (below 2^40) as 8 base-32 digits, in one string allocation. */
function encode40(value: number): string {
  const top = Math.floor(value / 2 ** 20); // two 20-bit halves: bit operations stay in 32 bits
  const bottom = value % 2 ** 20;
  return String.fromCharCode(
    CODES[top >>> 15],
    CODES[(top >>> 10) & 31],
    CODES[(top >>> 5) & 31],
    CODES[top & 31],
    CODES[bottom >>> 15],
    CODES[(bottom >>> 10) & 31],
    CODES[(bottom >>> 5) & 31],
    CODES[bottom & 31],
  );
}

/** A millisecond time (below 2^48) as the 10 base-32 digits of a ULID's time part. */
function encodeTime(ms: number): string {
  return ENCODING[Math.floor(ms / 2 ** 45)] + ENCODING[Math.floor(ms / 2 ** 40) % 32] +
    encode40(ms % 2 ** 40);
}

const nextUlid = ulidFactory();

/** A new id such as `tenant_01J...`. */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${nextUlid()}`;
}

const ULID_BODY = "[0-9A-HJKMNP-TV-Z]{26}";

/** Whether `value` has the shape of an id with `prefix`. */
export function isId(prefix: IdPrefix, value: string): boolean {
  return new RegExp(`^${prefix}_${ULID_BODY}$`).test(value);
}
