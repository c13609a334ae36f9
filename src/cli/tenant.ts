/**
 * The `tenant` commands: create, list, show, set-callback, set-events, set-state-fetch,
 * rotate-secret, deactivate, activate. Webhook secrets are printed once, when set.
 * @module
 */
import {
  insertTenant,
  listTenants,
  setTenantActive,
  setTenantCallback,
  setTenantEvents,
  setTenantStorebStateFetch,
} from "../db/tenants.ts";
import { parseEventFilter } from "../events/filter.ts";
import { rotateWebhookSecret } from "../db/tenants.ts";
import { describeCredentials } from "../db/credentials.ts";
import { notifyDispatchers } from "../delivery/queue.ts";
import { parseDuration } from "../config.ts";
import { newId } from "../lib/ids.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import {
  checkedCallbackUrl,
  givenWebhookSecret,
  mustFindTenant,
  mustHaveCallback,
  webhookSecretFrom,
} from "./inputs.ts";

/** `tenant create --name NAME [--callback-url URL] [--webhook-secret-file PATH|-]` */
export async function createTenant(
  { options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const callbackUrl = checkedCallbackUrl(options["callback-url"], context.config);
  const given = await givenWebhookSecret(options);
  if (given !== undefined && callbackUrl === null) {
    throw new UsageError("--webhook-secret and --webhook-secret-file need --callback-url");
  }
  const webhookSecret = callbackUrl === null ? null : webhookSecretFrom(given);
  const { db, box } = await context.open();
  const tenant = await insertTenant(db.sql, box, {
    id: newId("tenant"),
    name: options.name!,
    callbackUrl,
    webhookSecret,
  });
  const printed: Record<string, unknown> = {
    id: tenant.id,
    name: tenant.name,
    active: tenant.active,
    callbackUrl: tenant.callbackUrl,
  };
  if (webhookSecret !== null) printed.webhookSecret = webhookSecret;
  printed.createdAt = tenant.createdAt;
  return printed;
}

/** `tenant list` */
export async function listAllTenants(
  _input: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db } = await context.open();
  return { tenants: await listTenants(db.sql) };
}

/** `tenant show ID`: the tenant and summaries of its store credentials, no secrets. */
export async function showTenant(
  { positionals: [id] }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db } = await context.open();
  const tenant = await mustFindTenant(db, id);
  return { ...tenant, ...(await describeCredentials(db.sql, id)) };
}

/** What `--sandbox-url` takes to remove the sandbox callback URL. */
const NO_SANDBOX_URL = "none";

/**
 * `tenant set-callback ID [--url URL] [--sandbox-url URL|none] [--webhook-secret-file PATH|-]`:
 * at least one of the URLs.
 */
export async function setCallback(
  { positionals: [id], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  if (options.url === undefined && options["sandbox-url"] === undefined) {
    throw new UsageError("give --url, --sandbox-url, or both");
  }
  const callbackUrl = checkedCallbackUrl(options.url, context.config) ?? undefined;
  const sandboxCallbackUrl = options["sandbox-url"] === NO_SANDBOX_URL
    ? null
    : checkedCallbackUrl(options["sandbox-url"], context.config) ?? undefined;
  const given = await givenWebhookSecret(options);
  const { db, box } = await context.open();
  const before = await mustFindTenant(db, id);
  // A tenant without a secret gets one; an existing secret is kept unless a new one is given.
  const webhookSecret = given !== undefined || !before.hasWebhookSecret
    ? webhookSecretFrom(given)
    : null;
  const tenant = (await setTenantCallback(db.sql, box, id, {
    callbackUrl,
    sandboxCallbackUrl,
    webhookSecret,
  }))!;
  const printed: Record<string, unknown> = {
    id: tenant.id,
    callbackUrl: tenant.callbackUrl,
    sandboxCallbackUrl: tenant.sandboxCallbackUrl,
  };
  if (webhookSecret !== null) printed.webhookSecret = webhookSecret;
  printed.updatedAt = tenant.updatedAt;
  return printed;
}

/** `tenant set-events ID --events LIST`: which events are delivered; `all` clears the filter. */
export async function setEvents(
  { positionals: [id], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  let events: string[] | null;
  try {
    events = parseEventFilter(options.events!);
  } catch (error) {
    throw new CommandError("INVALID_EVENT_FILTER", (error as Error).message);
  }
  const { db } = await context.open();
  await mustFindTenant(db, id);
  const tenant = (await setTenantEvents(db.sql, id, events))!;
  return { id: tenant.id, events: tenant.events, updatedAt: tenant.updatedAt };
}

/** `tenant set-state-fetch ID --storeb on|off` */
export async function setStateFetch(
  { positionals: [id], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const value = options.storeb!;
  if (value !== "on" && value !== "off") throw new UsageError("--storeb takes on or off");
  const { db } = await context.open();
  await mustFindTenant(db, id);
  const tenant = (await setTenantStorebStateFetch(db.sql, id, value === "on"))!;
  return { id: tenant.id, storebStateFetch: tenant.storebStateFetch, updatedAt: tenant.updatedAt };
}

/** `tenant rotate-secret ID [--grace DURATION]`: a new secret; the old one signs for the grace. */
export async function rotateSecret(
  { positionals: [id], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const graceMs = parseDuration(options.grace!);
  if (graceMs === null) throw new UsageError("--grace must be a duration such as 30m, 24h or 7d");
  const { db, box } = await context.open();
  mustHaveCallback(await mustFindTenant(db, id));
  const webhookSecret = webhookSecretFrom(undefined);
  const rotated = (await rotateWebhookSecret(db.sql, box, id, { secret: webhookSecret, graceMs }))!;
  return {
    id,
    webhookSecret,
    previousSecretValidUntil: rotated.previousSecretExpiresAt,
    updatedAt: rotated.tenant.updatedAt,
  };
}

/** `tenant deactivate ID` */
export function deactivateTenant(input: CommandInput, context: CliContext): Promise<CommandOutput> {
  return setActive(input.positionals[0], context, false);
}

/** `tenant activate ID`: also wakes the dispatchers, whose waiting deliveries are due again. */
export function activateTenant(input: CommandInput, context: CliContext): Promise<CommandOutput> {
  return setActive(input.positionals[0], context, true);
}

async function setActive(id: string, context: CliContext, active: boolean) {
  const { db } = await context.open();
  const tenant = await setTenantActive(db.sql, id, active);
  if (tenant === null) throw new CommandError("TENANT_NOT_FOUND", `no tenant ${id}`);
  if (active) await notifyDispatchers(db.sql);
  return { ...tenant };
}
