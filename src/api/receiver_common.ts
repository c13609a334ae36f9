/** What both notification receivers share: ingest and the receipt they answer 200 with. */
import { invalidRequest } from "../errors.ts";
import { jsonResponse } from "../http/server.ts";
import type { RequestContext } from "../http/router.ts";
import type { TenantCredentials } from "../db/credentials.ts";
import type { Tenant } from "../db/tenants.ts";
import { type Receipt, unstorableColumn, type VerifiedNotification } from "../events/ingest.ts";
import type { Logger } from "../observability/log.ts";
import { ATTR, recordNotification, withSpan } from "../observability/telemetry.ts";

/** What the receivers need. */
export interface ReceiverDeps {
  log: Logger;
  /** The tenant, or null when unknown (cached briefly by the caller). */
  findTenant: (tenantId: string) => Promise<Tenant | null>;
  /** The tenant's store credentials (cached briefly by the caller). */
  credentialsOf: (tenantId: string) => Promise<TenantCredentials>;
  /** Stores the event and its delivery in one transaction. */
  ingest: (notification: VerifiedNotification) => Promise<Receipt>;
  /** Called after a delivery was committed unclaimed, for the immediate first attempt. */
  onEnqueued: () => void;
}

/** Ingests a verified notification and answers with the receipt, only after the commit. */
export async function receiptResponse(
  deps: ReceiverDeps,
  context: RequestContext,
  notification: VerifiedNotification,
): Promise<Response> {
  const unstorable = unstorableColumn(notification);
  if (unstorable !== null) throw invalidRequest(unstorable);
  const { tenantId, source, entry } = notification;
  const receipt = await withSpan("purchase_relay.ingest", {
    [ATTR.tenant]: tenantId,
    [ATTR.store]: source,
    [ATTR.event]: entry.event,
  }, async (span) => {
    const receipt = await deps.ingest(notification);
    span?.setAttribute(ATTR.outcome, receipt.isNew ? "accepted" : "duplicate");
    span?.setAttribute(ATTR.eventId, receipt.eventId);
    return receipt;
  });
  recordNotification(tenantId, source, entry.event, receipt.isNew);
  // A delivery handed over is already being sent; any other is claimed by the kick.
  if (receipt.enqueuedDelivery && !receipt.handedOver) deps.onEnqueued();
  deps.log.info("notification_received", {
    reqId: context.reqId,
    tenantId: notification.tenantId,
    source: notification.source,
    eventId: receipt.eventId,
    externalId: receipt.externalId,
    event: notification.entry.event,
    platformEvent: notification.entry.platformEvent,
    isNew: receipt.isNew,
    enqueuedDelivery: receipt.enqueuedDelivery,
    handedOver: receipt.handedOver,
  });
  return jsonResponse(200, {
    eventId: receipt.eventId,
    externalId: receipt.externalId,
    isNew: receipt.isNew,
    enqueuedDelivery: receipt.enqueuedDelivery,
  });
}
