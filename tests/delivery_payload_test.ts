/** The delivery body: every field, in order, and nothing else. */
import assert from "node:assert/strict";
import { serializePayload } from "../src/events/payload.ts";
import { DELIVERY_KEYS } from "./helpers/relay.ts";

Deno.test("delivery payload: the documented fields in order, extra fields dropped", () => {
  const text = serializePayload({
    raw: { r: 1 },
    data: { d: 1 },
    subject: { key: "k", productId: null, type: "product" },
    source: "storeb",
    tenantId: "tenant_X",
    timestamp: "2026-01-01T00:00:00.000Z",
    externalId: "m1",
    eventId: "evt_X",
    platformEvent: "storeb.one_time_product.1",
    reason: null,
    event: "product.purchased",
    state: null,
    occurredAt: "2025-12-31T23:59:59.000Z",
    ...{ notInTheSpec: true },
  });
  assert.deepEqual(Object.keys(JSON.parse(text)), DELIVERY_KEYS);
  assert.equal(JSON.parse(text).subject.key, "k");
});
