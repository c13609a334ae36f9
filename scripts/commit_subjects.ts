/**
 * Commit messages keep the project's rule (CONTRIBUTING.md, "Habits"): a subject of at most 72
 * characters, then a blank line before any body.
 *
 *   deno task check:commits            every commit since this check was added (CI runs it)
 *   scripts/commit_subjects.ts --message-file F   one message (the commit-msg hook in .githooks/)
 *
 * Commits older than this script are left alone: history is not rewritten.
 * @module
 */

/** The longest subject. */
export const MAX_SUBJECT = 72;

/** What is wrong with `message`, if anything (git's comment lines are left out). */
export function messageProblems(message: string): string[] {
  const lines = message.split("\n").filter((line) => !line.startsWith("#"));
  const subject = lines[0]?.trimEnd() ?? "";
  const problems: string[] = [];
  if (subject === "") problems.push("the subject is empty");
  if (subject.length > MAX_SUBJECT) {
    problems.push(
      `the subject is ${subject.length} characters, more than ${MAX_SUBJECT}: put the rest in the body`,
    );
  }
  if (lines.length > 1 && lines[1].trim() !== "") {
    problems.push("the subject is not followed by a blank line");
  }
  return problems;
}

async function git(...args: string[]): Promise<string> {
  const output = await new Deno.Command("git", { args, stdout: "piped", stderr: "piped" }).output();
  if (!output.success) throw new Error(new TextDecoder().decode(output.stderr).trim());
  return new TextDecoder().decode(output.stdout);
}

/** The commits to check: from the one that added this script to HEAD (all, in a shallow clone). */
async function commitsToCheck(): Promise<string[]> {
  const added = (await git(
    "log",
    "--diff-filter=A",
    "--format=%H",
    "--",
    "scripts/commit_subjects.ts",
  )).trim().split("\n").filter((line) => line !== "").at(-1);
  const range = added === undefined ? ["-n", "50", "HEAD"] : [`${added}^..HEAD`];
  const hashes = (await git("rev-list", ...range).catch(() => git("rev-list", "HEAD"))).trim();
  return hashes === "" ? [] : hashes.split("\n");
}

async function main(args: string[]): Promise<number> {
  if (args[0] === "--message-file" && args[1] !== undefined) {
    const problems = messageProblems(await Deno.readTextFile(args[1]));
    for (const problem of problems) console.error(`commit message: ${problem}`);
    return problems.length === 0 ? 0 : 1;
  }
  if (args.length > 0) {
    console.error("usage: commit_subjects.ts [--message-file FILE]");
    return 2;
  }
  let bad = 0;
  for (const hash of await commitsToCheck()) {
    const problems = messageProblems(await git("log", "-1", "--format=%B", hash));
    for (const problem of problems) console.error(`${hash.slice(0, 10)}: ${problem}`);
    if (problems.length > 0) bad++;
  }
  return bad === 0 ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
