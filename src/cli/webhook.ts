/**
 * `webhook test`: sends a signed `test` event straight to the tenant's callback URL, exactly as
 * the dispatcher would, and reports the answer. Nothing is stored.
 * @module
 */
import { loadDeliveryTarget } from "../delivery/targets.ts";
import { serializePayload } from "../events/payload.ts";
import { sendDelivery } from "../delivery/sender.ts";
import { callbackPolicyOf } from "../delivery/callback_policy.ts";
import { newId } from "../lib/ids.ts";
import { type CliContext, CommandError, type CommandInput, type CommandOutput } from "./command.ts";
import { mustFindTenant, mustHaveCallback } from "./inputs.ts";

/** `webhook test TENANT_ID`; WEBHOOK_TEST_FAILED, with the same fields, unless answered 2xx. */
export async function testWebhook(
  { positionals: [tenantId] }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db, box } = await context.open();
  mustHaveCallback(await mustFindTenant(db, tenantId));
  const target = (await loadDeliveryTarget(db.sql, box, tenantId))!;
  const eventId = newId("evt");
  const now = new Date().toISOString();
  const payload = serializePayload({
    event: "test",
    reason: null,
    platformEvent: "service.test",
    eventId,
    externalId: eventId,
    timestamp: now,
    tenantId,
    source: "service",
    subject: null,
    data: { message: "a test delivery sent by purchase-relay webhook test" },
    raw: {},
    occurredAt: now,
    state: null,
  });
  const result = await sendDelivery({
    callbackUrl: target.callbackUrl!,
    payload,
    event: "test",
    eventId,
    secrets: target.secrets,
  }, {
    version: context.config.version,
    timeoutMs: context.config.deliveryTimeoutMs,
    policy: callbackPolicyOf(context.config),
  });
  const delivered = result.responseCode !== null && result.responseCode >= 200 &&
    result.responseCode < 300;
  const outcome = {
    tenantId,
    callbackUrl: target.callbackUrl,
    eventId,
    delivered,
    responseCode: result.responseCode,
    responseBody: result.responseBody,
    // Why no answer came: refused target, network error or timeout.
    networkError: result.error,
    durationMs: Math.round(result.durationMs),
  };
  if (!delivered) {
    const why = result.error ?? `the callback answered ${result.responseCode}`;
    throw new CommandError("WEBHOOK_TEST_FAILED", why, outcome);
  }
  return outcome;
}
