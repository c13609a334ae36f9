/**
 * Inputs several commands share: secrets read from a file or standard input, the webhook secret
 * options, and the checks of a tenant, a limit and a time given on the command line.
 * @module
 */
import type { Config } from "../config.ts";
import type { Database } from "../db/connect.ts";
import { findTenant, type Tenant } from "../db/tenants.ts";
import { base64url } from "../crypto/secrets.ts";
import { callbackUrlProblem } from "../delivery/callback_url.ts";
import { callbackPolicyOf } from "../delivery/callback_policy.ts";
import { CommandError, type OptionSpec, UsageError } from "./command.ts";

/**
 * Reads a secret input: the file at `path`, or standard input for `-`. Files keep secrets out of
 * the command line, which every user of the machine can read (`ps`, `/proc/<pid>/cmdline`).
 */
export async function readSecretInput(path: string): Promise<string> {
  if (path === "-") {
    if (Deno.stdin.isTerminal()) {
      // Someone at a keyboard: say what the silence is waiting for.
      await Deno.stderr.write(
        new TextEncoder().encode("Reading standard input; end it with Ctrl-D.\n"),
      );
    }
    return await new Response(Deno.stdin.readable).text();
  }
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    throw new CommandError(
      "FILE_UNREADABLE",
      `cannot read ${path}: ${error instanceof Error ? error.name : "error"}`,
    );
  }
}

/** The options that give a webhook secret; see {@linkcode givenWebhookSecret}. */
export const WEBHOOK_SECRET_OPTIONS: Readonly<Record<string, OptionSpec>> = {
  "webhook-secret-file": {
    value: "PATH|-",
    summary:
      "the webhook secret (at least 32 characters) from a file, or `-` for standard input; its final line break is not part of it",
  },
  "webhook-secret": {
    value: "SECRET",
    summary:
      "the webhook secret itself; other users of the machine can read it in the process list, prefer --webhook-secret-file",
  },
};

/** The webhook secret the operator gave, if any; its file's final line break is not part of it. */
export async function givenWebhookSecret(
  options: Record<string, string | undefined>,
): Promise<string | undefined> {
  const inline = options["webhook-secret"];
  const path = options["webhook-secret-file"];
  if (path === undefined) return inline;
  if (inline !== undefined) {
    throw new UsageError("give --webhook-secret or --webhook-secret-file, not both");
  }
  return (await readSecretInput(path)).replace(/\r?\n$/, "");
}

/** The given webhook secret, checked, or a new one: `whsec_` and 32 random bytes. */
export function webhookSecretFrom(given: string | undefined): string {
  if (given === undefined) return `whsec_${base64url(crypto.getRandomValues(new Uint8Array(32)))}`;
  if (given.length < 32) {
    throw new CommandError("WEAK_WEBHOOK_SECRET", "a webhook secret needs at least 32 characters");
  }
  return given;
}

/** A callback URL the configuration accepts, or null when none was given. */
export function checkedCallbackUrl(url: string | undefined, config: Config): string | null {
  if (url === undefined) return null;
  const problem = callbackUrlProblem(url, callbackPolicyOf(config));
  if (problem !== null) throw new CommandError("INVALID_CALLBACK_URL", `callback URL ${problem}`);
  return url;
}

/** The tenant with `id`; TENANT_NOT_FOUND otherwise. */
export async function mustFindTenant(db: Database, id: string): Promise<Tenant> {
  const tenant = await findTenant(db.sql, id);
  if (tenant === null) throw new CommandError("TENANT_NOT_FOUND", `no tenant ${id}`);
  return tenant;
}

/** NO_CALLBACK_URL for a tenant without a callback URL. */
export function mustHaveCallback(tenant: Tenant): void {
  if (tenant.callbackUrl === null) {
    throw new CommandError("NO_CALLBACK_URL", "the tenant has no callback URL; set one first");
  }
}

/** The `--limit` option's value: an integer from 1 to 10000. */
export function limitOption(text: string): number {
  const limit = Number(text);
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
    throw new UsageError("--limit must be an integer from 1 to 10000");
  }
  return limit;
}
