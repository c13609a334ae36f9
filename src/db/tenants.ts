/** Tenants: their records, activation and callback settings. */
import type { Sql } from "./connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";

/** A tenant as the admin CLI shows it (never with secrets). */
export interface Tenant {
  id: string;
  name: string;
  active: boolean;
  callbackUrl: string | null;
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
 * Sets the callback URL. A new webhook secret is sealed when given; otherwise the current one is
 * kept. Returns null when the tenant does not exist.
 */
export async function setTenantCallback(
  sql: Sql,
  box: SecretBox,
  id: string,
  settings: { callbackUrl: string; webhookSecret: string | null },
): Promise<Tenant | null> {
  const sealed = settings.webhookSecret === null
    ? null
    : await box.seal("webhook-secret", id, settings.webhookSecret);
  const [row] = await sql`
    UPDATE tenants
    SET callback_url = ${settings.callbackUrl},
        webhook_secret_sealed = COALESCE(${sealed}, webhook_secret_sealed),
        updated_at = now()
    WHERE id = ${id}
    RETURNING *`;
  return row ? toTenant(row) : null;
}
