/**
 * The dispatcher end to end: retries on the schedule to `failed`, every attempt recorded, manual
 * retry, `Retry-After`, no redirects, timeouts, the 4 KB body record, inactive tenants waiting,
 * secret rotation, `webhook test`, and a graceful shutdown that lets an attempt in flight finish.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  databaseOf,
  runCli,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { cliOk, deliveryOf, deliveryReaches, eventually, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { type CallbackReceiver, startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { verifySignature } from "../simulators/webhook_signature.ts";

/** A service with a store A tenant whose callback is a local receiver. */
interface Relay {
  service: RunningService;
  receiver: CallbackReceiver;
  tenantId: string;
  secret: string;
  /** Sends a fresh DID_RENEW notification; resolves with its event id. */
  notify(): Promise<string>;
  close(): Promise<void>;
}

async function startRelay(env: Record<string, string> = {}): Promise<Relay> {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s,1s",
      DELIVERY_TIMEOUT: "1s",
      ...env,
    },
  });
  // Set up as an operator whose CLI allows the local callback, whatever the service's own rule.
  const setup = async (...args: string[]) => {
    const result = await runCli(args, {
      ...service.env,
      CALLBACK_ALLOW_HTTP: "true",
      CALLBACK_ALLOW_PRIVATE_NETWORKS: "true",
    });
    assert.equal(result.code, 0, result.stderr);
    return result.json;
  };
  const tenant = await setup("tenant", "create", "--name", "Relay", "--callback-url", receiver.url);
  const tenantId: string = tenant.id;
  receiver.setSecrets([tenant.webhookSecret]);
  await setup(...storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir)));
  return {
    service,
    receiver,
    tenantId,
    secret: tenant.webhookSecret,
    async notify() {
      const signedPayload = await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      );
      const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
        signedPayload,
      });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      return answer.json.eventId;
    },
    async close() {
      await stopAndDrop(service);
      await receiver.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

// deno-lint-ignore no-explicit-any
function bodyOf(delivery: { json: unknown }): any {
  return delivery.json;
}

Deno.test("delivery: retries, failure, manual retry and what each attempt records", async (t) => {
  const relay = await startRelay();
  const { service, receiver } = relay;
  const sql = databaseOf(service);
  const requestsFor = (eventId: string) =>
    receiver.deliveries.filter((d) => bodyOf(d)?.eventId === eventId);
  let failedId = "";
  let failedEventId = "";
  try {
    await t.step("non-2xx answers follow the schedule, then the delivery fails", async () => {
      receiver.script({ status: 500, body: "boom", times: 3 });
      const eventId = await relay.notify();
      const row = await deliveryReaches(sql, eventId, "failed");
      const requests = requestsFor(eventId);
      assert.equal(requests.length, 3, "first attempt + 2 retries");
      // Each retry waits its scheduled delay after the previous attempt.
      for (let i = 1; i < requests.length; i++) {
        assert.ok(requests[i].receivedAt - requests[i - 1].receivedAt >= 950);
      }
      // Every attempt is signed afresh; the event id stays the same.
      for (const request of requests) {
        assert.equal(request.signatureValid, true);
        assert.equal(request.headers["x-service-event-id"], eventId);
      }
      assert.equal(row.last_response_code, 500);
      assert.equal(row.last_response_body, "boom");
      assert.equal(row.attempts, 3);

      const shown = await cliOk(service, "deliveries", "show", row.id);
      assert.equal(shown.status, "failed");
      assert.equal(shown.eventId, eventId);
      assert.equal(shown.attemptLog.length, 3);
      for (const attempt of shown.attemptLog) {
        assert.equal(attempt.responseCode, 500);
        assert.equal(attempt.responseBody, "boom");
        assert.equal(attempt.error, null);
        assert.equal(typeof attempt.durationMs, "number");
        assert.ok(Date.parse(attempt.attemptedAt) > 0);
      }
      assert.equal(shown.payload.eventId, eventId);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      assert.equal(requestsFor(eventId).length, 3, "no automatic attempt after failed");
      failedId = row.id;
      failedEventId = eventId;
    });

    await t.step("deliveries retry sends it again at once, with a fresh schedule", async () => {
      const row = { id: failedId };
      const eventId = failedEventId;
      const started = Date.now();
      const retried = await cliOk(service, "deliveries", "retry", row.id);
      assert.deepEqual(retried.queued, [row.id]);
      const delivered = await deliveryReaches(sql, eventId, "delivered");
      // Woken through the database, not by the minute sweep.
      assert.ok(Date.now() - started < 8_000);
      assert.equal(delivered.last_response_code, 200);
      assert.equal(requestsFor(eventId).length, 4);
      const list = await cliOk(
        service,
        "deliveries",
        "list",
        "--tenant",
        relay.tenantId,
        "--status",
        "delivered",
      );
      assert.ok(list.deliveries.some((d: { id: string }) => d.id === row.id));
    });

    await t.step("a 503 with Retry-After waits longer than the schedule asks", async () => {
      receiver.script({ status: 503, headers: { "Retry-After": "3" } });
      const eventId = await relay.notify();
      await deliveryReaches(sql, eventId, "delivered");
      const [first, second] = requestsFor(eventId);
      assert.ok(second.receivedAt - first.receivedAt >= 2900, "Retry-After: 3 honoured");
    });

    await t.step("redirects are failures and are not followed", async () => {
      receiver.script({ status: 302, headers: { Location: receiver.url + "/elsewhere" } });
      const eventId = await relay.notify();
      const row = await deliveryReaches(sql, eventId, "delivered");
      assert.equal(row.attempts, 2);
      const attempts = await sql`
        SELECT response_code FROM delivery_attempts WHERE delivery_id = ${row.id} ORDER BY id`;
      assert.deepEqual(attempts.map((a) => a.response_code), [302, 200]);
      assert.ok(!receiver.deliveries.some((d) => d.path.includes("elsewhere")));
    });

    await t.step("a callback that hangs or resets is an attempt with an error", async () => {
      receiver.script({ hang: true });
      receiver.script({ reset: true });
      const eventId = await relay.notify();
      const row = await deliveryReaches(sql, eventId, "delivered");
      const attempts = await sql`
        SELECT response_code, error, duration_ms FROM delivery_attempts
        WHERE delivery_id = ${row.id} ORDER BY id`;
      assert.equal(attempts.length, 3);
      assert.equal(attempts[0].response_code, null);
      assert.match(attempts[0].error, /no answer within 1000 ms/);
      assert.ok(attempts[0].duration_ms >= 950 && attempts[0].duration_ms < 3000);
      assert.equal(attempts[1].response_code, null);
      assert.ok(attempts[1].error.length > 0);
      assert.equal(attempts[2].response_code, 200);
    });

    await t.step("only the first 4 KB of an answer's body is kept", async () => {
      receiver.script({ status: 500, bodyBytes: 100_000 });
      const eventId = await relay.notify();
      const row = await deliveryReaches(sql, eventId, "delivered");
      const [attempt] = await sql`
        SELECT response_code, response_body FROM delivery_attempts
        WHERE delivery_id = ${row.id} ORDER BY id LIMIT 1`;
      assert.equal(attempt.response_code, 500);
      assert.equal(attempt.response_body, "x".repeat(4096));
    });

    await t.step("an answer with a NUL byte is recorded once, not sent again", async () => {
      // PostgreSQL's text cannot hold U+0000: stored as it came, the record failed, the lease ran
      // out and the delivery was sent again every lease, with no attempt ever recorded.
      receiver.script({ status: 200, body: "ok\u0000done" });
      const eventId = await relay.notify();
      const row = await deliveryReaches(sql, eventId, "delivered");
      const attempts = await sql`
        SELECT response_code, response_body FROM delivery_attempts WHERE delivery_id = ${row.id}`;
      assert.deepEqual(attempts.map((a) => [a.response_code, a.response_body]), [
        [200, "ok\uFFFDdone"],
      ]);
      assert.equal(row.last_response_body, "ok\uFFFDdone");
      assert.equal(requestsFor(eventId).length, 1);
    });

    await t.step("an inactive tenant's deliveries wait until it is activated", async () => {
      // The retry is asked for 6 s later, so the deactivation lands before it falls due however
      // long the CLI takes to start; past its due time it must still not be attempted.
      receiver.script({ status: 503, headers: { "Retry-After": "6" } });
      const eventId = await relay.notify();
      const first = await eventually(
        async () => {
          const found = await deliveryOf(sql, eventId);
          return found?.attempts === 1 ? found : undefined;
        },
        10_000,
        "first attempt",
      );
      await cliOk(service, "tenant", "deactivate", relay.tenantId);
      const due = new Date(first.next_attempt_at).getTime();
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, due - Date.now()) + 2500));
      const waiting = await deliveryOf(sql, eventId);
      assert.equal(waiting.status, "pending");
      assert.equal(waiting.attempts, 1, "no attempt while inactive");
      await cliOk(service, "tenant", "activate", relay.tenantId);
      await deliveryReaches(sql, eventId, "delivered", 10_000);
    });

    await t.step(
      "rotate-secret: both signatures during the grace period, then the new one",
      async () => {
        const rotated = await cliOk(
          service,
          "tenant",
          "rotate-secret",
          relay.tenantId,
          "--grace",
          "3s",
        );
        assert.match(rotated.webhookSecret, /^whsec_[A-Za-z0-9_-]{43}$/);
        assert.notEqual(rotated.webhookSecret, relay.secret);
        assert.ok(Date.parse(rotated.previousSecretValidUntil) > Date.now());
        const during = await relay.notify();
        await eventually(() => requestsFor(during).length === 1 ? true : undefined);
        const [request] = requestsFor(during);
        const header = request.headers["x-service-signature"];
        assert.match(header, /^t=\d+,v1=[0-9a-f]{64},v1=[0-9a-f]{64}$/);
        // Receivers that know only one of the secrets both accept it; the new one comes first.
        assert.ok(verifySignature(rotated.webhookSecret, header, request.body));
        assert.ok(verifySignature(relay.secret, header, request.body));
        const [, newSignature] = header.split(",");
        assert.ok(
          verifySignature(
            rotated.webhookSecret,
            `${header.split(",")[0]},${newSignature}`,
            request.body,
          ),
        );

        await new Promise((resolve) => setTimeout(resolve, 3200));
        const after = await relay.notify();
        await eventually(() => requestsFor(after).length === 1 ? true : undefined);
        const afterHeader = requestsFor(after)[0].headers["x-service-signature"];
        assert.match(afterHeader, /^t=\d+,v1=[0-9a-f]{64}$/);
        assert.ok(verifySignature(rotated.webhookSecret, afterHeader, requestsFor(after)[0].body));
        assert.ok(!verifySignature(relay.secret, afterHeader, requestsFor(after)[0].body));
        relay.secret = rotated.webhookSecret;
        receiver.setSecrets([relay.secret]);
      },
    );

    await t.step("webhook test sends a signed test event and reports the answer", async () => {
      const before = receiver.deliveries.length;
      const ok = await cliOk(service, "webhook", "test", relay.tenantId);
      assert.equal(ok.delivered, true);
      assert.equal(ok.responseCode, 200);
      assert.match(ok.eventId, /^evt_/);
      const request = receiver.deliveries[before];
      assert.equal(request.signatureValid, true);
      assert.equal(request.headers["x-service-event"], "test");
      assert.equal(bodyOf(request).event, "test");
      assert.equal(bodyOf(request).tenantId, relay.tenantId);

      receiver.script({ status: 500, body: "down" });
      const failed = await service.cli("webhook", "test", relay.tenantId);
      assert.equal(failed.code, 1, failed.stderr);
      assert.equal(failed.json.error, "WEBHOOK_TEST_FAILED");
      assert.equal(failed.json.responseCode, 500);
      assert.equal(failed.json.responseBody, "down");
    });

    await t.step("the CLI's errors and usage", async () => {
      const missing = await service.cli("deliveries", "show", "dlv_01JAAAAAAAAAAAAAAAAAAAAAAA");
      assert.equal(missing.code, 1);
      assert.equal(missing.json.error, "DELIVERY_NOT_FOUND");
      assert.equal((await service.cli("deliveries", "list", "--status", "odd")).code, 2);
      assert.equal((await service.cli("deliveries", "retry")).code, 2);
      assert.equal(
        (await service.cli(
          "deliveries",
          "retry",
          "--tenant",
          relay.tenantId,
          "--status",
          "failed",
          "--since",
          "yesterday",
        )).code,
        2,
      );
      assert.equal(
        (await service.cli("tenant", "rotate-secret", relay.tenantId, "--grace", "soon")).code,
        2,
      );
      const since = await cliOk(
        service,
        "deliveries",
        "retry",
        "--tenant",
        relay.tenantId,
        "--status",
        "failed",
        "--since",
        new Date(Date.now() + 60_000).toISOString(),
      );
      assert.deepEqual(since.queued, []);
    });
  } finally {
    await sql.end();
    await relay.close();
  }
});

Deno.test("delivery: the callback is re-checked at send time", async () => {
  const relay = await startRelay({ CALLBACK_ALLOW_HTTP: "false" });
  const sql = databaseOf(relay.service);
  try {
    // The callback was accepted when it was set (the CLI ran with the default, insecure allowed
    // outside production); the service, configured stricter, refuses it at send time.
    const eventId = await relay.notify();
    const row = await eventually(async () => {
      const found = await deliveryOf(sql, eventId);
      return found?.attempts >= 1 ? found : undefined;
    });
    assert.match(row.last_error, /callback URL refused: must use https/);
    assert.equal(row.last_response_code, null);
    assert.equal(relay.receiver.deliveries.length, 0);
  } finally {
    await sql.end();
    await relay.close();
  }
});

Deno.test("delivery: shutdown lets an attempt in flight finish and records it", async () => {
  const relay = await startRelay({ DELIVERY_TIMEOUT: "5s" });
  try {
    relay.receiver.script({ delayMs: 1500 });
    const eventId = await relay.notify();
    await eventually(() => relay.receiver.inFlight() === 1 ? true : undefined);
    const code = await relay.service.stop("SIGTERM");
    assert.equal(code, 0);
    assert.equal(relay.receiver.accepted().length, 1);
    const check = await runCli(["deliveries", "list", "--status", "delivered"], relay.service.env);
    assert.equal(check.code, 0, check.stderr);
    assert.ok(
      check.json.deliveries.some((d: { eventId: string }) => d.eventId === eventId),
      "the attempt in flight at shutdown was recorded as delivered",
    );
  } finally {
    await relay.close();
  }
});

Deno.test("delivery: after a 2xx, the next first attempt is handed over, not claimed", async () => {
  const relay = await startRelay({ LOG_LEVEL: "info" });
  const sql = databaseOf(relay.service);
  const received = async (eventId: string) =>
    (await relay.service.waitForLog((line) =>
      line.msg === "notification_received" && line.eventId === eventId
    )).handedOver;
  try {
    // A callback not heard from yet: the first delivery is claimed.
    const first = await relay.notify();
    assert.equal(await received(first), false);
    await deliveryReaches(sql, first, "delivered");

    const second = await relay.notify();
    assert.equal(await received(second), true);
    await deliveryReaches(sql, second, "delivered");
    assert.equal(relay.receiver.accepted().length, 2);

    // Still healthy when it arrives: handed over, and the callback answers 500 this time.
    relay.receiver.script({ status: 500 });
    const third = await relay.notify();
    assert.equal(await received(third), true);
    await eventually(async () => (await deliveryOf(sql, third)).attempts === 1 || undefined);
    // The last answer was not a 2xx: the next goes through a claim.
    const fourth = await relay.notify();
    assert.equal(await received(fourth), false);
    await deliveryReaches(sql, fourth, "delivered");
    await deliveryReaches(sql, third, "delivered");
  } finally {
    await sql.end();
    await relay.close();
  }
});

Deno.test("delivery: at most DELIVERY_CONCURRENCY attempts are in flight", async () => {
  const relay = await startRelay({ DELIVERY_CONCURRENCY: "2", DELIVERY_TIMEOUT: "5s" });
  const sql = databaseOf(relay.service);
  try {
    relay.receiver.script({ delayMs: 400, times: 6 });
    const eventIds = await Promise.all(Array.from({ length: 6 }, () => relay.notify()));
    for (const eventId of eventIds) {
      await deliveryReaches(sql, eventId, "delivered");
    }
    assert.equal(relay.receiver.accepted().length, 6);
    assert.equal(relay.receiver.maxInFlight(), 2, "the bound was reached and never exceeded");
    // Each finished attempt was recorded by the statement that claimed the next: had that
    // statement failed, each record would have been retried alone, and said so.
    const warnings = relay.service.logs.filter((line) => line.level !== "info");
    assert.deepEqual(warnings.map((line) => line.msg), []);
  } finally {
    await sql.end();
    await relay.close();
  }
});
