/**
 * The dispatcher's life (src/delivery/dispatcher.ts): `running`, then `draining` from `stop()`,
 * in which it claims and hands over nothing but still records the attempt in flight, then
 * `stopped` once that attempt is recorded. Run on a real database of either engine, with a real
 * callback on loopback that holds its answer until the test lets it go.
 */
import assert from "node:assert/strict";
import { SecretBox } from "../src/crypto/secrets.ts";
import { insertTenant } from "../src/db/tenants.ts";
import { Dispatcher } from "../src/delivery/dispatcher.ts";
import { ingestNotification, type VerifiedNotification } from "../src/events/ingest.ts";
import { Logger } from "../src/observability/log.ts";
import { connectTestDatabase, freshDatabase } from "./helpers/service.ts";

function renewal(tenantId: string, externalId: string): VerifiedNotification {
  return {
    tenantId,
    source: "storea",
    externalId,
    entry: {
      event: "subscription.renewed",
      reason: null,
      platformEvent: "storea.did_renew",
      subject: null,
    } as unknown as VerifiedNotification["entry"],
    data: { notificationUUID: externalId },
    raw: { notificationUUID: externalId },
    occurredAt: null,
    state: null,
  };
}

Deno.test("dispatcher: running, draining while its attempt finishes, then stopped", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test, { poolSize: 4 });
  const received = Promise.withResolvers<void>();
  const answer = Promise.withResolvers<void>();
  const callback = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async () => {
    received.resolve();
    await answer.promise;
    return new Response("ok");
  });
  const box = new SecretBox(crypto.getRandomValues(new Uint8Array(32)));
  const log = new Logger({ write: () => {} });
  const dispatcher = new Dispatcher({
    sql: db.sql,
    box,
    log,
    version: "test",
    retryScheduleMs: [30_000],
    timeoutMs: 10_000,
    concurrency: 4,
    tenantConcurrency: 2,
    callbackPolicy: { allowHttp: true, allowPrivateNetworks: true },
  });
  try {
    await insertTenant(db.sql, box, {
      id: "tenant_life",
      name: "life",
      callbackUrl: `http://127.0.0.1:${callback.addr.port}/hook`,
      webhookSecret: "whsec_life",
    });
    const receipt = await ingestNotification(db.sql, renewal("tenant_life", "n1"));
    assert.equal(dispatcher.life, "running");
    dispatcher.kick();
    await received.promise;

    const stopping = dispatcher.stop();
    assert.equal(dispatcher.life, "draining");
    assert.equal(dispatcher.stop(), stopping, "every stop() waits for the same drain");
    assert.equal(dispatcher.handOver.reserve("tenant_life"), false, "no hand-over while draining");
    // A second delivery now due is not claimed while draining.
    const second = await ingestNotification(db.sql, renewal("tenant_life", "n2"));
    dispatcher.kick();

    answer.resolve();
    await stopping;
    assert.equal(dispatcher.life, "stopped");
    const rows = await db.sql`
      SELECT id, status, attempts, lease_owner FROM deliveries ORDER BY next_attempt_at NULLS LAST`;
    const byId = new Map(rows.map((row) => [row.id, row]));
    assert.equal(byId.get(receipt.deliveryId)?.status, "delivered", "the attempt was recorded");
    assert.equal(byId.get(second.deliveryId)?.status, "pending");
    assert.equal(byId.get(second.deliveryId)?.attempts, 0);
    assert.equal(byId.get(second.deliveryId)?.lease_owner, null, "never claimed");
  } finally {
    answer.resolve();
    await dispatcher.stop();
    await callback.shutdown();
    await db.close();
    await test.drop();
  }
});
