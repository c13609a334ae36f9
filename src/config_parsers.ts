/**
 * The kinds of value a configuration variable holds (src/config.ts): each parses the variable's
 * text and says, for the configuration reference, what it accepts.
 * @module
 */
import { RelayError } from "./errors.ts";

/** A kind of value: a parser of a variable's text, and what it accepts. */
export interface Parser<T> {
  /** What it accepts, as the reference's "Valid values" says it (Markdown). */
  readonly accepts: string;
  /**
   * The value of `text`, trimmed and not empty.
   * @throws {InvalidValue} when `text` is not one.
   */
  parse(text: string): T;
}

/**
 * A value a parser refuses. The error reads `"<value>" <reason>`, or only `<reason>` when there is
 * no value to quote or the variable is a secret (src/config.ts names the variable).
 */
export class InvalidValue extends RelayError {
  /** The text refused: the variable's or one item of a list. */
  readonly value: string | undefined;
  /** Why, written to follow the quoted value. */
  readonly reason: string;

  constructor(reason: string, value?: string) {
    super("CONFIG_INVALID", value === undefined ? reason : `"${value}" ${reason}`);
    this.reason = reason;
    this.value = value;
  }
}

/** How durations, booleans and URLs are written, for the top of the reference (Markdown). */
export const VALUE_FORMATS =
  "a duration is a number and a unit, `ms`, `s`, `m`, `h` or `d` (`500ms`, `30s`, `1.5m`, `1d`); " +
  "a boolean is `true`, `1` or `yes`, or `false`, `0` or `no` (any case); " +
  "a URL must be `http` or `https` unless said otherwise, and a trailing `/` is dropped";

/** Parses a duration such as `500ms`, `30s`, `2m`, `1h` or `1d` into milliseconds. */
export function parseDuration(text: string): number | null {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(text.trim());
  if (!match) return null;
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[match[2]]!;
  return Math.round(Number(match[1]) * unit);
}

/** A duration in milliseconds. */
export const duration: Parser<number> = {
  accepts: "duration",
  parse: durationOf,
};

/** Comma-separated durations, in milliseconds. */
export const durationList: Parser<number[]> = {
  accepts: "comma-separated durations",
  parse: (text) => items(text).map(durationOf),
};

/** An integer from `min` to `max`. */
export function integer(min: number, max: number): Parser<number> {
  return {
    accepts: `integer, ${min} to ${max}`,
    parse(text) {
      if (!/^\d+$/.test(text)) throw new InvalidValue("is not an integer", text);
      const n = Number(text);
      if (n < min || n > max) throw new InvalidValue(`must be between ${min} and ${max}`);
      return n;
    },
  };
}

/** A number above zero, decimals allowed. */
export const positiveNumber: Parser<number> = {
  accepts: "a positive number; decimals allowed (`0.5`)",
  parse(text) {
    const n = Number(text);
    if (!/^\d+(\.\d+)?$/.test(text) || !(n > 0)) {
      throw new InvalidValue("is not a positive number", text);
    }
    return n;
  },
};

/** `true`, `1`, `yes` or `false`, `0`, `no`, in any case. */
export const boolean: Parser<boolean> = {
  accepts: "boolean",
  parse(text) {
    const lower = text.toLowerCase();
    if (["true", "1", "yes"].includes(lower)) return true;
    if (["false", "0", "no"].includes(lower)) return false;
    throw new InvalidValue("is not true or false", text);
  },
};

/** One of `allowed`, exactly. */
export function oneOf<const T extends string>(allowed: readonly T[]): Parser<T> {
  return {
    accepts: allowed.map((value) => `\`${value}\``).join(", "),
    parse(text) {
      if (!(allowed as readonly string[]).includes(text)) {
        throw new InvalidValue(`is not one of ${allowed.join(", ")}`, text);
      }
      return text as T;
    },
  };
}

/** `v<major>.<minor>.<patch>` or `dev`. */
export const serviceVersion: Parser<string> = {
  accepts: "`v<major>.<minor>.<patch>` or `dev`",
  parse(text) {
    if (text !== "dev" && !/^v\d+\.\d+\.\d+$/.test(text)) {
      throw new InvalidValue("is not v<major>.<minor>.<patch> or dev", text);
    }
    return text;
  },
};

/** An http or https URL, without its trailing `/`. */
export const httpUrl: Parser<string> = {
  accepts: "URL",
  parse(text) {
    const url = urlOf(text);
    if (url.protocol !== "https:" && url.protocol !== "http:") {
      throw new InvalidValue("must be an http or https URL");
    }
    return text.replace(/\/+$/, "");
  },
};

/** A PostgreSQL connection URL, kept as written. */
export const postgresUrl: Parser<string> = {
  accepts: "URL starting with `postgres://` or `postgresql://`",
  parse(text) {
    const url = urlOf(text);
    if (url.protocol !== "postgres:" && url.protocol !== "postgresql:") {
      throw new InvalidValue("must start with postgres:// or postgresql://");
    }
    return text;
  },
};

/** The master key: standard or URL-safe base64 of exactly 32 bytes. */
export const masterKey: Parser<Uint8Array> = {
  accepts: "standard or URL-safe base64 of exactly 32 bytes",
  parse(text) {
    const normalized = text.replaceAll("-", "+").replaceAll("_", "/");
    let bytes: Uint8Array;
    try {
      bytes = Uint8Array.from(atob(normalized), (c) => c.charCodeAt(0));
    } catch {
      throw new InvalidValue("is not valid base64");
    }
    if (bytes.length !== 32) {
      throw new InvalidValue(`must decode to 32 bytes, got ${bytes.length}`);
    }
    return bytes;
  },
};

/** Any text, checked where it is used; `accepts` says what it should be. */
export function text(accepts: string): Parser<string> {
  return { accepts, parse: (value) => value };
}

/** Comma-separated items, empty ones dropped; `accepts` says what each should be. */
export function list(accepts: string): Parser<string[]> {
  return { accepts, parse: items };
}

/** Comma-separated items, at least one. */
export const nonEmptyList: Parser<string[]> = {
  accepts: "comma-separated, at least one",
  parse(text) {
    const found = items(text);
    if (found.length === 0) throw new InvalidValue("must list at least one value");
    return found;
  },
};

function durationOf(text: string): number {
  const ms = parseDuration(text);
  if (ms === null) {
    throw new InvalidValue("is not a duration such as 500ms, 30s, 2m, 1h or 1d", text);
  }
  return ms;
}

function items(text: string): string[] {
  return text.split(",").map((item) => item.trim()).filter((item) => item !== "");
}

function urlOf(text: string): URL {
  try {
    return new URL(text);
  } catch {
    throw new InvalidValue("is not a URL", text);
  }
}
