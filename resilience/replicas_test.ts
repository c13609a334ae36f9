/**
 * Three service processes on one PostgreSQL database (docs/relay.md, "Queue and replicas"):
 * 1,000 notifications spread over them are each delivered exactly once, retries included, whichever
 * process claims them.
 */
import assert from "node:assert/strict";
import { databaseOf, ENGINE, type RunningService, startService } from "../tests/helpers/service.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import {
  acceptedPerEvent,
  forEachConcurrently,
  percentile,
  relayFixture,
  relayTenant,
  reportFigures,
  sendNotification,
  signedNotifications,
  sleep,
  waitUntilAllAccepted,
} from "./support.ts";

const NOTIFICATIONS = 1_000;
const PROCESSES = 3;
/** The first answers of the callback are 500s, so retries are part of the run. */
const FAILED_FIRST_ATTEMPTS = 100;

Deno.test({
  name: "three processes on one database deliver 1,000 notifications exactly once",
  // Replicas share PostgreSQL; the embedded engine serves one process.
  ignore: ENGINE === "embedded",
}, async () => {
  const fixture = await relayFixture();
  const receiver = await startCallbackReceiver();
  const services: RunningService[] = [];
  try {
    // A process refills the slots it frees in the statement that records them, so it keeps a
    // tenant's share while the backlog lasts: with a share (12) larger than one process's slots
    // (4), every process has a part of this one tenant's deliveries.
    const env = { ...fixture.env, DELIVERY_CONCURRENCY: "4", DELIVERY_TENANT_CONCURRENCY: "12" };
    services.push(await startService({ env }));
    for (let i = 1; i < PROCESSES; i++) {
      services.push(await startService({ env, db: services[0].db }));
    }
    const tenantId = await relayTenant(services[0], fixture, receiver);
    receiver.script({ status: 500, times: FAILED_FIRST_ATTEMPTS });
    const payloads = await signedNotifications(fixture.signer, NOTIFICATIONS);

    const started = performance.now();
    const eventIds = new Set<string>();
    const latencies: number[] = [];
    await forEachConcurrently(payloads, 24, async (payload, i) => {
      const outcome = await sendNotification(services[i % PROCESSES].url, tenantId, payload);
      assert.equal(outcome.status, 200, `notification ${i}: ${outcome.status}`);
      eventIds.add(outcome.eventId!);
      latencies.push(outcome.latencyMs);
    });
    const receivedMs = performance.now() - started;
    assert.equal(eventIds.size, NOTIFICATIONS, "one event per notification");

    await waitUntilAllAccepted(receiver, eventIds, 90_000);
    const deliveredMs = performance.now() - started;
    await sleep(2_500); // room for a duplicate to show up: longer than a retry delay
    const perEvent = acceptedPerEvent(receiver);
    assert.equal(perEvent.size, NOTIFICATIONS, "every event delivered");
    assert.ok([...perEvent.keys()].every((id) => eventIds.has(id)), "nothing but these events");
    const twice = [...perEvent.values()].filter((n) => n > 1).length;
    assert.equal(twice, 0, "no event delivered twice");
    assert.ok(receiver.accepted().every((d) => d.signatureValid), "every delivery signed");

    // Every request the callback saw is a recorded attempt, and every delivery is final.
    const sql = databaseOf(services[0]);
    try {
      const [counts] = await sql`
        SELECT count(*) FILTER (WHERE status = 'delivered')::int AS delivered,
               count(*)::int AS total,
               (SELECT count(*)::int FROM delivery_attempts) AS attempts
        FROM deliveries`;
      assert.deepEqual(counts, {
        delivered: NOTIFICATIONS,
        total: NOTIFICATIONS,
        attempts: receiver.deliveries.length,
      });
    } finally {
      await sql.end();
    }
    const attemptsPerProcess = services.map((s) =>
      s.logs.filter((l) => l.msg === "delivery_attempt").length
    );
    assert.ok(
      attemptsPerProcess.every((n) => n > 0),
      `each dispatcher sent: ${attemptsPerProcess}`,
    );
    reportFigures("replicas", {
      processes: PROCESSES,
      notifications: NOTIFICATIONS,
      receivedInMs: Math.round(receivedMs),
      receiveP50Ms: Math.round(percentile(latencies, 50)),
      receiveP99Ms: Math.round(percentile(latencies, 99)),
      allDeliveredInMs: Math.round(deliveredMs),
      callbackRequests: receiver.deliveries.length,
      attemptsPerProcess,
      deliveredTwice: twice,
    });
  } finally {
    for (const service of services.slice(1)) await service.stop();
    if (services[0]) {
      await services[0].stop();
      await services[0].db.drop();
    }
    await receiver.close();
    await fixture.cleanup();
  }
});
