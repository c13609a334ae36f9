/**
 * `deno task docs:cli`: writes the CLI reference into docs/operations.md ("Admin CLI"), between
 * the two marker comments, from the command table in src/cli/mod.ts. tests/docs_test.ts fails
 * while the two differ.
 * @module
 */
import { COMMAND_GROUPS } from "../src/cli/mod.ts";
import { referenceMarkdown } from "../src/cli/help.ts";

/** The line before the generated reference. */
export const CLI_REFERENCE_START =
  "<!-- cli-reference: made from src/cli/mod.ts by `deno task docs:cli`; edit the table there -->";
/** The line after it. */
export const CLI_REFERENCE_END = "<!-- cli-reference end -->";

const OPERATIONS = new URL("../docs/operations.md", import.meta.url);

if (import.meta.main) {
  const text = await Deno.readTextFile(OPERATIONS);
  const start = text.indexOf(CLI_REFERENCE_START);
  const end = text.indexOf(CLI_REFERENCE_END);
  if (start === -1 || end < start) {
    console.error("docs/operations.md has no CLI reference markers");
    Deno.exit(1);
  }
  const reference = referenceMarkdown(COMMAND_GROUPS);
  await Deno.writeTextFile(
    OPERATIONS,
    `${text.slice(0, start)}${CLI_REFERENCE_START}\n\n${reference}\n${text.slice(end)}`,
  );
}
