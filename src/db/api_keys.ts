/** API keys: stored as hashes, looked up by hash, revoked, and marked as used. */
import type { Sql } from "./connect.ts";

/** An API key as listings show it. */
export interface ApiKeyRecord {
  id: string;
  tenantId: string;
  name: string | null;
  env: "live" | "test";
  prefix: string;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
}

/** The tenant and key behind a valid API key. */
export interface KeyOwner {
  keyId: string;
  tenantId: string;
}

/** A key to store: its hash, never the key itself. */
export interface NewApiKey {
  id: string;
  tenantId: string;
  name: string | null;
  env: "live" | "test";
  keyHash: string;
  prefix: string;
}

function iso(value: unknown): string | null {
  return value === null || value === undefined ? null : new Date(value as string).toISOString();
}

// deno-lint-ignore no-explicit-any
function toRecord(row: any): ApiKeyRecord {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    name: row.name,
    env: row.env,
    prefix: row.prefix,
    createdAt: iso(row.created_at)!,
    lastUsedAt: iso(row.last_used_at),
    revokedAt: iso(row.revoked_at),
  };
}

/** Stores a new key. */
export async function insertApiKey(sql: Sql, key: NewApiKey): Promise<ApiKeyRecord> {
  const [row] = await sql`
    INSERT INTO api_keys (id, tenant_id, name, env, key_hash, prefix)
    VALUES (${key.id}, ${key.tenantId}, ${key.name}, ${key.env}, ${key.keyHash}, ${key.prefix})
    RETURNING *`;
  return toRecord(row);
}

/** A tenant's keys, oldest first. */
export async function listApiKeys(sql: Sql, tenantId: string): Promise<ApiKeyRecord[]> {
  const rows = await sql`
    SELECT * FROM api_keys WHERE tenant_id = ${tenantId} ORDER BY created_at, id`;
  return rows.map(toRecord);
}

/** Revokes a key (idempotent: the first revocation time is kept); null when it does not exist. */
export async function revokeApiKey(sql: Sql, id: string): Promise<ApiKeyRecord | null> {
  const [row] = await sql`
    UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
    WHERE id = ${id}
    RETURNING *`;
  return row ? toRecord(row) : null;
}

/**
 * The owners of unrevoked keys of active tenants, by the keys' hashes, in one query; a hash
 * without an owner is missing from the result.
 */
export async function findKeyOwners(
  sql: Sql,
  keyHashes: string[],
): Promise<Map<string, KeyOwner>> {
  const rows = await sql`
    SELECT k.id, k.tenant_id, k.key_hash
    FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
    WHERE k.key_hash = ANY(${keyHashes}::text[]) AND k.revoked_at IS NULL AND t.active`;
  return new Map(rows.map((row) => [row.key_hash, { keyId: row.id, tenantId: row.tenant_id }]));
}

/** Records when keys were last used, in one statement for a whole batch. */
export async function recordKeyUse(sql: Sql, uses: Map<string, Date>): Promise<void> {
  if (uses.size === 0) return;
  const ids = [...uses.keys()];
  const times = ids.map((id) => uses.get(id)!.toISOString());
  await sql`
    UPDATE api_keys SET last_used_at = used.at
    FROM (SELECT unnest(${ids}::text[]) AS id, unnest(${times}::timestamptz[]) AS at) AS used
    WHERE api_keys.id = used.id AND (api_keys.last_used_at IS NULL OR api_keys.last_used_at < used.at)`;
}
