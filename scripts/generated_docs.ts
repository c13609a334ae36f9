/**
 * Documentation made from the tables of the source (the CLI's commands, the configuration's
 * variables): each part is a whole file or the lines between two marker comments of one, written
 * by a `deno task docs:*` script and checked by tests/docs_test.ts, which fails while a part
 * differs from its table.
 * @module
 */

/** A part of a file that a script writes from a table. */
export interface GeneratedPart {
  /** The file, relative to the repository root. */
  readonly file: string;
  /** The lines before and after the part, or `null` when it is the whole file. */
  readonly markers: { readonly start: string; readonly end: string } | null;
  /** The task that writes it (`docs:cli`). */
  readonly task: string;
  /** Its content, made from the table. */
  render(): string;
}

const ROOT = new URL("../", import.meta.url);

/** The part's content in `text`, the file's; `null` when the file lacks its markers. */
export function partContent(text: string, part: GeneratedPart): string | null {
  if (part.markers === null) return text;
  const start = text.indexOf(part.markers.start);
  const end = text.indexOf(part.markers.end);
  if (start === -1 || end < start) return null;
  return text.slice(start + part.markers.start.length, end);
}

/**
 * Whether `written`, the part's content in its file, is what `render` makes. Markdown is compared
 * word by word, since the tasks let `deno fmt` rewrap it and pad its tables.
 */
export function isCurrent(part: GeneratedPart, written: string): boolean {
  if (!part.file.endsWith(".md")) return written === part.render();
  const words = (text: string) =>
    text.replace(/-{3,}/g, "---").split(/\s+/).filter((word) => word !== "").join(" ");
  return words(written) === words(part.render());
}

/** Writes each part into its file. */
export async function writeParts(parts: readonly GeneratedPart[]): Promise<void> {
  for (const part of parts) {
    const url = new URL(part.file, ROOT);
    if (part.markers === null) {
      await Deno.writeTextFile(url, part.render());
      continue;
    }
    const text = await Deno.readTextFile(url);
    const { start, end } = part.markers;
    const from = text.indexOf(start);
    const to = text.indexOf(end);
    if (from === -1 || to < from) throw new Error(`${part.file} has no "${start}" marker`);
    await Deno.writeTextFile(
      url,
      `${text.slice(0, from)}${start}\n\n${part.render()}\n${text.slice(to)}`,
    );
  }
}
