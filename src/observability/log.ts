/**
 * Structured logs: one JSON object per line on standard output, `ts`, `level` and `msg` first
 * (docs/observability.md, "Logs").
 *
 * Lines are buffered and written in batches: a write per request would cost a system call on the
 * hot path. The buffer is flushed at the end of the current macrotask, when it grows past 64 KB,
 * and synchronously for `fatal` lines and on shutdown, so nothing is held back for long.
 */
import type { LogLevel } from "../config.ts";
import { telemetryEnabled, traceFields } from "./telemetry.ts";

/** A level a record can carry; `fatal` always prints. */
export type RecordLevel = LogLevel | "fatal";

const RANK: Record<RecordLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, fatal: 50 };
const FLUSH_BYTES = 64 * 1024;
const encoder = new TextEncoder();

/** Options of {@linkcode Logger}. */
export interface LoggerOptions {
  level?: LogLevel;
  /** Production logs carry the error class only, never a stack (docs/observability.md, "Logs"). */
  production?: boolean;
  /** Where lines go; standard output by default. */
  write?: (bytes: Uint8Array) => void;
}

/** Writes JSON lines. */
export class Logger {
  #minimum: number;
  #production: boolean;
  #write: (bytes: Uint8Array) => void;
  #pending = "";
  #scheduled = false;
  // The timestamp of the last line: at thousands of lines per second most share a millisecond,
  // and toISOString is the largest part of building a line.
  #stampMs = -1;
  #stamp = "";
  /**
   * With telemetry on, standard output lines go out one by one through `console.log`, which Deno
   * also exports as OTLP log records carrying the active span's ids (docs/observability.md,
   * "Logs and traces together"). The line printed is the same.
   */
  #throughConsole: boolean;

  constructor(options: LoggerOptions = {}) {
    this.#minimum = RANK[options.level ?? "info"];
    this.#production = options.production ?? false;
    this.#write = options.write ?? writeStdout;
    this.#throughConsole = telemetryEnabled && options.write === undefined;
  }

  /** Changes level and mode once the configuration is known. */
  configure(options: { level: LogLevel; production: boolean }): void {
    this.#minimum = RANK[options.level];
    this.#production = options.production;
  }

  debug(msg: string, fields?: Record<string, unknown>): void {
    this.log("debug", msg, fields);
  }
  info(msg: string, fields?: Record<string, unknown>): void {
    this.log("info", msg, fields);
  }
  warn(msg: string, fields?: Record<string, unknown>): void {
    this.log("warn", msg, fields);
  }
  error(msg: string, fields?: Record<string, unknown>): void {
    this.log("error", msg, fields);
  }
  /** A fatal line is written at once: the process is usually about to exit. */
  fatal(msg: string, fields?: Record<string, unknown>): void {
    this.log("fatal", msg, fields);
    this.flush();
  }

  /** Whether a record at `level` would be written. */
  enabled(level: RecordLevel): boolean {
    return RANK[level] >= this.#minimum;
  }

  log(level: RecordLevel, msg: string, fields?: Record<string, unknown>): void {
    if (RANK[level] < this.#minimum) return;
    // With telemetry on, a line written inside a span names it (docs/observability.md, "Telemetry").
    const ids = traceFields();
    const head = ids === null
      ? `{"ts":"${this.#timestamp()}","level":"${level}","msg":${JSON.stringify(msg)}`
      : `{"ts":"${this.#timestamp()}","level":"${level}","msg":${
        JSON.stringify(msg)
      },"trace_id":"${ids.trace_id}","span_id":"${ids.span_id}"`;
    const tail = fields === undefined ? "" : JSON.stringify(fields).slice(1, -1);
    if (this.#throughConsole) {
      try {
        console.log(tail === "" ? `${head}}` : `${head},${tail}}`);
      } catch {
        // stdout closed: nothing more we can do with a log line
      }
      return;
    }
    this.#pending += tail === "" ? `${head}}\n` : `${head},${tail}}\n`;
    if (this.#pending.length >= FLUSH_BYTES) {
      this.flush();
    } else if (!this.#scheduled) {
      this.#scheduled = true;
      setTimeout(() => this.flush(), 0);
    }
  }

  #timestamp(): string {
    const now = Date.now();
    if (now !== this.#stampMs) {
      this.#stampMs = now;
      this.#stamp = new Date(now).toISOString();
    }
    return this.#stamp;
  }

  /** Describes an error for a log line: its class, and its stack outside production. */
  errorFields(error: unknown): Record<string, unknown> {
    if (!(error instanceof Error)) return { errorClass: typeof error };
    const fields: Record<string, unknown> = { errorClass: error.constructor.name };
    if (!this.#production) {
      fields.errorMessage = error.message;
      fields.stack = error.stack;
    }
    return fields;
  }

  /** Writes everything buffered. */
  flush(): void {
    this.#scheduled = false;
    if (this.#pending === "") return;
    const text = this.#pending;
    this.#pending = "";
    this.#write(encoder.encode(text));
  }
}

function writeStdout(bytes: Uint8Array): void {
  let offset = 0;
  while (offset < bytes.length) {
    try {
      offset += Deno.stdout.writeSync(bytes.subarray(offset));
    } catch {
      return; // stdout closed: nothing more we can do with a log line
    }
  }
}

/** The process-wide logger, configured at boot. */
export const log: Logger = new Logger();
