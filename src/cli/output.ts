/**
 * What the CLI prints. Piped, a command prints one JSON object on stdout, and an error one
 * `{"error", "message"}` JSON object on stderr: the contract scripts rely on. On a terminal, or
 * with `--pretty`, the same values are printed as readable text; `--json` keeps JSON on a
 * terminal (docs/cli_reference.md, "Admin CLI").
 * @module
 */
import type { GlobalFlags } from "./args.ts";
import type { UsageError } from "./command.ts";

/** How a stream's values are printed. */
export type OutputStyle = "json" | "text";

/** Which streams are terminals. */
export interface Terminals {
  stdout: boolean;
  stderr: boolean;
}

/** The styles of stdout and stderr for the flags given. */
export function outputStyles(
  flags: GlobalFlags,
  terminals: Terminals,
): { stdout: OutputStyle; stderr: OutputStyle } {
  const style = (terminal: boolean): OutputStyle =>
    flags.pretty ? "text" : flags.json ? "json" : terminal ? "text" : "json";
  return { stdout: style(terminals.stdout), stderr: style(terminals.stderr) };
}

/** One value as the style prints it, ending with a line break. */
export function formatValue(value: Record<string, unknown>, style: OutputStyle): string {
  return style === "json" ? `${JSON.stringify(value)}\n` : renderText(value);
}

/** What an error prints: its code, message and the fields a command adds. */
export interface ErrorReport {
  error: string;
  message: string;
  details?: Record<string, unknown>;
  /** For usage errors: close matches, and the command that shows the help. */
  suggestions?: string[];
  help?: string;
}

/** An error as the style prints it. */
export function formatError(report: ErrorReport, style: OutputStyle): string {
  if (style === "json") {
    const body: Record<string, unknown> = { ...report.details };
    body.error = report.error;
    body.message = report.message;
    if (report.suggestions?.length) body.didYouMean = report.suggestions;
    if (report.help) body.help = report.help;
    return `${JSON.stringify(body)}\n`;
  }
  let text = `purchase-relay: ${report.message} [${report.error}]\n`;
  if (report.details && Object.keys(report.details).length > 0) {
    text += renderText(report.details);
  }
  if (report.suggestions?.length) {
    text += `Did you mean ${report.suggestions.map((s) => `"${s}"`).join(" or ")}?\n`;
  }
  if (report.help) text += `Run "${report.help}" for help.\n`;
  return text;
}

/** The report of a usage error; `help` is the command line that shows the way out. */
export function usageReport(error: UsageError, help: string): ErrorReport {
  return { error: error.code, message: error.message, suggestions: error.suggestions, help };
}

/** Writes all of `text`. */
export async function writeText(stream: typeof Deno.stdout, text: string): Promise<void> {
  const bytes = new TextEncoder().encode(text);
  let offset = 0;
  while (offset < bytes.length) offset += await stream.write(bytes.subarray(offset));
}

/** Wider tables are printed as one block per row. */
const TABLE_WIDTH = 120;

/**
 * A value as readable text: `name: value` lines, nested objects indented, lists of flat records
 * as a table (or, too wide for one, a block per record), `-` for null.
 */
export function renderText(value: Record<string, unknown>): string {
  return `${objectLines(value, "").join("\n")}\n`;
}

function objectLines(object: Record<string, unknown>, indent: string): string[] {
  const entries = Object.entries(object);
  if (entries.length === 0) return [`${indent}(none)`];
  const width = Math.max(...entries.map(([key]) => key.length)) + 1;
  const lines: string[] = [];
  for (const [key, value] of entries) {
    const label = `${indent}${`${key}:`.padEnd(width)}`;
    if (isScalar(value)) {
      lines.push(`${label} ${scalar(value)}`);
    } else if (Array.isArray(value)) {
      if (value.length === 0) lines.push(`${label} (none)`);
      else if (value.every(isScalar)) lines.push(`${label} ${value.map(scalar).join(", ")}`);
      else lines.push(`${indent}${key}:`, ...listLines(value, `${indent}  `));
    } else {
      lines.push(
        `${indent}${key}:`,
        ...objectLines(value as Record<string, unknown>, `${indent}  `),
      );
    }
  }
  return lines;
}

function listLines(items: unknown[], indent: string): string[] {
  const records =
    items.every((item) => item !== null && typeof item === "object" && !Array.isArray(item))
      ? items as Record<string, unknown>[]
      : null;
  if (records && records.every((record) => Object.values(record).every(isScalar))) {
    const table = tableLines(records, indent);
    if (Math.max(...table.map((line) => line.length)) <= TABLE_WIDTH) return table;
  }
  const lines: string[] = [];
  items.forEach((item, i) => {
    if (i > 0) lines.push("");
    if (isScalar(item)) lines.push(`${indent}- ${scalar(item)}`);
    else if (Array.isArray(item)) lines.push(...listLines(item, `${indent}  `));
    else lines.push(...objectLines(item as Record<string, unknown>, indent));
  });
  return lines;
}

function tableLines(records: Record<string, unknown>[], indent: string): string[] {
  const columns = [...new Set(records.flatMap((record) => Object.keys(record)))];
  const rows = records.map((record) => columns.map((column) => scalar(record[column] ?? null)));
  const widths = columns.map((column, i) =>
    Math.max(column.length, ...rows.map((row) => row[i].length))
  );
  const line = (cells: string[]) =>
    `${indent}${cells.map((cell, i) => cell.padEnd(widths[i])).join("  ")}`.trimEnd();
  return [line(columns), ...rows.map(line)];
}

function isScalar(value: unknown): boolean {
  return value === null || value === undefined || typeof value !== "object";
}

function scalar(value: unknown): string {
  if (value === null || value === undefined) return "-";
  if (typeof value === "string") return /[\n\r\t]/.test(value) ? JSON.stringify(value) : value;
  return String(value);
}
