/**
 * The `key` commands: create (the key is printed once, here), list and revoke.
 * @module
 */
import { insertApiKey, listApiKeys, revokeApiKey } from "../db/api_keys.ts";
import { mintApiKey } from "../auth/api_key.ts";
import { newId } from "../lib/ids.ts";
import { type CliContext, CommandError, type CommandInput, type CommandOutput } from "./command.ts";
import { mustFindTenant } from "./inputs.ts";

/** `key create TENANT_ID [--env live|test] [--name NAME]` */
export async function createKey(
  { positionals: [tenantId], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const env = options.env as "live" | "test";
  const { db } = await context.open();
  await mustFindTenant(db, tenantId);
  const minted = mintApiKey(env);
  const record = await insertApiKey(db.sql, {
    id: newId("key"),
    tenantId,
    name: options.name ?? null,
    env,
    keyHash: minted.hash,
    prefix: minted.prefix,
  });
  return {
    id: record.id,
    tenantId,
    name: record.name,
    env,
    key: minted.token,
    createdAt: record.createdAt,
  };
}

/** `key list TENANT_ID`: the tenant's keys, without the keys themselves. */
export async function listKeys(
  { positionals: [tenantId] }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db } = await context.open();
  await mustFindTenant(db, tenantId);
  const keys = await listApiKeys(db.sql, tenantId);
  return { keys: keys.map(({ tenantId: _, ...key }) => key) };
}

/** `key revoke KEY_ID`: idempotent; a second revocation prints the first one's time. */
export async function revokeKey(
  { positionals: [id] }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db } = await context.open();
  const record = await revokeApiKey(db.sql, id);
  if (record === null) throw new CommandError("KEY_NOT_FOUND", `no API key ${id}`);
  return { id: record.id, revokedAt: record.revokedAt };
}
