/** Store credentials of a tenant, sealed at rest (docs/security.md, "Secrets at rest"). */
import type { Sql } from "./connect.ts";
import type { SecretBox } from "../crypto/secrets.ts";
import type { StoreaCredentials, StoreaEnvironment } from "../storea/credentials.ts";
import type { NewStorebCredentials, StorebCredentials } from "../storeb/credentials.ts";

/** A tenant's credentials; a store without them is null. */
export interface TenantCredentials {
  storea: StoreaCredentials | null;
  storeb: StorebCredentials | null;
}

/** Stores (or replaces) a tenant's store A credentials. */
export async function saveStoreaCredentials(
  sql: Sql,
  box: SecretBox,
  tenantId: string,
  credentials: StoreaCredentials,
): Promise<void> {
  const sealed = await box.seal("storea-private-key", tenantId, credentials.privateKeyPem);
  await sql`
    INSERT INTO storea_credentials
      (tenant_id, bundle_id, key_id, issuer_id, private_key_sealed, environment, app_id)
    VALUES (${tenantId}, ${credentials.bundleId}, ${credentials.keyId}, ${credentials.issuerId},
            ${sealed}, ${credentials.environment}, ${credentials.appId})
    ON CONFLICT (tenant_id) DO UPDATE SET
      bundle_id = excluded.bundle_id, key_id = excluded.key_id, issuer_id = excluded.issuer_id,
      private_key_sealed = excluded.private_key_sealed, environment = excluded.environment,
      app_id = excluded.app_id, updated_at = now()`;
}

/** Stores (or replaces) a tenant's store B credentials. */
export async function saveStorebCredentials(
  sql: Sql,
  box: SecretBox,
  tenantId: string,
  credentials: NewStorebCredentials,
): Promise<void> {
  const sealed = await box.seal("storeb-service-account", tenantId, credentials.serviceAccountJson);
  await sql`
    INSERT INTO storeb_credentials
      (tenant_id, package_name, client_email, service_account_sealed, push_audience,
       push_service_account)
    VALUES (${tenantId}, ${credentials.packageName}, ${credentials.clientEmail}, ${sealed},
            ${credentials.pushAudience}, ${credentials.pushServiceAccount})
    ON CONFLICT (tenant_id) DO UPDATE SET
      package_name = excluded.package_name, client_email = excluded.client_email,
      service_account_sealed = excluded.service_account_sealed,
      push_audience = excluded.push_audience,
      push_service_account = excluded.push_service_account, updated_at = now()`;
}

/** Loads and opens a tenant's credentials for both stores. */
export async function loadCredentials(
  sql: Sql,
  box: SecretBox,
  tenantId: string,
): Promise<TenantCredentials> {
  const { a, b } = await credentialRows(sql, tenantId);
  return {
    storea: a
      ? {
        ...storeaFields(a),
        privateKeyPem: await box.open("storea-private-key", tenantId, a.private_key_sealed),
      }
      : null,
    storeb: b
      ? {
        ...storebFields(b),
        serviceAccountJson: await box.open(
          "storeb-service-account",
          tenantId,
          b.service_account_sealed,
        ),
      }
      : null,
  };
}

/** What the CLI may show of a tenant's credentials: everything but the secrets. */
export async function describeCredentials(
  sql: Sql,
  tenantId: string,
): Promise<Record<string, unknown>> {
  const { a, b } = await credentialRows(sql, tenantId);
  return {
    storea: a ? { ...storeaFields(a), updatedAt: new Date(a.updated_at).toISOString() } : null,
    storeb: b
      ? {
        ...storebFields(b),
        updatedAt: new Date(b.updated_at).toISOString(),
        ...(b.push_service_account === null ? MISSING_PUSH_SERVICE_ACCOUNT : {}),
      }
      : null,
  };
}

/** A tenant's rows of both credential tables, each undefined when it has none. */
async function credentialRows(sql: Sql, tenantId: string) {
  const [a] = await sql`SELECT * FROM storea_credentials WHERE tenant_id = ${tenantId}`;
  const [b] = await sql`SELECT * FROM storeb_credentials WHERE tenant_id = ${tenantId}`;
  return { a, b };
}

/** The fields of a store A credentials row that are not secret. */
function storeaFields(row: Record<string, unknown>): Omit<StoreaCredentials, "privateKeyPem"> {
  return {
    bundleId: row.bundle_id as string,
    keyId: row.key_id as string,
    issuerId: row.issuer_id as string,
    environment: row.environment as StoreaEnvironment,
    appId: row.app_id === null ? null : Number(row.app_id),
  };
}

/** The fields of a store B credentials row that are not secret. */
function storebFields(
  row: Record<string, unknown>,
): Omit<StorebCredentials, "serviceAccountJson"> {
  return {
    packageName: row.package_name as string,
    clientEmail: row.client_email as string,
    pushAudience: row.push_audience as string,
    pushServiceAccount: row.push_service_account as string | null,
  };
}

/** What `tenant show` adds for store B credentials stored without a push service account. */
const MISSING_PUSH_SERVICE_ACCOUNT = {
  missing: ["pushServiceAccount"],
  warning: "no push service account: store B notifications are refused with 401 until " +
    "storeb set-credentials is run again with --push-service-account (docs/operations.md)",
};

/**
 * The ids of tenants whose store B credentials have no push service account (stored by versions
 * that did not require it), by id (oldest first), at most `limit`, and how many there are in all.
 */
export async function tenantsWithoutPushServiceAccount(
  sql: Sql,
  limit = 100,
): Promise<{ tenantIds: string[]; count: number }> {
  const rows = await sql`
    SELECT tenant_id, count(*) OVER () AS count FROM storeb_credentials
    WHERE push_service_account IS NULL
    ORDER BY tenant_id
    LIMIT ${limit}`;
  return {
    tenantIds: rows.map((row) => row.tenant_id as string),
    count: rows.length === 0 ? 0 : Number(rows[0].count),
  };
}
