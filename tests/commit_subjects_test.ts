/** The commit message rule of scripts/commit_subjects.ts (CONTRIBUTING.md, "Habits"). */
import assert from "node:assert/strict";
import { MAX_SUBJECT, messageProblems } from "../scripts/commit_subjects.ts";

Deno.test("commit messages: a short subject, then a blank line before the body", () => {
  assert.deepEqual(messageProblems("Fix the thing\n\nBecause it broke.\n"), []);
  assert.deepEqual(messageProblems("x".repeat(MAX_SUBJECT)), []);
  assert.deepEqual(messageProblems("Subject\n# a comment git leaves\n"), []);
  assert.match(messageProblems("x".repeat(MAX_SUBJECT + 1)).join(), /73 characters/);
  assert.match(messageProblems("Subject\nbody at once").join(), /blank line/);
  assert.match(messageProblems("\n\nbody").join(), /empty/);
});
