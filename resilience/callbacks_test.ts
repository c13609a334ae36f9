/**
 * Callbacks that misbehave the ways real ones do: they hang, answer after the timeout, reset the
 * connection, or answer a huge body. The dispatcher keeps its concurrency bound, ends every attempt
 * at its timeout, keeps only the first 4 KB of a body and its memory flat; every event is still
 * delivered once the callback behaves.
 */
import assert from "node:assert/strict";
import { databaseOf, ENGINE, startService } from "../tests/helpers/service.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { RESPONSE_BODY_LIMIT } from "../src/delivery/sender.ts";
import {
  forEachConcurrently,
  relayFixture,
  relayTenant,
  reportFigures,
  sendNotification,
  signedNotifications,
  waitUntilAllAccepted,
} from "./support.ts";

const NOTIFICATIONS = 60;
const CONCURRENCY = 4;
const TIMEOUT_MS = 1_000;
/** Bad answers of each kind, given to the first requests. */
const EACH = 6;
const HUGE_BODY_BYTES = 32 * 1024 * 1024;

/** Resident memory of `pid` (`ps`: reading /proc directly needs every permission in Deno). */
async function rssBytes(pid: number): Promise<number> {
  const { stdout } = await new Deno.Command("ps", { args: ["-o", "rss=", "-p", String(pid)] })
    .output();
  return Number(new TextDecoder().decode(stdout).trim()) * 1024;
}

Deno.test(`misbehaving callbacks keep the dispatcher bounded (${ENGINE})`, async () => {
  const fixture = await relayFixture({
    DELIVERY_CONCURRENCY: String(CONCURRENCY),
    DELIVERY_TIMEOUT: `${TIMEOUT_MS}ms`,
    DELIVERY_RETRY_SCHEDULE: "1s,1s,1s",
  });
  const receiver = await startCallbackReceiver();
  const service = await startService({ env: fixture.env });
  try {
    const tenantId = await relayTenant(service, fixture, receiver);
    for (let i = 0; i < EACH; i++) {
      receiver.script({ hang: true });
      receiver.script({ delayMs: 3 * TIMEOUT_MS });
      receiver.script({ reset: true });
      receiver.script({ status: 200, bodyBytes: HUGE_BODY_BYTES });
      receiver.script({ status: 500, bodyBytes: HUGE_BODY_BYTES });
    }
    const payloads = await signedNotifications(fixture.signer, NOTIFICATIONS);
    const rssBefore = await rssBytes(service.pid);
    let rssPeak = rssBefore;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        rssPeak = Math.max(rssPeak, await rssBytes(service.pid));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();

    const started = performance.now();
    const eventIds: string[] = [];
    await forEachConcurrently(payloads, 8, async (payload) => {
      const outcome = await sendNotification(service.url, tenantId, payload);
      assert.equal(outcome.status, 200);
      eventIds.push(outcome.eventId!);
    });
    await waitUntilAllAccepted(receiver, eventIds, 60_000);
    const allDeliveredMs = performance.now() - started;
    sampling = false;
    await sampler;

    assert.ok(
      receiver.maxInFlight() <= CONCURRENCY,
      `at most ${CONCURRENCY} attempts at once, saw ${receiver.maxInFlight()}`,
    );
    const sql = databaseOf(service);
    try {
      const attempts = await sql<
        { duration_ms: number; response_code: number | null; body: number; error: string | null }[]
      >`SELECT duration_ms, response_code, coalesce(length(response_body), 0) AS body, error
        FROM delivery_attempts`;
      assert.equal(attempts.length, receiver.deliveries.length, "every attempt recorded");
      const slowest = Math.max(...attempts.map((a) => a.duration_ms));
      // The timeout ends hanging and slow answers; a little slack for a busy machine.
      assert.ok(slowest < TIMEOUT_MS + 750, `slowest attempt ${slowest} ms`);
      const timedOut = attempts.filter((a) =>
        a.response_code === null && /^no answer within/.test(a.error ?? "")
      );
      assert.ok(
        timedOut.length >= 2 * EACH,
        `hanging and slow answers timed out: ${timedOut.length}`,
      );
      const resets = attempts.filter((a) =>
        a.response_code === null && !/^no answer within/.test(a.error ?? "")
      );
      assert.ok(resets.length >= EACH, `resets recorded as network errors: ${resets.length}`);
      assert.ok(attempts.every((a) => a.body <= RESPONSE_BODY_LIMIT), "bodies cut at 4 KB");
      const [{ delivered }] = await sql<{ delivered: number }[]>`
        SELECT count(*)::int AS delivered FROM deliveries WHERE status = 'delivered'`;
      assert.equal(delivered, NOTIFICATIONS);
      const growth = rssPeak - rssBefore;
      // 12 answers of 32 MB each passed through: none of it may be held.
      assert.ok(growth < 96 * 1024 * 1024, `RSS grew by ${Math.round(growth / 2 ** 20)} MB`);
      reportFigures(`callbacks (${ENGINE})`, {
        notifications: NOTIFICATIONS,
        concurrency: CONCURRENCY,
        maxInFlightSeen: receiver.maxInFlight(),
        attempts: attempts.length,
        timeoutMs: TIMEOUT_MS,
        slowestAttemptMs: slowest,
        hugeBodyBytes: HUGE_BODY_BYTES,
        rssBeforeMB: Math.round(rssBefore / 2 ** 20),
        rssPeakMB: Math.round(rssPeak / 2 ** 20),
        allDeliveredInMs: Math.round(allDeliveredMs),
      });
    } finally {
      await sql.end();
    }
  } finally {
    await service.stop();
    await service.db.drop();
    await receiver.close();
    await fixture.cleanup();
  }
});
