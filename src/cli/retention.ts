/**
 * `retention run`: the prunes the service runs by itself (docs/relay.md, "Retention"), now,
 * with this command's configuration: events, deliveries and attempts past `EVENT_RETENTION_DAYS`,
 * and audit rows past `VALIDATION_AUDIT_RETENTION_DAYS`. Paced and safe beside running replicas
 * as theirs are.
 * @module
 */
import type { CliContext, CommandInput, CommandOutput } from "./command.ts";
import { eventKeyDays, pruneRelayHistory } from "../retention/relay_history.ts";
import { pruneValidationAudit } from "../audit/validation_audit.ts";

/** `retention run` */
export async function runRetention(
  _input: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { eventRetentionDays, validationAuditRetentionDays } = context.config;
  const { db } = await context.open();
  const relay = await pruneRelayHistory(db.sql, eventRetentionDays, {
    keyDays: eventKeyDays(context.config.storeaNotificationMaxAgeMs),
  });
  const audit = validationAuditRetentionDays === null
    ? { deleted: 0 }
    : await pruneValidationAudit(db.sql, validationAuditRetentionDays);
  return {
    eventRetentionDays,
    deliveries: relay.deliveries,
    attempts: relay.attempts,
    events: relay.events,
    eventKeysKept: relay.eventKeysKept,
    auditRetentionDays: validationAuditRetentionDays,
    auditRows: audit.deleted,
  };
}
