/**
 * The baseline of `bench/relay.ts`: a bare `Deno.serve` that takes a store A notification the way
 * the receiver must at the least, and nothing more. For each `POST /v1/webhooks/storea/:tenantId`
 * it reads the whole JSON body, checks that `signedPayload` is a string, and answers 200 with a
 * receipt of the service's shape (`eventId`, `externalId`, `isNew`, `enqueuedDelivery`) and the
 * same `content-type`.
 *
 * It verifies no signature, decodes no JWS (so `externalId` is a fresh random UUID, not the
 * notification's), stores nothing, delivers nothing and logs nothing: the gap between the two is
 * what the service adds. It takes its port from `PORT`.
 *
 * @module
 */

import { baselineAddress, JSON_HEADERS } from "./baseline.ts";

const PATH = /^\/v1\/webhooks\/storea\/[^/]+$/;

const { port, hostname } = baselineAddress(8080);
let received = 0;

Deno.serve(
  { port, hostname, onListen: () => {} },
  handle,
);

/** Reads one notification body and answers with a receipt. */
async function handle(request: Request): Promise<Response> {
  if (request.method !== "POST" || !PATH.test(new URL(request.url).pathname)) {
    return new Response(null, { status: 404 });
  }
  const body = await request.json().catch(() => null);
  if (typeof body?.signedPayload !== "string") return new Response(null, { status: 400 });
  received++;
  const receipt = {
    eventId: `evt_${String(received).padStart(26, "0")}`,
    externalId: crypto.randomUUID(),
    isNew: true,
    enqueuedDelivery: true,
  };
  return new Response(JSON.stringify(receipt), { headers: JSON_HEADERS });
}
