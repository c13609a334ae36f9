/**
 * `deno task docs:cli`: writes the CLI reference into docs/cli_reference.md ("Commands"), between
 * the two marker comments, from the command table in src/cli/mod.ts. tests/docs_test.ts fails
 * while the two differ.
 * @module
 */
import { COMMAND_GROUPS } from "../src/cli/mod.ts";
import { referenceMarkdown } from "../src/cli/help.ts";
import { type GeneratedPart, writeParts } from "./generated_docs.ts";

/** The CLI reference in docs/cli_reference.md. */
export const CLI_REFERENCE: GeneratedPart = {
  file: "docs/cli_reference.md",
  markers: {
    start:
      "<!-- cli-reference: made from src/cli/mod.ts by `deno task docs:cli`; edit the table there -->",
    end: "<!-- cli-reference end -->",
  },
  task: "docs:cli",
  render: () => referenceMarkdown(COMMAND_GROUPS),
};

if (import.meta.main) await writeParts([CLI_REFERENCE]);
