/**
 * What `deno task demo` and `deno task dev` print with: colours on a terminal only, and commands
 * written so that they can be copied into a shell as they are.
 *
 * @module
 */

const COLOR = Deno.stdout.isTerminal() && !Deno.noColor;

function paint(code: string, text: string): string {
  return COLOR ? `\x1b[${code}m${text}\x1b[0m` : text;
}

/** Bold, on a terminal. */
export function bold(text: string): string {
  return paint("1", text);
}

/** Dimmed, on a terminal. */
export function dim(text: string): string {
  return paint("2", text);
}

/** Cyan (commands), on a terminal. */
export function cyan(text: string): string {
  return paint("36", text);
}

/** Green (success), on a terminal. */
export function green(text: string): string {
  return paint("32", text);
}

/** Red (failure), on a terminal. */
export function red(text: string): string {
  return paint("31", text);
}

/** A shell word, quoted only when it needs to be. */
export function shellWord(word: string): string {
  return /^[\w./:=@,+%-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/** A curl command's words after `curl -s URL`: its headers and a JSON body, quoted. */
export function curlArguments(headers: Record<string, string>, body: string): string[] {
  return [
    ...Object.entries(headers).map(([name, value]) => `-H "${name}: ${value}"`),
    `-d ${shellWord(body)}`,
  ];
}
