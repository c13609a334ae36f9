/**
 * The database made unreachable while traffic flows (docs/postgresql.md, "The database goes away"),
 * through a TCP proxy between the service and PostgreSQL: `/health` stays 200, `/ready` turns 503
 * naming the failing check, verify answers 500 `INTERNAL_ERROR`, the receivers answer 500 so the
 * stores send again; nothing acknowledged is lost, and everything recovers without a restart.
 */
import assert from "node:assert/strict";
import { ENGINE, freshDatabase, startService } from "../tests/helpers/service.ts";
import { TEST_ISSUER_ID } from "../tests/helpers/fixtures.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { startStoreaApiSimulator } from "../simulators/storea_api.ts";
import {
  forEachConcurrently,
  relayFixture,
  relayTenant,
  reportFigures,
  sendNotification,
  type SendOutcome,
  signedRenewal,
  sleep,
  TcpProxy,
  waitUntilAllAccepted,
} from "./support.ts";

/** No answer may take longer than this, outage or not. */
const ANSWER_BOUND_MS = 10_000;
const OUTAGE_MS = 6_000;
/** How long a notification is sent again after the outage before it must have been accepted. */
const RESEND_WINDOW_MS = 5_000;
const TRANSACTION_ID = "2000000000000777";

interface Answer {
  status: number;
  // deno-lint-ignore no-explicit-any
  json: any;
  ms: number;
}

async function request(url: string, init: RequestInit = {}): Promise<Answer> {
  const started = performance.now();
  const response = await fetch(url, { ...init, signal: AbortSignal.timeout(ANSWER_BOUND_MS) });
  const json = await response.json();
  assert.match(response.headers.get("x-request-id") ?? "", /^req_/);
  return { status: response.status, json, ms: performance.now() - started };
}

/** Polls `probe` until `accept` holds; every probe must answer within the bound. */
async function until<T>(
  probe: () => Promise<T>,
  accept: (answer: T) => boolean,
  timeoutMs: number,
  what: string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const answer = await probe();
    if (accept(answer)) return answer;
    if (Date.now() > deadline) {
      throw new Error(`${what} not seen within ${timeoutMs} ms; last ${JSON.stringify(answer)}`);
    }
    await sleep(200);
  }
}

/**
 * `down`: the database is gone (connections dropped, new ones closed at once). `partition`: the
 * network is gone (connections stay open and nothing passes, both ways), the harder case: only
 * the service's own deadlines end what waits on the database.
 */
for (const mode of ["down", "partition"] as const) {
  Deno.test({
    name: `the database unreachable mid-traffic (${mode}): degraded, nothing lost, recovered`,
    // The embedded engine lives inside the service process: it cannot become unreachable.
    ignore: ENGINE === "embedded",
  }, () => outage(mode));
}

async function outage(mode: "down" | "partition"): Promise<void> {
  const fixture = await relayFixture();
  const receiver = await startCallbackReceiver();
  const api = await startStoreaApiSimulator({ signer: fixture.signer });
  await api.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: "com.example.app",
    privateKeyPem: await Deno.readTextFile(fixture.keyFile),
  });
  await api.addTransaction(
    "production",
    fixture.signer.sampleTransaction({ transactionId: TRANSACTION_ID }),
  );
  const db = await freshDatabase();
  const direct = new URL(db.env.DATABASE_URL);
  const proxy = TcpProxy.start(Number(direct.port || 5432));
  const proxied = new URL(direct);
  proxied.port = String(proxy.port);
  const service = await startService({
    db,
    env: {
      ...fixture.env,
      DATABASE_URL: proxied.toString(),
      ...api.serviceEnv,
      // Requests are answered within 3 x UPSTREAM_TIMEOUT + 5 s whatever the database does.
      UPSTREAM_TIMEOUT: "1s",
    },
  });
  let traffic: Promise<void> | undefined;
  let flowing = true;
  try {
    const tenantId = await relayTenant(service, fixture, receiver);
    const key = await service.cli("key", "create", tenantId);
    assert.equal(key.code, 0, key.stderr);
    const verify = () =>
      request(`${service.url}/v1/storea/verify`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.json.key}`, "content-type": "application/json" },
        body: JSON.stringify({ transactionId: TRANSACTION_ID }),
      });
    const health = () => request(`${service.url}/health`);
    const ready = () => request(`${service.url}/ready`);
    assert.equal((await verify()).json.valid, true);

    // Notifications keep arriving all through, as the stores send them.
    const sent: { payload: string; outcome: SendOutcome }[] = [];
    traffic = (async () => {
      await forEachConcurrently([0, 1, 2, 3], 4, async () => {
        while (flowing) {
          const payload = await signedRenewal(fixture.signer);
          const outcome = await sendNotification(
            service.url,
            tenantId,
            payload,
            ANSWER_BOUND_MS,
          );
          sent.push({ payload, outcome });
          await sleep(20);
        }
      });
    })();
    await sleep(1_500);

    if (mode === "down") proxy.down();
    else proxy.partition();
    const cutAt = performance.now();
    // Every check below must come within the answer bound, database or not.
    const healthDuring = await health();
    assert.equal(healthDuring.status, 200);
    assert.equal(healthDuring.json.status, "ok");
    const readyDuring = await until(ready, (a) => a.status === 503, 10_000, "ready 503");
    assert.equal(readyDuring.json.status, "degraded");
    assert.match(readyDuring.json.checks.db, /^fail/);
    const readyAfterMs = performance.now() - cutAt;
    const verifyDuring = await until(verify, (a) => a.status !== 200, 10_000, "verify failing");
    assert.equal(verifyDuring.status, 500);
    assert.deepEqual(
      { valid: verifyDuring.json.valid, error: verifyDuring.json.error },
      { valid: false, error: "INTERNAL_ERROR" },
    );
    const lastPayload = await signedRenewal(fixture.signer);
    const receiverDuring = await sendNotification(
      service.url,
      tenantId,
      lastPayload,
      ANSWER_BOUND_MS,
    );
    assert.equal(receiverDuring.status, 500, "the store is told to send again");
    sent.push({ payload: lastPayload, outcome: receiverDuring });
    await sleep(Math.max(0, OUTAGE_MS - (performance.now() - cutAt)));

    proxy.restore();
    const restoredAt = performance.now();
    await until(ready, (a) => a.status === 200, 15_000, "ready 200 again");
    const readyRecoveredMs = performance.now() - restoredAt;
    await until(verify, (a) => a.status === 200 && a.json.valid === true, 15_000, "verify again");
    await sleep(1_000); // traffic after the recovery
    flowing = false;
    await traffic;

    // Every answer came, within the bound, and was a 200 or a 500: never a hang, never a 4xx.
    const statuses = new Map<string, number>();
    for (const { outcome } of sent) {
      statuses.set(String(outcome.status), (statuses.get(String(outcome.status)) ?? 0) + 1);
    }
    assert.deepEqual(
      [...statuses.keys()].filter((s) => s !== "200" && s !== "500"),
      [],
      `answers during the outage: ${JSON.stringify(Object.fromEntries(statuses))}`,
    );
    assert.ok((statuses.get("500") ?? 0) > 0, "some notifications arrived during the outage");

    // The stores send again what was not acknowledged; then every event is delivered.
    const acknowledged = sent.filter((s) => s.outcome.status === 200).map((s) =>
      s.outcome.eventId!
    );
    // As a store does, each is sent until it is accepted. A 500 is still a correct answer just
    // after the recovery (seen once under CI's load: a pooled connection not yet back while /ready
    // was); the figures count the notifications it took more than one send, and a few seconds
    // must be enough.
    const retried: string[] = [];
    let resentMoreThanOnce = 0;
    for (const { payload, outcome } of sent) {
      if (outcome.status === 200) continue;
      let sends = 0;
      const again = await until(
        () => {
          sends++;
          return sendNotification(service.url, tenantId, payload);
        },
        (answer) => answer.status !== 500,
        RESEND_WINDOW_MS,
        "an answer other than 500 to a notification sent again",
      );
      if (sends > 1) resentMoreThanOnce++;
      assert.equal(again.status, 200, "a notification sent again after the outage is accepted");
      retried.push(again.eventId!);
    }
    const all = new Set([...acknowledged, ...retried]);
    const counts = await waitUntilAllAccepted(receiver, all, 60_000);
    const twice = [...counts.values()].filter((n) => n > 1).length;
    assert.ok(receiver.accepted().every((d) => d.signatureValid));
    const exited = await Promise.race([
      service.exited.then(() => true),
      sleep(0).then(() => false),
    ]);
    assert.equal(exited, false, "recovered without a restart");
    reportFigures(`database outage (${mode})`, {
      outageMs: OUTAGE_MS,
      notificationsSent: sent.length,
      answeredDuringOutage500: statuses.get("500") ?? 0,
      slowestAnswerMs: Math.round(Math.max(...sent.map((s) => s.outcome.latencyMs))),
      readyDegradedAfterMs: Math.round(readyAfterMs),
      readyRecoveredAfterMs: Math.round(readyRecoveredMs),
      acknowledged: acknowledged.length,
      acceptedOnResend: retried.length,
      resentMoreThanOnce,
      delivered: counts.size,
      deliveredTwice: twice,
    });
  } finally {
    flowing = false;
    await traffic?.catch(() => {});
    proxy.restore();
    await service.stop();
    proxy.close();
    await db.drop();
    await api.close();
    await receiver.close();
    await fixture.cleanup();
  }
}
