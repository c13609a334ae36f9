/**
 * The body of a delivery (docs/deliveries.md, "A delivery"), serialized once so that every attempt
 * sends the same bytes in the same key order and the signature covers exactly them.
 */
import type { Subject } from "./catalog.ts";

/** Every field of a delivery body. */
export interface DeliveryPayload {
  event: string;
  reason: string | null;
  platformEvent: string;
  eventId: string;
  externalId: string;
  /** ISO-8601 receipt time. */
  timestamp: string;
  tenantId: string;
  /** `storea` or `storeb`; `service` only for the CLI's `webhook test` events. */
  source: "storea" | "storeb" | "service";
  subject: Subject | null;
  data: unknown;
  raw: unknown;
  /** The store's own time of the event (ISO-8601): what a tenant orders events by. */
  occurredAt: string | null;
  /** The purchase as verify would answer it, or null (docs/deliveries.md, "State on every delivery"). */
  state: unknown;
  /** Why `state` is null when it could not be fetched; absent otherwise. */
  stateError?: { error: string; message: string };
}

/** The JSON body, keys in the documented order (docs/deliveries.md, "A delivery"). */
export function serializePayload(payload: DeliveryPayload): string {
  return JSON.stringify({
    event: payload.event,
    reason: payload.reason,
    platformEvent: payload.platformEvent,
    eventId: payload.eventId,
    externalId: payload.externalId,
    timestamp: payload.timestamp,
    tenantId: payload.tenantId,
    source: payload.source,
    subject: payload.subject,
    data: payload.data,
    raw: payload.raw,
    occurredAt: payload.occurredAt,
    state: payload.state,
    ...(payload.stateError === undefined ? {} : { stateError: payload.stateError }),
  });
}
