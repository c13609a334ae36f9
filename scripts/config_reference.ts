/**
 * `deno task docs:config`: writes the configuration reference, docs/config_reference.md ("All
 * variables"), and the example environment file, deploy/purchase-relay.env.example, from the table
 * of variables in src/config.ts. tests/docs_test.ts fails while they differ from the table.
 * @module
 */
import { CONFIG_GROUPS, CONFIG_VARIABLES, type ConfigVariable } from "../src/config.ts";
import { VALUE_FORMATS } from "../src/config_parsers.ts";
import { type GeneratedPart, writeParts } from "./generated_docs.ts";

const MADE_FROM_TABLE = "made from src/config.ts by `deno task docs:config`; edit the table there";

/** The reference in docs/config_reference.md: the formats, then one row per variable. */
export const CONFIG_REFERENCE: GeneratedPart = {
  file: "docs/config_reference.md",
  markers: {
    start: `<!-- config-reference: ${MADE_FROM_TABLE} -->`,
    end: "<!-- config-reference end -->",
  },
  task: "docs:config",
  render: referenceMarkdown,
};

/** The example environment file, a production deployment's: every variable, with its default. */
export const ENV_EXAMPLE: GeneratedPart = {
  file: "deploy/purchase-relay.env.example",
  markers: null,
  task: "docs:config",
  render: environmentExample,
};

/** What `deno task docs:config` writes. */
export const CONFIG_PARTS: readonly GeneratedPart[] = [CONFIG_REFERENCE, ENV_EXAMPLE];

/** How an unset variable reads (Markdown). */
export function defaultOf(row: ConfigVariable): string {
  return row.defaultText ?? `\`${row.default}\``;
}

/** What a variable accepts (Markdown). */
export function acceptedValuesOf(row: ConfigVariable): string {
  const needs = row.needs === undefined ? "" : `; only with \`${row.needs}\``;
  return `${row.parser.accepts}${needs}`;
}

function referenceMarkdown(): string {
  const cells = (values: string[]) => `| ${values.join(" | ")} |`;
  return [
    `Formats: ${VALUE_FORMATS}.`,
    "",
    cells(["Variable", "Default", "Meaning", "Valid values"]),
    cells(["---", "---", "---", "---"]),
    ...CONFIG_VARIABLES.map((row) =>
      cells([`\`${row.name}\``, defaultOf(row), row.description, acceptedValuesOf(row)])
    ),
  ].join("\n") + "\n";
}

const WIDTH = 96;

const ENV_EXAMPLE_HEADER = `
The environment of purchase-relay.service, installed as /etc/purchase-relay/env (owner root, mode
0600: it holds ENCRYPTION_KEY and the database password). The same file serves the admin CLI and
\`docker run --env-file\`. Every variable the service reads is listed below with its meaning and
default, as in docs/config_reference.md ("All variables").

Format: one VARIABLE=value per line, no spaces around "=". Write values without quotes,
backslashes or $ (systemd interprets them, \`docker run --env-file\` does not); base64 and URLs need
none. A line starting with # is a comment. An empty value counts as unset. An invalid value stops
the boot with startup_failed (exit code 1).`;

function environmentExample(): string {
  const paragraphs = ENV_EXAMPLE_HEADER.trim().split("\n\n").map((text) => text.split("\n"));
  const lines = paragraphs.flatMap((paragraph, i) => [
    ...(i > 0 ? ["#"] : []),
    ...comment(paragraph.join(" ")),
  ]);
  lines.push("#", ...comment(`Formats: ${VALUE_FORMATS}.`));
  for (const group of CONFIG_GROUPS) {
    lines.push("", `# ---- ${group.title} `.padEnd(WIDTH - 4, "-"));
    for (const row of group.variables) {
      const shown = row.example === undefined
        ? `#${row.name}=${row.default ?? ""}`
        : "set" in row.example
        ? `${row.name}=${row.example.set}`
        : `#${row.name}=${row.example.shown}`;
      lines.push(
        "",
        ...comment(row.description),
        ...comment(`Valid: ${acceptedValuesOf(row)}. ${unsetSentence(row)}`),
        shown,
      );
    }
  }
  return lines.join("\n") + "\n";
}

/** What an unset variable means, as a sentence (Markdown). */
function unsetSentence(row: ConfigVariable): string {
  const text = defaultOf(row);
  return text.startsWith("unset: ")
    ? `Unset: ${text.slice("unset: ".length)}.`
    : `Default: ${text}.`;
}

/**
 * Markdown as `#` lines of at most {@linkcode WIDTH} characters: no backticks, and links as the
 * page of docs/ and the heading they point to. A code span is never split across lines.
 */
function comment(markdown: string): string[] {
  const text = markdown.replace(/\[([^\]]+)\]\(([a-z_]+\.md)#[^)]+\)/g, 'docs/$2, "$1"');
  const words = (text.match(/(?:`[^`]*`|[^\s`])+/g) ?? []).map((word) => word.replaceAll("`", ""));
  const lines: string[] = [];
  let line = "#";
  for (const word of words) {
    if (line !== "#" && line.length + 1 + word.length > WIDTH) {
      lines.push(line);
      line = "#";
    }
    line += ` ${word}`;
  }
  lines.push(line);
  return lines;
}

if (import.meta.main) await writeParts(CONFIG_PARTS);
