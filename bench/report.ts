/**
 * The generated parts of `docs/benchmarks.md`. Each table the benchmarks write stands between a
 * pair of markers, `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`; rewriting a table
 * replaces what is between its pair and leaves every other character of the page as it was.
 *
 * Everything here is pure: `bench/all.ts` reads and writes the file.
 * @module
 */
import { type CoresBusy, pct } from "./support.ts";

/** Thrown when a page lacks a marker, holds one twice, or holds a pair in the wrong order. */
export class MarkerError extends Error {
  /** Always `BENCH_MARKER`. */
  readonly code = "BENCH_MARKER";
  constructor(message: string) {
    super(message);
    this.name = "MarkerError";
  }
}

/** The markers around the section `name` (lower case letters, digits and dashes). */
export function markers(name: string): { begin: string; end: string } {
  if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(name)) {
    throw new MarkerError(`"${name}" is not a section name: use lower case, digits and dashes`);
  }
  return { begin: `<!-- bench:${name}:begin -->`, end: `<!-- bench:${name}:end -->` };
}

/**
 * `document` with what stands between the markers of section `name` replaced by `content`,
 * set off from the markers by a blank line on each side (nothing between them when `content` is
 * blank). The markers themselves and everything outside them are kept as they are.
 * @throws {MarkerError} when either marker is missing or repeated, or the end comes first.
 */
export function replaceSection(document: string, name: string, content: string): string {
  const { begin, end } = markers(name);
  const at = (marker: string) => {
    const first = document.indexOf(marker);
    if (first === -1) {
      throw new MarkerError(
        `the page has no ${marker}: add the pair ${begin} ... ${end} where the table goes`,
      );
    }
    if (document.indexOf(marker, first + marker.length) !== -1) {
      throw new MarkerError(`the page holds ${marker} more than once`);
    }
    return first;
  };
  const from = at(begin) + begin.length;
  const to = at(end);
  if (to < from) throw new MarkerError(`${end} comes before ${begin}`);
  const body = content.trim();
  const inner = body === "" ? "\n" : `\n\n${body}\n\n`;
  return document.slice(0, from) + inner + document.slice(to);
}

/**
 * `document` with every section of `sections` (name -> content) replaced, as
 * {@linkcode replaceSection} does. All markers are checked before anything is replaced, so a
 * missing one leaves no half-rewritten page behind.
 * @throws {MarkerError} as {@linkcode replaceSection}.
 */
export function replaceSections(document: string, sections: Record<string, string>): string {
  for (const name of Object.keys(sections)) replaceSection(document, name, "");
  let rewritten = document;
  for (const [name, content] of Object.entries(sections)) {
    rewritten = replaceSection(rewritten, name, content);
  }
  return rewritten;
}

/** Where and how a benchmark ran, for the line above its table. */
export interface RunCaption {
  /** When the benchmark began, as an ISO 8601 time. */
  startedAt: string;
  /** The command that ran it, e.g. `deno task bench --duration 10`. */
  command: string;
  /** The service's commit, e.g. `454b900`, or `454b900 with uncommitted changes`. */
  commit: string;
  /** The machine, e.g. `2 cores, 23.4 GiB, linux 6.18.0 x86_64, Deno 2.9.6, wrk 4.1.0`. */
  machine: string;
  /** How busy the server's and the load's cores were in the second before it began. */
  busyBefore?: CoresBusy;
}

/** The line above a generated table: date, commit, command and machine. */
export function formatRunCaption(run: RunCaption): string {
  const busy = run.busyBefore === undefined
    ? ""
    : ` Cores 0 and 1 were ${pct(run.busyBefore.serverCore)} and ${
      pct(run.busyBefore.loadCore)
    } busy in the second before it began.`;
  return `Last run: ${formatDate(run.startedAt)}, commit ${run.commit}, \`${run.command}\`, on ` +
    `${run.machine}.${busy}`;
}

/** An ISO 8601 time as `2026-11-21 09:09 UTC`. */
export function formatDate(iso: string): string {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) throw new RangeError(`not a time: ${iso}`);
  return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}
