/**
 * A service process killed with SIGKILL while notifications stream in: every notification it
 * answered 200 is delivered after a restart, and the ones whose answer never came are accepted when
 * the store sends them again. Events delivered twice are counted; only attempts in flight at the
 * kill (claimed, not yet recorded) may be.
 */
import assert from "node:assert/strict";
import { connectDatabase } from "../src/db/connect.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { ENGINE, type RunningService, startService } from "../tests/helpers/service.ts";
import {
  acceptedPerEvent,
  forEachConcurrently,
  relayFixture,
  relayTenant,
  reportFigures,
  sendNotification,
  type SendOutcome,
  signedNotifications,
  sleep,
  waitUntilAllAccepted,
} from "./support.ts";

const NOTIFICATIONS = 400;
/** The kill lands once this many notifications were acknowledged. */
const KILL_AFTER_ACKS = 150;

Deno.test(`SIGKILL while notifications stream in loses nothing acknowledged (${ENGINE})`, async () => {
  const fixture = await relayFixture();
  // Slow answers keep attempts in flight, so the kill lands in the middle of some.
  const receiver = await startCallbackReceiver();
  receiver.script({ delayMs: 150, times: 1_000_000 });
  let service: RunningService | undefined = await startService({ env: fixture.env });
  const db = service.db;
  try {
    const tenantId = await relayTenant(service, fixture, receiver);
    const payloads = await signedNotifications(fixture.signer, NOTIFICATIONS);

    const outcomes: SendOutcome[] = new Array(NOTIFICATIONS);
    let acked = 0;
    let killed: Promise<number> | undefined;
    const url = service.url;
    await forEachConcurrently(payloads, 16, async (payload, i) => {
      outcomes[i] = await sendNotification(url, tenantId, payload, 10_000);
      if (outcomes[i].status === 200 && ++acked === KILL_AFTER_ACKS) {
        killed = service!.stop("SIGKILL");
      }
    });
    assert.ok(killed, "the kill happened while notifications streamed in");
    await killed;
    const ackedIds = outcomes.filter((o) => o.status === 200).map((o) => o.eventId!);
    const unanswered = outcomes.flatMap((o, i) => o.status === 200 ? [] : [i]);
    assert.ok(unanswered.length > 0, "some notifications were cut off by the kill");
    assert.ok(
      unanswered.every((i) => outcomes[i].status === "network-error"),
      "a notification not acknowledged got no answer at all, never an error answer",
    );

    // What the dead process held: claims it never recorded.
    const inFlightAtKill = await leasedDeliveries(db.env);
    const deliveredBeforeRestart = receiver.accepted().length;

    service = await startService({ env: fixture.env, db });
    // The store sends again what it got no 200 for; those are new events or duplicates of
    // events committed just before the kill (then answered with their first event id).
    const resent = new Map<string, number>();
    const restartedUrl = service.url;
    await forEachConcurrently(unanswered, 8, async (i) => {
      const outcome = await sendNotification(restartedUrl, tenantId, payloads[i], 10_000);
      assert.equal(outcome.status, 200, `resent notification ${i}: ${outcome.status}`);
      resent.set(outcome.eventId!, i);
    });
    const allIds = new Set([...ackedIds, ...resent.keys()]);
    assert.equal(allIds.size, NOTIFICATIONS, "one event per notification");

    // Lease takeover waits 2 x DELIVERY_TIMEOUT + 5 s after the kill.
    const counts = await waitUntilAllAccepted(receiver, allIds, 60_000);
    await sleep(1_500);
    const twice = [...acceptedPerEvent(receiver)].filter(([, n]) => n > 1).map(([id]) => id);
    assert.ok(
      twice.every((id) => inFlightAtKill.has(id)),
      `only attempts in flight at the kill may repeat: ${twice} vs ${[...inFlightAtKill]}`,
    );
    assert.ok(receiver.accepted().every((d) => d.signatureValid));
    // A clean stop after the storm is bounded too (attempts in flight, then the database).
    const stopStarted = performance.now();
    const exitCode = await Promise.race([service.stop(), sleep(30_000).then(() => "hung")]);
    assert.equal(exitCode, 0, "the restarted service stops cleanly within 30 s");
    reportFigures(`kill (${ENGINE})`, {
      stopMs: Math.round(performance.now() - stopStarted),
      notifications: NOTIFICATIONS,
      acknowledgedBeforeKill: ackedIds.length,
      cutOffByKill: unanswered.length,
      resentAsNew: [...resent.keys()].filter((id) => !ackedIds.includes(id)).length,
      deliveredBeforeRestart,
      attemptsInFlightAtKill: inFlightAtKill.size,
      delivered: counts.size,
      deliveredTwice: twice.length,
    });
  } finally {
    await service?.stop();
    await db.drop();
    await receiver.close();
    await fixture.cleanup();
  }
});

/** Event ids of deliveries still leased (claimed by the dead process, never recorded). */
async function leasedDeliveries(env: Record<string, string>): Promise<Set<string>> {
  const database = await connectDatabase({
    databaseUrl: env.DATABASE_URL ?? null,
    dataDir: env.DATA_DIR,
    poolSize: 1,
    timeoutMs: 10_000,
    shareEmbedded: false,
  });
  try {
    const rows = await database.sql<{ event_id: string }[]>`
      SELECT event_id FROM deliveries WHERE lease_owner IS NOT NULL AND status = 'pending'`;
    return new Set(rows.map((r) => r.event_id));
  } finally {
    await database.close();
  }
}
