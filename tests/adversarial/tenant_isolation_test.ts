/**
 * One tenant cannot hold up another (docs/relay.md, "Delivery scheduling across tenants").
 *
 * A broken tenant, authenticated like any other, piles up hundreds of pending deliveries to a
 * callback that accepts the connection and never answers, answers 500 just before the timeout,
 * or resets the connection just before the timeout. Beside it, a healthy tenant receives a
 * steady trickle of notifications: each must reach its callback within a second of the
 * receiver's 200, however long the broken tenant's backlog. Without per-tenant caps every
 * delivery slot holds the broken callback for `DELIVERY_TIMEOUT`, and the healthy tenant waits
 * behind the whole backlog.
 *
 * With two replicas on one PostgreSQL database the cap is the cluster's, not each process's: the
 * broken callback never sees more than `DELIVERY_TENANT_CONCURRENCY` requests at once.
 */
import assert from "node:assert/strict";
import { ENGINE, type RunningService, startService } from "../helpers/service.ts";
import {
  type CallbackReceiver,
  type ScriptedCallbackAnswer,
  startCallbackReceiver,
} from "../../simulators/callback_receiver.ts";
import {
  forEachConcurrently,
  type RelayFixture,
  relayFixture,
  relayTenant,
  reportFigures,
  sendNotification,
  signedNotifications,
  sleep,
} from "../../resilience/support.ts";

/** Long enough that a slot held by the broken callback is plainly visible, short for the test. */
const TIMEOUT_MS = 3_000;
/** The broken tenant's backlog: hundreds of pending deliveries. */
const BACKLOG = 200;
/** The healthy tenant's trickle: one notification every `TRICKLE_EVERY_MS`. */
const TRICKLE = 12;
const TRICKLE_EVERY_MS = 300;
/** The bound on a healthy delivery, from the receiver's 200 to the callback's receipt. */
const BOUND_MS = 1_000;
/** How long a test waits for one healthy delivery before counting it as this late. */
const GIVE_UP_MS = 6_000;
/** The default `DELIVERY_TENANT_CONCURRENCY`. */
const TENANT_CAP = 8;

const SERVICE_ENV = {
  DELIVERY_TIMEOUT: `${TIMEOUT_MS}ms`,
  DELIVERY_RETRY_SCHEDULE: "1s,1s,2s,5s",
  LOG_LEVEL: "info",
};

/** The ways a tenant's callback breaks, each holding a delivery slot for most of the timeout. */
const BROKEN: Record<string, ScriptedCallbackAnswer> = {
  "hangs": { hang: true },
  "answers 500": { status: 500, delayMs: TIMEOUT_MS - 500 },
  "resets the connection": { reset: true, delayMs: TIMEOUT_MS - 500 },
};

/** A tenant whose callback answers every request as `answer`. */
async function brokenTenant(
  service: RunningService,
  fixture: RelayFixture,
  answer: ScriptedCallbackAnswer,
): Promise<{ tenantId: string; receiver: CallbackReceiver }> {
  const receiver = await startCallbackReceiver();
  receiver.script({ ...answer, times: Number.MAX_SAFE_INTEGER });
  return { tenantId: await relayTenant(service, fixture, receiver), receiver };
}

/** Posts the backlog through the receivers (spread over `services`), as the store does. */
async function postBacklog(
  services: RunningService[],
  tenantId: string,
  payloads: string[],
): Promise<void> {
  await forEachConcurrently(payloads, 8, async (payload, i) => {
    const outcome = await sendNotification(services[i % services.length].url, tenantId, payload);
    assert.equal(outcome.status, 200, `backlog notification ${i}: ${outcome.status}`);
  });
}

/**
 * Sends the healthy tenant's trickle and returns, for each notification, the time from the
 * receiver's 200 to the callback's receipt (`GIVE_UP_MS` when it did not come by then).
 */
async function trickle(
  services: RunningService[],
  healthy: { tenantId: string; receiver: CallbackReceiver },
  payloads: string[],
): Promise<number[]> {
  const waits = payloads.map(async (payload, i) => {
    await sleep(i * TRICKLE_EVERY_MS);
    const outcome = await sendNotification(
      services[i % services.length].url,
      healthy.tenantId,
      payload,
    );
    const acknowledgedAt = Date.now();
    assert.equal(outcome.status, 200, `healthy notification ${i}: ${outcome.status}`);
    const deadline = acknowledgedAt + GIVE_UP_MS;
    while (Date.now() < deadline) {
      const received = healthy.receiver.deliveries.find((d) =>
        d.headers["x-service-event-id"] === outcome.eventId
      );
      if (received) return Math.max(0, received.receivedAt - acknowledgedAt);
      await sleep(10);
    }
    return GIVE_UP_MS;
  });
  return await Promise.all(waits);
}

/** Waits until the broken callback holds `count` requests (the slots it can take are taken). */
async function waitUntilHolding(receiver: CallbackReceiver, count: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (receiver.inFlight() < count && Date.now() < deadline) await sleep(20);
}

Deno.test(`adversarial: a broken tenant's backlog does not delay another tenant (${ENGINE})`, async (t) => {
  const fixture = await relayFixture(SERVICE_ENV);
  const healthyReceiver = await startCallbackReceiver();
  const service = await startService({ env: fixture.env });
  try {
    const healthy = {
      tenantId: await relayTenant(service, fixture, healthyReceiver),
      receiver: healthyReceiver,
    };
    for (const [behaviour, answer] of Object.entries(BROKEN)) {
      await t.step(`a callback that ${behaviour}`, async () => {
        const broken = await brokenTenant(service, fixture, answer);
        try {
          await postBacklog(
            [service],
            broken.tenantId,
            await signedNotifications(
              fixture.signer,
              BACKLOG,
            ),
          );
          await waitUntilHolding(broken.receiver, TENANT_CAP);
          const latencies = await trickle(
            [service],
            healthy,
            await signedNotifications(fixture.signer, TRICKLE),
          );
          const max = Math.max(...latencies);
          reportFigures(`tenant isolation, a callback that ${behaviour} (${ENGINE})`, {
            backlog: BACKLOG,
            deliveryTimeoutMs: TIMEOUT_MS,
            healthyDeliveries: latencies.length,
            healthyMaxMs: max,
            brokenMaxInFlight: broken.receiver.maxInFlight(),
          });
          assert.ok(
            max <= BOUND_MS,
            `the healthy tenant waited up to ${max} ms (${latencies.join(", ")})`,
          );
          assert.ok(
            broken.receiver.maxInFlight() <= TENANT_CAP,
            `the broken callback held ${broken.receiver.maxInFlight()} requests at once`,
          );
          assert.equal(
            healthy.receiver.deliveries.filter((d) => d.answeredStatus === 200).length,
            healthy.receiver.deliveries.length,
          );
          // The failing callback is sent one delivery at a time once it has failed 5 in a row.
          await service.waitForLog(
            (line) => line.msg === "delivery_callback_failing" && line.tenantId === broken.tenantId,
            3 * TIMEOUT_MS,
          );
        } finally {
          // Its backlog waits while it is inactive, out of the next case's way.
          const deactivated = await service.cli("tenant", "deactivate", broken.tenantId);
          assert.equal(deactivated.code, 0, deactivated.stderr);
          await broken.receiver.close();
        }
      });
    }
  } finally {
    await service.stop();
    await service.db.drop();
    await healthyReceiver.close();
    await fixture.cleanup();
  }
});

Deno.test({
  name: "adversarial: the per-tenant cap holds across two replicas",
  // Replicas share PostgreSQL; the embedded engine serves one process.
  ignore: ENGINE === "embedded",
}, async () => {
  const fixture = await relayFixture(SERVICE_ENV);
  const healthyReceiver = await startCallbackReceiver();
  const services: RunningService[] = [];
  try {
    services.push(await startService({ env: fixture.env }));
    services.push(await startService({ env: fixture.env, db: services[0].db }));
    const healthy = {
      tenantId: await relayTenant(services[0], fixture, healthyReceiver),
      receiver: healthyReceiver,
    };
    const broken = await brokenTenant(services[0], fixture, BROKEN.hangs);
    try {
      await postBacklog(
        services,
        broken.tenantId,
        await signedNotifications(fixture.signer, BACKLOG),
      );
      await waitUntilHolding(broken.receiver, TENANT_CAP);
      const latencies = await trickle(
        services,
        healthy,
        await signedNotifications(fixture.signer, TRICKLE),
      );
      const max = Math.max(...latencies);
      reportFigures("tenant isolation, two replicas, a callback that hangs (postgresql)", {
        backlog: BACKLOG,
        deliveryTimeoutMs: TIMEOUT_MS,
        healthyDeliveries: latencies.length,
        healthyMaxMs: max,
        brokenMaxInFlight: broken.receiver.maxInFlight(),
      });
      assert.ok(
        max <= BOUND_MS,
        `the healthy tenant waited up to ${max} ms (${latencies.join(", ")})`,
      );
      // Each process alone would allow TENANT_CAP; together they must not exceed it either.
      assert.ok(
        broken.receiver.maxInFlight() <= TENANT_CAP,
        `the hanging callback held ${broken.receiver.maxInFlight()} requests at once`,
      );
    } finally {
      await broken.receiver.close();
    }
  } finally {
    for (const service of services) await service.stop();
    await services[0]?.db.drop();
    await healthyReceiver.close();
    await fixture.cleanup();
  }
});
