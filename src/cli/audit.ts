/**
 * `audit lookup`: the validation audit rows of one transaction id or purchase token. The audit
 * keeps ids only as keyed hashes; this hashes the given id the same way, with the same key.
 * @module
 */
import type { CliContext, CommandInput, CommandOutput } from "./command.ts";
import { limitOption, mustFindTenant } from "./inputs.ts";
import { SubjectHasher } from "../audit/subject_hash.ts";
import { auditHashKey } from "../db/settings.ts";

/** `audit lookup TENANT_ID --subject TRANSACTION_ID_OR_TOKEN [--limit N]` */
export async function lookupAudit(
  { positionals: [tenantId], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const limit = limitOption(options.limit!);
  const { db, box } = await context.open();
  await mustFindTenant(db, tenantId);
  const hash = await new SubjectHasher(() => auditHashKey(db.sql, box)).hash(options.subject!);
  const rows = await db.sql`
    SELECT store, outcome, upstream_status, latency_ms, created_at
    FROM validation_audit
    WHERE tenant_id = ${tenantId} AND subject_hash = ${hash}
    ORDER BY created_at DESC, id DESC
    LIMIT ${limit}`;
  return {
    tenantId,
    subjectHash: hash,
    entries: rows.map((row) => ({
      store: row.store,
      outcome: row.outcome,
      upstreamStatus: row.upstream_status,
      latencyMs: row.latency_ms,
      at: new Date(row.created_at).toISOString(),
    })),
  };
}
