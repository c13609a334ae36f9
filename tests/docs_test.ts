/**
 * The documentation against the source: every configuration variable, log message, error code and
 * CLI command the code has must be documented, and nothing documented may be unknown to the code;
 * every page stays short enough to read, and every link between pages resolves. The lists are derived from the source itself (its tables, or its files), so
 * a variable or a log message added later without documentation fails this test.
 */
import assert from "node:assert/strict";
import { CONFIG_VARIABLES, parseDuration } from "../src/config.ts";
import { COMMANDS } from "../src/cli/mod.ts";
import { CLI_REFERENCE } from "../scripts/cli_reference.ts";
import { CONFIG_PARTS, defaultOf } from "../scripts/config_reference.ts";
import { type GeneratedPart, isCurrent, partContent } from "../scripts/generated_docs.ts";

const ROOT = new URL("../", import.meta.url);

function read(path: string): string {
  return Deno.readTextFileSync(new URL(path, ROOT));
}

/** Every `.ts` file under `dir`, as paths relative to the repository root. */
function sourceFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(new URL(`${dir}/`, ROOT))) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory && entry.name !== "node_modules") files.push(...sourceFiles(path));
    else if (entry.isFile && entry.name.endsWith(".ts")) files.push(path);
  }
  return files.sort();
}

function matchesOf(text: string, pattern: RegExp, group = 1): string[] {
  return [...text.matchAll(pattern)].map((match) => match[group]);
}

// ---------------------------------------------------------------------------------------------
// Reading Markdown

/** The lines of `markdown` with fenced code blocks blanked, so `# comments` in them are not headings. */
function proseLines(markdown: string): string[] {
  let fenced = false;
  return markdown.split("\n").map((line) => {
    if (/^\s*```/.test(line)) {
      fenced = !fenced;
      return "";
    }
    return fenced ? "" : line;
  });
}

/** The text under `heading` (e.g. `### All variables`) up to the next heading of its level or above. */
function section(markdown: string, heading: string): string {
  const level = heading.indexOf(" ");
  const lines = proseLines(markdown);
  const start = lines.indexOf(heading);
  assert.notEqual(start, -1, `no heading "${heading}"`);
  const end = lines.findIndex((line, i) => {
    if (i <= start) return false;
    const match = /^(#+) /.exec(line);
    return match !== null && match[1].length <= level;
  });
  return lines.slice(start + 1, end === -1 ? undefined : end).join("\n");
}

/** The body rows of every table in `text` (header and separator lines left out), as cells. */
function tableRows(text: string): string[][] {
  const lines = text.split("\n").filter((line) => line.startsWith("|"));
  const separator = (line: string) => /^\|\s*:?-{3,}/.test(line);
  return lines
    .filter((line, i) => !separator(line) && !separator(lines[i + 1] ?? ""))
    .map((line) =>
      line.trim().replace(/^\||\|$/g, "").split(/(?<!\\)\|/).map((cell) => cell.trim())
    );
}

/** The backticked name in a table's first cell (`` `PORT` `` -> `PORT`), or null. */
function nameCell(cell: string): string | null {
  const match = /^`([^`]+)`$/.exec(cell);
  return match ? match[1] : null;
}

/** GitHub's anchor of a heading. */
function slug(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-");
}

function anchorsOf(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const line of proseLines(markdown)) {
    const match = /^#{1,6} (.+)$/.exec(line);
    if (!match) continue;
    const base = slug(match[1]);
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    anchors.add(count === 0 ? base : `${base}-${count}`);
  }
  return anchors;
}

// ---------------------------------------------------------------------------------------------
// What the source says

const configReference = read("docs/config_reference.md");
const logReference = read("docs/log_reference.md");
const troubleshooting = read("docs/troubleshooting.md");
const cliReference = read("docs/cli_reference.md");
const readme = read("README.md");

/** Every page of docs/, by name. */
function docPages(): Map<string, string> {
  const pages = new Map<string, string>();
  for (const entry of Deno.readDirSync(new URL("docs/", ROOT))) {
    if (entry.isFile && entry.name.endsWith(".md")) {
      pages.set(entry.name, read(`docs/${entry.name}`));
    }
  }
  return pages;
}
const allSources = [...sourceFiles("src"), "main.ts"];

/** Every environment variable the service reads: the rows of the configuration table. */
function configVariables(): string[] {
  return CONFIG_VARIABLES.map((row) => row.name).sort();
}

/** Literal defaults: the text read in place of an unset variable. */
function literalDefaults(): Map<string, string> {
  const defaults = new Map<string, string>();
  for (const row of CONFIG_VARIABLES) {
    if (row.default !== undefined && row.defaultText === undefined) {
      defaults.set(row.name, row.default);
    }
  }
  return defaults;
}

/** Every log message written through the logger, with the levels it is written at. */
function logMessages(): Map<string, Set<string>> {
  const messages = new Map<string, Set<string>>();
  const add = (msg: string, level: string) => {
    if (!messages.has(msg)) messages.set(msg, new Set());
    messages.get(msg)!.add(level);
  };
  for (const file of allSources) {
    if (file === "src/observability/log.ts") continue; // the logger itself
    const text = read(file);
    const byMethod = /(?<!console)\.(debug|info|warn|error|fatal)\(\s*"([a-z][a-z0-9_]*)"/g;
    for (const match of text.matchAll(byMethod)) add(match[2], match[1]);
    const byLevel = /\.log\(\s*"(debug|info|warn|error|fatal)",\s*"([a-z][a-z0-9_]*)"/g;
    for (const match of text.matchAll(byLevel)) add(match[2], match[1]);
  }
  return messages;
}

/** The API's error codes and statuses (`ERROR_STATUS` in src/errors.ts). */
function errorStatuses(): Map<string, number> {
  const block = /ERROR_STATUS = \{([\s\S]*?)\}/.exec(read("src/errors.ts"));
  assert.ok(block, "src/errors.ts has no ERROR_STATUS table");
  const statuses = new Map<string, number>();
  for (const match of block[1].matchAll(/([A-Z][A-Z_]+):\s*(\d{3})/g)) {
    statuses.set(match[1], Number(match[2]));
  }
  return statuses;
}

/** Domain codes: the `valid: false` results of the verify modules. */
function domainCodes(): string[] {
  const codes = new Set<string>();
  for (const file of allSources.filter((path) => path.endsWith("/verify.ts"))) {
    for (const code of matchesOf(read(file), /\berror:\s*"([A-Z][A-Z_]+)"/g)) codes.add(code);
  }
  return [...codes].sort();
}

/** The files `entries` import, transitively through relative imports, `entries` included. */
function importClosure(entries: string[]): string[] {
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const specifier of matchesOf(read(file), /from\s+"(\.{1,2}\/[^"]+\.ts)"/g)) {
      const resolved = new URL(specifier, new URL(file, ROOT)).href.slice(ROOT.href.length);
      visit(resolved);
    }
  };
  entries.forEach(visit);
  return [...seen].sort();
}

/** The codes a CLI command can print as `error`. */
function cliCodes(): string[] {
  const cli = sourceFiles("src/cli").map(read).join("\n");
  const codes = new Set([
    ...matchesOf(cli, /new CommandError\(\s*"([A-Z][A-Z_]+)"/g),
    ...matchesOf(cli, /"(COMMAND_FAILED)"/g),
    ...matchesOf(read("main.ts"), /\berror:\s*"([A-Z][A-Z_]+)"/g),
  ]);
  // Errors of the modules the CLI runs carry their own code, which it prints as is.
  for (const file of importClosure(["src/cli/mod.ts"])) {
    for (const code of matchesOf(read(file), /super\(\s*"([A-Z][A-Z_]+)"/g)) codes.add(code);
  }
  return [...codes].sort();
}

/** The CLI's commands: the rows of its command table. */
function cliCommands(): string[] {
  return COMMANDS.map((command) => command.words.join(" ")).sort();
}

/** A systemd time span (`60s`, `1min 30s`, `90`) in milliseconds. */
function systemdSpan(text: string): number {
  const units: Record<string, number> = {
    ms: 1,
    msec: 1,
    "": 1000,
    s: 1000,
    sec: 1000,
    second: 1000,
    seconds: 1000,
    m: 60_000,
    min: 60_000,
    minute: 60_000,
    minutes: 60_000,
    h: 3_600_000,
    hr: 3_600_000,
    hour: 3_600_000,
    hours: 3_600_000,
  };
  let total = 0;
  const parts = [...text.trim().matchAll(/(\d+(?:\.\d+)?)\s*([a-z]*)/g)];
  assert.ok(parts.length > 0, `"${text}" is not a time span`);
  for (const [, value, unit] of parts) {
    assert.ok(unit in units, `unknown time unit "${unit}" in "${text}"`);
    total += Number(value) * units[unit];
  }
  return total;
}

/** `Key=value` settings of a unit file (the last one wins, as in systemd). */
function unitSettings(unit: string): Map<string, string[]> {
  const settings = new Map<string, string[]>();
  for (const line of unit.split("\n")) {
    const match = /^([A-Za-z]+)=(.*)$/.exec(line.trim());
    if (!match) continue;
    if (!settings.has(match[1])) settings.set(match[1], []);
    settings.get(match[1])!.push(match[2]);
  }
  return settings;
}

/** Variables set (not commented out) in the example environment file. */
function exampleValues(example: string): Map<string, string> {
  const values = new Map<string, string>();
  for (const match of example.matchAll(/^([A-Z][A-Z0-9_]*)=(.*)$/gm)) {
    values.set(match[1], match[2].trim());
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// The tests

Deno.test("docs: the parts made from the source's tables are up to date", () => {
  const parts: GeneratedPart[] = [CLI_REFERENCE, ...CONFIG_PARTS];
  for (const part of parts) {
    const written = partContent(read(part.file), part);
    assert.ok(
      written !== null,
      `${part.file} has lost the markers of a part: ${part.markers?.start}`,
    );
    assert.ok(
      isCurrent(part, written),
      `${part.file} is out of date: run \`deno task ${part.task}\``,
    );
  }
});

Deno.test("docs: the configuration reference lists exactly the variables of src/config.ts", () => {
  const variables = configVariables();
  assert.ok(variables.length >= 20, `only ${variables.length} variables in the table`);
  for (const expected of ["PORT", "DATABASE_URL", "ENCRYPTION_KEY", "SHUTDOWN_TIMEOUT"]) {
    assert.ok(variables.includes(expected), `${expected} not found in src/config.ts`);
  }

  const rows = tableRows(section(configReference, "## All variables"));
  const documented = rows.map((row) => nameCell(row[0]));
  assert.ok(!documented.includes(null), "every row of the table names one variable in backticks");
  assert.deepEqual(
    [...documented].sort(),
    variables,
    "docs/config_reference.md 'All variables' must list exactly the variables the service reads",
  );
  const rowOf = new Map(rows.map((row) => [nameCell(row[0])!, row]));
  for (const variable of CONFIG_VARIABLES) {
    const row = rowOf.get(variable.name)!;
    assert.equal(row.length, 4, `${row[0]}: expected Variable | Default | Meaning | Valid values`);
    assert.equal(row[1], defaultOf(variable), `${variable.name}: its default`);
  }

  // The example environment file: each variable on one line, set or commented out.
  const example = read("deploy/purchase-relay.env.example");
  const listed = matchesOf(example, /^#?([A-Z][A-Z0-9_]*)=/gm);
  assert.deepEqual([...listed].sort(), variables, "deploy/purchase-relay.env.example");
});

Deno.test("docs: every log message of the source has its row, with its level", () => {
  const messages = logMessages();
  assert.ok(messages.size >= 15, `only ${messages.size} log messages found in the source`);
  for (const expected of ["listening", "shutdown", "http_request", "startup_failed"]) {
    assert.ok(messages.has(expected), `log message ${expected} not found in the source`);
  }

  // One heading per message, and a "**Level** ..." line per way it is written.
  const levelsOf = new Map<string, Set<string>>();
  let current: string | null = null;
  for (const line of proseLines(logReference)) {
    const heading = /^## `([a-z][a-z0-9_]*)`$/.exec(line);
    if (heading) {
      current = heading[1];
      assert.ok(!levelsOf.has(current), `log message "${current}" has two headings`);
      levelsOf.set(current, new Set());
      continue;
    }
    const level = /^\*\*Level\*\* ([a-z]+) /.exec(line);
    if (level) {
      assert.ok(current !== null, `a level line before any message: ${line}`);
      levelsOf.get(current)!.add(level[1]);
    }
  }
  for (const [msg, levels] of messages) {
    assert.ok(levelsOf.has(msg), `log message "${msg}" is not in docs/log_reference.md`);
    for (const level of levels) {
      assert.ok(
        levelsOf.get(msg)!.has(level),
        `log message "${msg}" is written at level ${level}; the page says ${[
          ...levelsOf.get(msg)!,
        ]}`,
      );
    }
  }
  for (const msg of levelsOf.keys()) {
    assert.ok(messages.has(msg), `the log reference lists "${msg}", which no code writes`);
    assert.ok(levelsOf.get(msg)!.size > 0, `log message "${msg}" has no **Level** line`);
  }
});

Deno.test("docs: every error code of the API has a troubleshooting row", () => {
  const statuses = errorStatuses();
  const domain = domainCodes();
  assert.ok(statuses.size >= 10, `only ${statuses.size} codes found in src/errors.ts`);
  for (const expected of ["UNAUTHENTICATED", "RATE_LIMITED", "INTERNAL_ERROR"]) {
    assert.ok(statuses.has(expected), `${expected} not found in src/errors.ts`);
  }
  for (const expected of ["TRANSACTION_NOT_FOUND", "PACKAGE_NAME_MISMATCH"]) {
    assert.ok(domain.includes(expected), `${expected} not found in the verify modules`);
  }

  const rows = tableRows(section(troubleshooting, "## By error code"));
  const rowOf = new Map(rows.map((row) => [nameCell(row[0]), row]));
  for (const [code, status] of statuses) {
    const row = rowOf.get(code);
    assert.ok(row, `error code ${code} has no row in docs/troubleshooting.md 'By error code'`);
    assert.ok(
      row[1].startsWith(String(status)),
      `${code}: the client sees ${status}, the table says "${row[1]}"`,
    );
  }
  for (const code of domain) {
    const row = rowOf.get(code);
    assert.ok(row, `domain code ${code} has no row in docs/troubleshooting.md 'By error code'`);
    assert.ok(row[1].startsWith("200"), `${code}: a domain result is HTTP 200`);
  }
});

Deno.test("docs: every CLI error code has a troubleshooting row", () => {
  const codes = cliCodes();
  assert.ok(codes.length >= 12, `only ${codes.length} CLI codes found in the source`);
  for (
    const expected of ["USAGE", "TENANT_NOT_FOUND", "ENCRYPTION_KEY_MISMATCH", "CONFIG_INVALID"]
  ) {
    assert.ok(codes.includes(expected), `CLI code ${expected} not found in the source`);
  }
  const documented = new Set(
    tableRows(section(troubleshooting, "## CLI errors")).map((row) => nameCell(row[0])),
  );
  for (const code of codes) {
    assert.ok(
      documented.has(code),
      `CLI code ${code} has no row in docs/troubleshooting.md 'CLI errors'`,
    );
  }
});

Deno.test("docs: every CLI command has its heading in the reference", () => {
  const commands = cliCommands();
  assert.ok(commands.length >= 15, `only ${commands.length} CLI commands found`);
  for (const expected of ["serve", "migrate", "version", "tenant create", "deliveries retry"]) {
    assert.ok(commands.includes(expected), `CLI command ${expected} not found in the source`);
  }
  for (const command of commands) {
    assert.ok(
      cliReference.includes(`### ${command}\n`),
      `CLI command "${command}" has no heading in docs/cli_reference.md`,
    );
  }
  // One home: the README links to the reference instead of repeating it.
  assert.ok(readme.includes("docs/cli_reference.md"), "README.md must link the reference");
  assert.ok(!readme.includes("| Command "), "README.md must not hold a table of CLI commands");
});

Deno.test("docs: the systemd unit runs serve and outlasts the shutdown drain", () => {
  const unit = read("deploy/purchase-relay.service");
  const settings = unitSettings(unit);
  const setting = (name: string) => {
    const values = settings.get(name);
    assert.ok(values, `deploy/purchase-relay.service has no ${name}=`);
    return values.at(-1)!;
  };

  const execStart = setting("ExecStart").split(/\s+/);
  assert.match(execStart[0], /\/purchase-relay$/);
  assert.deepEqual(execStart.slice(1), ["serve"], "ExecStart runs `purchase-relay serve`");
  assert.notEqual(setting("User"), "root");
  assert.equal(setting("EnvironmentFile"), "/etc/purchase-relay/env");
  assert.equal(setting("Restart"), "on-failure");
  assert.equal(setting("ProtectSystem"), "strict");
  assert.equal(setting("NoNewPrivileges"), "yes");
  for (const name of ["StateDirectory", "ReadWritePaths", "ProtectHome", "PrivateTmp"]) {
    setting(name);
  }
  assert.ok(Number(setting("LimitNOFILE")) >= 4096, "LimitNOFILE");
  const dataDir = settings.get("Environment")!.find((value) => value.startsWith("DATA_DIR="));
  assert.equal(dataDir, `DATA_DIR=/var/lib/${setting("StateDirectory")}`);
  // An environment file that leaves NODE_ENV out must not relax the callback checks or run on a
  // generated key: the unit's own default is production, as the container image's is.
  assert.ok(
    settings.get("Environment")!.includes("NODE_ENV=production"),
    "deploy/purchase-relay.service sets Environment=NODE_ENV=production",
  );
  assert.match(read("Dockerfile"), /^ENV .*\bNODE_ENV=production\b/m);

  // The drain: requests (SHUTDOWN_TIMEOUT), a request still running after it (UPSTREAM_TIMEOUT),
  // delivery attempts in flight (DELIVERY_TIMEOUT), then closing the database.
  const defaults = literalDefaults();
  const example = exampleValues(read("deploy/purchase-relay.env.example"));
  const durationOf = (name: string) => {
    const text = example.get(name) || defaults.get(name);
    assert.ok(text, `no default for ${name} in src/config.ts`);
    const ms = parseDuration(text);
    assert.ok(ms !== null, `${name}: "${text}" is not a duration`);
    return ms;
  };
  const close = /close: \(\) => sql\.end\(\{ timeout: (\d+) \}\)/.exec(read("src/db/connect.ts"));
  assert.ok(close, "src/db/connect.ts: the database close timeout was not found");
  const drainMs = durationOf("SHUTDOWN_TIMEOUT") + durationOf("UPSTREAM_TIMEOUT") +
    durationOf("DELIVERY_TIMEOUT") + Number(close[1]) * 1000;
  assert.ok(drainMs >= 30_000, `the drain bound looks too small: ${drainMs} ms`);
  const stopMs = systemdSpan(setting("TimeoutStopSec"));
  assert.ok(
    stopMs > drainMs,
    `TimeoutStopSec (${stopMs} ms) must exceed the shutdown drain (${drainMs} ms)`,
  );
});

Deno.test("docs: the deploy files are linked from deploy.md, not copied into it", () => {
  const deploy = read("docs/deploy.md");
  for (const path of ["deploy/purchase-relay.service", "deploy/purchase-relay.env.example"]) {
    assert.ok(deploy.includes(`](../${path})`), `docs/deploy.md must link ${path}`);
    // A copy would drift: one line of the file is enough to tell one.
    const line = read(path).split("\n").find((text) => text.length > 40 && !text.startsWith("#"));
    for (const [name, text] of docPages()) {
      assert.ok(!line || !text.includes(line), `docs/${name} copies ${path}; link it instead`);
    }
  }
});

Deno.test("docs: every page is read in one sitting, and every link between pages resolves", () => {
  const pages = docPages();
  const anchors = new Map([...pages].map(([name, text]) => [name, anchorsOf(text)]));
  for (const [name, text] of pages) {
    const bytes = new TextEncoder().encode(text).length;
    assert.ok(bytes <= 60_000, `docs/${name} is ${bytes} bytes: split it by task (at most 60 KB)`);
    for (const target of matchesOf(text, /\]\(#([^)]+)\)/g)) {
      assert.ok(anchors.get(name)!.has(target), `docs/${name} links to #${target}, which is gone`);
    }
  }
  for (const [file, text] of [["README.md", readme], ...pages] as [string, string][]) {
    for (
      const [, page, target] of text.matchAll(/\]\((?:\.\/|docs\/)?([a-z_]+\.md)#([^)\s]+)\)/g)
    ) {
      const inPage = anchors.get(page);
      if (inPage === undefined) continue; // a page outside docs/ (CONTRIBUTING.md, say)
      assert.ok(inPage.has(target), `${file} links to ${page}#${target}, which is gone`);
    }
  }
  for (
    const [page, names] of [
      ["config_reference.md", ["all-variables"]],
      ["log_reference.md", ["listening"]],
      ["cli_reference.md", ["admin-cli", "commands"]],
    ] as const
  ) {
    for (const anchor of names) assert.ok(anchors.get(page)!.has(anchor), `${page}#${anchor}`);
  }
});

Deno.test("docs: the README is a landing page, and every task it names exists", () => {
  assert.ok(
    new TextEncoder().encode(readme).length <= 15_000,
    "README.md is a landing page: at most about 15 KB; details belong in docs/",
  );
  const tasks = Object.keys(JSON.parse(read("deno.json")).tasks);
  const quickStart = /## Quick start\n[\s\S]*?```sh\n([\s\S]*?)```/.exec(readme);
  assert.ok(quickStart, "README.md has no Quick start with a sh block");
  assert.deepEqual(
    quickStart[1].trim().split("\n"),
    ["deno task start", "deno task test"],
    "the quick start is two commands: the service on the embedded engine, and the tests",
  );
  const named = matchesOf(readme, /deno task (?:-q )?([a-z][\w:-]*)/g);
  assert.ok(named.includes("dev") && named.includes("demo"), "README.md shows the demo and dev");
  for (const task of named) {
    assert.ok(tasks.includes(task), `README.md names \`deno task ${task}\`, which deno.json lacks`);
  }
  // One home: variables are documented in docs/config_reference.md, not in a README table.
  assert.doesNotMatch(readme, /^\| `[A-Z][A-Z0-9_]+` +\|/m, "README.md must not hold variables");
  const anchors = anchorsOf(read("docs/integration.md"));
  for (const target of matchesOf(readme, /integration\.md#([^)\s]+)\)/g)) {
    assert.ok(anchors.has(target), `README.md links to integration.md#${target}, which is gone`);
  }
});

// ---------------------------------------------------------------------------------------------
// Self-contained knowledge

/** The repository's own text: code, docs and deploy files (the store fixtures are not ours). */
function ownTextFiles(): string[] {
  const extensions = /\.(ts|mjs|md|yaml|py|go|rb|java|php|service|example)$/;
  const walk = (dir: string): string[] =>
    [...Deno.readDirSync(new URL(`${dir}/`, ROOT))].flatMap((entry) => {
      const path = `${dir}/${entry.name}`;
      // Packages a benchmark installs (bench/apple_node) are not the repository's text.
      if (entry.isDirectory) return entry.name === "node_modules" ? [] : walk(path);
      return entry.isFile && extensions.test(entry.name) ? [path] : [];
    });
  const dirs = ["src", "simulators", "tests", "resilience", "bench", "scripts", "docs", "deploy"];
  const files = ["main.ts", "README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md"];
  // This file names the patterns below, so it is left out.
  return [...dirs.flatMap(walk), ...files, "Dockerfile"].filter((path) =>
    path !== "tests/docs_test.ts"
  );
}

/**
 * Ways of citing documents that are not in the repository: section numbers of an interface
 * specification or of a decisions record, their file names, or a path outside the checkout. A
 * comment states the rule itself or names our own doc and heading instead.
 */
const OUTSIDE_CITATIONS: [RegExp, string][] = [
  [/\bspec(?:ification)?s?\s+(?:section\s+)?\d/i, "a section number of a specification"],
  [/\bSpec\b/, "the word Spec, as a citation"],
  [/\b(?:the|original|interface)\s+spec(?:ification)?\b/i, "a specification outside the repo"],
  [/\bspec-required\b/, "a specification outside the repo"],
  [/\bdecisions(?:\.md)?\s+\d|decisions\.md|\bproduct decisions\b/i, "a decisions record"],
  [/\binterface\.md\b/, "an interface document"],
  [/\.\.\/shared\b|\/work\/shared\b/, "a path outside the repository"],
];

Deno.test("docs: code and docs cite only the repository's own documents", () => {
  const found: string[] = [];
  for (const path of ownTextFiles()) {
    read(path).split("\n").forEach((line, i) => {
      for (const [pattern, what] of OUTSIDE_CITATIONS) {
        if (pattern.test(line)) found.push(`${path}:${i + 1}: ${what}: ${line.trim()}`);
      }
    });
  }
  assert.deepEqual(found, [], "state the rule, or cite docs/<name>.md and its heading");
});

Deno.test("docs: citations of a doc's heading name a heading it has", () => {
  const headings = new Map<string, Set<string>>();
  for (const entry of Deno.readDirSync(new URL("docs/", ROOT))) {
    if (!entry.isFile || !entry.name.endsWith(".md")) continue;
    const names = proseLines(read(`docs/${entry.name}`))
      .map((line) => /^#{1,6} (.+)$/.exec(line)?.[1])
      .filter((name) => name !== undefined)
      .map((name) => name.replaceAll("`", ""));
    headings.set(entry.name, new Set(names));
  }
  const broken: string[] = [];
  for (const path of ownTextFiles()) {
    // A citation may run over comment lines: join them first.
    const text = read(path).replace(/\n\s*(?:\*|\/\/|#)?\s*/g, " ");
    for (const [, doc, heading] of text.matchAll(/\bdocs\/([a-z_]+\.md), "([^"$]+)"[);]/g)) {
      const name = heading.replaceAll("`", "");
      if (!headings.get(doc)?.has(name)) broken.push(`${path}: docs/${doc}, "${heading}"`);
    }
  }
  assert.deepEqual(broken, [], "each cites a heading that does not exist (any more)");
});
