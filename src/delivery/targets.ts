/**
 * Where a tenant's deliveries go, as the statements that store and lease deliveries read it: the
 * routed callback URL, the sealed secrets, and the leases a tenant holds against its cap
 * (docs/relay.md, "Delivery scheduling across tenants"). Every fragment reads the tenant aliased
 * `t` in its statement.
 */
import type postgres from "postgres";
import type { Sql } from "../db/connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";

/** Where and how a tenant's deliveries are sent, read afresh for every attempt. */
export interface DeliveryTarget {
  active: boolean;
  callbackUrl: string | null;
  /** The secrets to sign with: the current one, then the previous one during a rotation. */
  secrets: string[];
}

/**
 * A tenant's delivery target as a statement that leases deliveries reads it, its secrets still
 * sealed (the dispatcher opens them, once per sealed value).
 */
export interface SealedTarget {
  active: boolean;
  callbackUrl: string | null;
  /** The current webhook secret, then the previous one while its grace period lasts. */
  sealedSecrets: string[];
}

/**
 * The columns {@linkcode sealedTargetOf} reads, of the tenant aliased `t` in the statement, for a
 * delivery whose `sandbox` flag is the given expression: a Sandbox notification goes to the
 * sandbox callback URL when the tenant has one (docs/configuration.md, "Routing deliveries").
 */
export function sealedTargetColumns(sql: Sql, sandbox: postgres.Fragment) {
  return sql`t.active, ${routedCallbackUrl(sql, sandbox)} AS callback_url, t.webhook_secret_sealed,
             CASE WHEN t.previous_webhook_secret_expires_at > now()
                  THEN t.previous_webhook_secret_sealed END AS previous_sealed`;
}

/** The URL a delivery of the tenant aliased `t` goes to: see {@linkcode sealedTargetColumns}. */
export function routedCallbackUrl(sql: Sql, sandbox: postgres.Fragment) {
  return sql`COALESCE(CASE WHEN ${sandbox} THEN t.sandbox_callback_url END, t.callback_url)`;
}

/** The target in a row that selected {@linkcode sealedTargetColumns}. */
export function sealedTargetOf(row: postgres.Row): SealedTarget {
  return {
    active: row.active,
    callbackUrl: row.callback_url,
    sealedSecrets: [row.webhook_secret_sealed, row.previous_sealed].filter((v) => v !== null),
  };
}

/**
 * The leases a tenant (aliased `t`) holds now, whichever process holds them, counted up to `cap`
 * (a number or an SQL expression): how every statement that leases deliveries counts them against
 * the tenant's cap. The ordered scan that stops at the cap reads a few index entries however
 * stale the statistics (docs/architecture.md, "Queue statements and stale statistics").
 */
export function leasesHeld(sql: Sql, cap: number | postgres.Fragment) {
  return sql`(
    SELECT count(*)::int FROM (
      SELECT 1 FROM deliveries l
      WHERE l.tenant_id = t.id AND l.lease_expires_at > now()
      ORDER BY l.lease_expires_at
      LIMIT ${cap}
    ) held)`;
}

/** The delivery target of a tenant, or null when it does not exist. */
export async function loadDeliveryTarget(
  sql: Sql,
  box: SecretBox,
  id: string,
): Promise<DeliveryTarget | null> {
  const [row] = await sql`
    SELECT active, callback_url, webhook_secret_sealed, previous_webhook_secret_sealed,
           previous_webhook_secret_expires_at > now() AS previous_valid
    FROM tenants WHERE id = ${id}`;
  if (!row) return null;
  const secrets: string[] = [];
  if (row.webhook_secret_sealed !== null) {
    secrets.push(await box.open("webhook-secret", id, row.webhook_secret_sealed));
  }
  if (row.previous_webhook_secret_sealed !== null && row.previous_valid === true) {
    secrets.push(await box.open("webhook-secret", id, row.previous_webhook_secret_sealed));
  }
  return { active: row.active, callbackUrl: row.callback_url, secrets };
}
