/** Tenants: their records, activation and callback settings. */
import type { Sql } from "./connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";

/** A tenant as the admin CLI shows it (never with secrets). */
export interface Tenant {
  id: string;
  name: string;
  active: boolean;
  callbackUrl: string | null;
  /** Where store A Sandbox notifications go; null: the callback URL. */
  sandboxCallbackUrl: string | null;
  /** Event names and `prefix.*` patterns delivered; null: every event. */
  events: string[] | null;
  /** Whether store B deliveries carry the purchase fetched from the store. */
  storebStateFetch: boolean;
  hasWebhookSecret: boolean;
  createdAt: string;
  updatedAt: string;
}

/** The fields of a new tenant. */
export interface NewTenant {
  id: string;
  name: string;
  callbackUrl: string | null;
  webhookSecret: string | null;
}

// deno-lint-ignore no-explicit-any
function toTenant(row: any): Tenant {
  return {
    id: row.id,
    name: row.name,
    active: row.active,
    callbackUrl: row.callback_url,
    sandboxCallbackUrl: row.sandbox_callback_url,
    events: row.event_filter,
    storebStateFetch: row.storeb_state_fetch,
    hasWebhookSecret: row.webhook_secret_sealed !== null,
    createdAt: new Date(row.created_at).toISOString(),
    updatedAt: new Date(row.updated_at).toISOString(),
  };
}

/** Inserts a tenant, sealing its webhook secret. */
export async function insertTenant(sql: Sql, box: SecretBox, tenant: NewTenant): Promise<Tenant> {
  const sealed = tenant.webhookSecret === null
    ? null
    : await box.seal("webhook-secret", tenant.id, tenant.webhookSecret);
  const [row] = await sql`
    INSERT INTO tenants (id, name, callback_url, webhook_secret_sealed)
    VALUES (${tenant.id}, ${tenant.name}, ${tenant.callbackUrl}, ${sealed})
    RETURNING *`;
  return toTenant(row);
}

/** All tenants, oldest first. */
export async function listTenants(sql: Sql): Promise<Tenant[]> {
  const rows = await sql`SELECT * FROM tenants ORDER BY created_at, id`;
  return rows.map(toTenant);
}

/** One tenant, or null. */
export async function findTenant(sql: Sql, id: string): Promise<Tenant | null> {
  const [row] = await sql`SELECT * FROM tenants WHERE id = ${id}`;
  return row ? toTenant(row) : null;
}

/** The tenants among `ids` that exist, by id, in one query. */
export async function findTenants(sql: Sql, ids: string[]): Promise<Map<string, Tenant>> {
  const rows = await sql`SELECT * FROM tenants WHERE id = ANY(${ids}::text[])`;
  return new Map(rows.map((row) => [row.id, toTenant(row)]));
}

/** Activates or deactivates a tenant; null when it does not exist. */
export async function setTenantActive(
  sql: Sql,
  id: string,
  active: boolean,
): Promise<Tenant | null> {
  const [row] = await sql`
    UPDATE tenants SET active = ${active}, updated_at = now() WHERE id = ${id} RETURNING *`;
  return row ? toTenant(row) : null;
}

/**
 * Sets the callback URL and the sandbox callback URL, each when given (`null` clears the sandbox
 * one; `undefined` keeps either). A new webhook secret is sealed when given; otherwise the current
 * one is kept. Returns null when the tenant does not exist.
 */
export async function setTenantCallback(
  sql: Sql,
  box: SecretBox,
  id: string,
  settings: {
    callbackUrl?: string;
    sandboxCallbackUrl?: string | null;
    webhookSecret: string | null;
  },
): Promise<Tenant | null> {
  const sealed = settings.webhookSecret === null
    ? null
    : await box.seal("webhook-secret", id, settings.webhookSecret);
  const keepSandbox = settings.sandboxCallbackUrl === undefined;
  const [row] = await sql`
    UPDATE tenants
    SET callback_url = COALESCE(${settings.callbackUrl ?? null}, callback_url),
        sandbox_callback_url = CASE WHEN ${keepSandbox} THEN sandbox_callback_url
                                    ELSE ${settings.sandboxCallbackUrl ?? null} END,
        webhook_secret_sealed = COALESCE(${sealed}, webhook_secret_sealed),
        -- A secret set here replaces the old one at once; rotate-secret is the gentle way.
        previous_webhook_secret_sealed = CASE
          WHEN ${sealed}::text IS NULL THEN previous_webhook_secret_sealed END,
        updated_at = now()
    WHERE id = ${id}
    RETURNING *`;
  return row ? toTenant(row) : null;
}

/** Sets the tenant's event filter (null: every event); null when the tenant does not exist. */
export async function setTenantEvents(
  sql: Sql,
  id: string,
  events: string[] | null,
): Promise<Tenant | null> {
  const [row] = await sql`
    UPDATE tenants SET event_filter = ${events}::text[], updated_at = now()
    WHERE id = ${id} RETURNING *`;
  return row ? toTenant(row) : null;
}

/** Turns the store B state fetch on or off; null when the tenant does not exist. */
export async function setTenantStorebStateFetch(
  sql: Sql,
  id: string,
  on: boolean,
): Promise<Tenant | null> {
  const [row] = await sql`
    UPDATE tenants SET storeb_state_fetch = ${on}, updated_at = now()
    WHERE id = ${id} RETURNING *`;
  return row ? toTenant(row) : null;
}

/**
 * Replaces the webhook secret and keeps the current one as the previous secret until
 * `graceMs` from now, so receivers can switch over while both signatures are sent. Returns null
 * when the tenant does not exist.
 */
export async function rotateWebhookSecret(
  sql: Sql,
  box: SecretBox,
  id: string,
  rotation: { secret: string; graceMs: number },
): Promise<{ tenant: Tenant; previousSecretExpiresAt: string | null } | null> {
  const sealed = await box.seal("webhook-secret", id, rotation.secret);
  const [row] = await sql`
    UPDATE tenants
    SET previous_webhook_secret_sealed = webhook_secret_sealed,
        previous_webhook_secret_expires_at = CASE
          WHEN webhook_secret_sealed IS NULL THEN NULL
          ELSE now() + ${rotation.graceMs} * interval '1 millisecond' END,
        webhook_secret_sealed = ${sealed},
        updated_at = now()
    WHERE id = ${id}
    RETURNING *`;
  if (!row) return null;
  const expires = row.previous_webhook_secret_expires_at;
  return {
    tenant: toTenant(row),
    previousSecretExpiresAt: expires === null ? null : new Date(expires).toISOString(),
  };
}
