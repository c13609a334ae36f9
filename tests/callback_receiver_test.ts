/**
 * The callback receiver (the tenant's side of a delivery) and the copyable verification examples in
 * docs/examples, over real HTTP on loopback with real signatures.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { signatureHeader } from "../src/delivery/signature.ts";
import {
  type CallbackReceiver,
  type CallbackReceiverOptions,
  startCallbackReceiver,
} from "../simulators/callback_receiver.ts";
import { checkDelivery, verifyDelivery } from "../docs/examples/verify_delivery.ts";

const SECRET = "whsec_0123456789abcdef0123456789abcdef";
const NEW_SECRET = "whsec_fedcba9876543210fedcba9876543210";
const EVENT_ID = "evt_01JD3Q8Z9V6B2M4K7T1XW5N0RC";
const PAYLOAD = {
  event: "subscription.renewed",
  reason: null,
  platformEvent: "storea.did_renew",
  eventId: EVENT_ID,
  externalId: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
  timestamp: "2026-11-14T22:13:20.000Z",
  tenantId: "tenant_01JD3Q8Z9V6B2M4K7T1XW5N0RD",
  source: "storea",
  subject: { key: "2000000100000000", productId: "pro.monthly", type: "subscription" },
  data: { notificationType: "DID_RENEW" },
  raw: { notificationType: "DID_RENEW" },
};
const BODY = JSON.stringify(PAYLOAD);
const PYTHON_EXAMPLE = fileURLToPath(
  new URL("../docs/examples/verify_delivery.py", import.meta.url),
);

function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

interface DeliverOptions {
  secrets?: string[];
  body?: string;
  t?: number;
  url?: string;
  method?: string;
  signal?: AbortSignal;
  redirect?: RequestRedirect;
}

/** Sends a delivery as the service does: signed afresh, with the `X-Service-*` headers. */
function deliver(receiver: CallbackReceiver, options: DeliverOptions = {}): Promise<Response> {
  const t = options.t ?? nowSeconds();
  const body = options.body ?? BODY;
  return fetch(options.url ?? receiver.url, {
    method: options.method ?? "POST",
    headers: {
      "Content-Type": "application/json",
      "User-Agent": "purchase-relay/dev",
      "X-Service-Event": PAYLOAD.event,
      "X-Service-Event-Id": EVENT_ID,
      "X-Service-Timestamp": String(t),
      "X-Service-Signature": signatureHeader(options.secrets ?? [SECRET], t, body),
    },
    body: options.method === "GET" ? undefined : body,
    signal: options.signal,
    redirect: options.redirect,
  });
}

/** Delivers and reads the answer, so no response body is left open. */
async function deliverAndRead(
  receiver: CallbackReceiver,
  options: DeliverOptions = {},
): Promise<{ status: number; headers: Headers; text: string }> {
  const response = await deliver(receiver, options);
  return { status: response.status, headers: response.headers, text: await response.text() };
}

async function withReceiver(
  options: CallbackReceiverOptions,
  run: (receiver: CallbackReceiver) => Promise<void>,
): Promise<void> {
  const receiver = await startCallbackReceiver(options);
  try {
    await run(receiver);
  } finally {
    await receiver.close();
  }
}

/** Polls until `condition` holds, for server-side effects of a client leaving. */
async function eventually(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 2_000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

Deno.test("callback receiver: records a signed delivery and answers 200", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    assert.match(receiver.url, /^http:\/\/127\.0\.0\.1:\d+\/hooks$/);
    const before = Date.now();
    const answer = await deliverAndRead(receiver);
    assert.equal(answer.status, 200);
    assert.equal(answer.text, '{"ok":true}');
    assert.equal(answer.headers.get("connection"), "close");
    assert.equal(answer.headers.get("content-type"), "application/json");

    assert.equal(receiver.deliveries.length, 1);
    const [delivery] = receiver.deliveries;
    assert.equal(delivery.method, "POST");
    assert.equal(delivery.path, "/hooks");
    assert.equal(delivery.body, BODY);
    assert.deepEqual(delivery.json, PAYLOAD);
    assert.equal(delivery.signatureValid, true);
    assert.equal(delivery.answeredStatus, 200);
    assert.ok(delivery.receivedAt >= before && delivery.receivedAt <= Date.now());
    assert.equal(delivery.headers["x-service-event"], "subscription.renewed");
    assert.equal(delivery.headers["x-service-event-id"], EVENT_ID);
    assert.equal(delivery.headers["user-agent"], "purchase-relay/dev");
    assert.equal(delivery.headers["content-type"], "application/json");
    assert.match(delivery.headers["x-service-signature"], /^t=\d+,v1=[0-9a-f]{64}$/);
    assert.deepEqual(receiver.accepted(), [delivery]);
    assert.equal(receiver.inFlight(), 0);
    assert.equal(receiver.maxInFlight(), 1);
  });
});

Deno.test("callback receiver: an invalid signature is recorded, not refused", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    const wrongSecret = await deliverAndRead(receiver, { secrets: ["whsec_other"] });
    const stale = await deliverAndRead(receiver, { t: nowSeconds() - 301 });
    const notJson = await deliverAndRead(receiver, { body: "not json" });
    const response = await fetch(receiver.url, { method: "POST", body: BODY });
    await response.body?.cancel();
    assert.deepEqual([wrongSecret.status, stale.status, notJson.status, response.status], [
      200,
      200,
      200,
      200,
    ]);
    assert.deepEqual(receiver.deliveries.map((d) => d.signatureValid), [false, false, true, false]);
    assert.deepEqual(receiver.deliveries.map((d) => d.signatureRefusal), [
      "no_matching_signature",
      "timestamp_outside_tolerance",
      null,
      "no_header",
    ]);
    assert.equal(receiver.deliveries[2].json, null);
    assert.equal(receiver.deliveries[2].body, "not json");
    assert.equal(receiver.deliveries[3].headers["x-service-signature"], undefined);
  });
});

Deno.test("callback receiver: a rotation's two v1 verify with either secret", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    // The service signs with the new secret first and the old one second.
    await deliverAndRead(receiver, { secrets: [NEW_SECRET, SECRET] });
    receiver.setSecrets([NEW_SECRET]);
    await deliverAndRead(receiver, { secrets: [NEW_SECRET, SECRET] });
    await deliverAndRead(receiver, { secrets: [SECRET] });
    receiver.setSecrets([NEW_SECRET, SECRET]);
    await deliverAndRead(receiver, { secrets: [SECRET] });
    receiver.setSecrets([]);
    await deliverAndRead(receiver, { secrets: [SECRET] });
    assert.deepEqual(
      receiver.deliveries.map((d) => d.signatureValid),
      [true, true, false, true, false],
    );
    assert.match(
      receiver.deliveries[0].headers["x-service-signature"],
      /^t=\d+(,v1=[0-9a-f]{64}){2}$/,
    );
  });
});

Deno.test("callback receiver: rejectInvalidSignatures answers 401 without using a script", async () => {
  await withReceiver({ secrets: [SECRET], rejectInvalidSignatures: true }, async (receiver) => {
    receiver.script({ status: 500 });
    const forged = await deliverAndRead(receiver, { secrets: ["whsec_forged"] });
    assert.equal(forged.status, 401);
    assert.equal(forged.text, '{"error":"invalid signature","reason":"no_matching_signature"}');
    const stale = await deliverAndRead(receiver, { t: nowSeconds() - 600 });
    assert.equal(stale.status, 401);
    assert.equal(
      stale.text,
      '{"error":"invalid signature","reason":"timestamp_outside_tolerance"}',
    );
    assert.equal((await deliverAndRead(receiver)).status, 500);
    assert.equal((await deliverAndRead(receiver)).status, 200);
    assert.deepEqual(receiver.deliveries.map((d) => [d.signatureValid, d.answeredStatus]), [
      [false, 401],
      [false, 401],
      [true, 500],
      [true, 200],
    ]);
    assert.equal(receiver.accepted().length, 1);
  });
});

Deno.test("callback receiver: toleranceSeconds and path are options", async () => {
  await withReceiver({ secrets: [SECRET], toleranceSeconds: 10, path: "/tenant/a" }, async (r) => {
    assert.ok(r.url.endsWith("/tenant/a"));
    await deliverAndRead(r, { t: nowSeconds() - 5 });
    await deliverAndRead(r, { t: nowSeconds() - 60 });
    assert.deepEqual(r.deliveries.map((d) => d.signatureValid), [true, false]);
    // Another path or method is recorded too, but answered 404 / 405 and uses no script.
    r.script({ status: 503 });
    const elsewhere = await deliverAndRead(r, { url: r.url.replace("/tenant/a", "/other") });
    assert.equal(elsewhere.status, 404);
    const get = await deliverAndRead(r, { method: "GET" });
    assert.equal(get.status, 405);
    assert.equal(get.headers.get("allow"), "POST");
    assert.equal((await deliverAndRead(r)).status, 503);
    assert.deepEqual(r.deliveries.map((d) => d.answeredStatus), [200, 200, 404, 405, 503]);
  });
});

Deno.test("callback receiver: scripted statuses, headers and bodies", async (t) => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    await t.step("a status with its default body", async () => {
      receiver.script({ status: 500 });
      receiver.script({ status: 202 });
      const failed = await deliverAndRead(receiver);
      assert.equal(failed.status, 500);
      assert.equal(failed.text, '{"error":"scripted"}');
      const accepted = await deliverAndRead(receiver);
      assert.equal(accepted.status, 202);
      assert.equal(accepted.text, '{"ok":true}');
    });

    await t.step("Retry-After and a custom body", async () => {
      receiver.script({ status: 429, headers: { "Retry-After": "120" }, body: "slow down" });
      const limited = await deliverAndRead(receiver);
      assert.equal(limited.status, 429);
      assert.equal(limited.headers.get("retry-after"), "120");
      assert.equal(limited.text, "slow down");
    });

    await t.step("a redirect is answered as scripted, not followed by the receiver", async () => {
      receiver.script({ status: 302, headers: { Location: "https://elsewhere.example/hooks" } });
      const moved = await deliverAndRead(receiver, { redirect: "manual" });
      assert.equal(moved.status, 302);
      assert.equal(moved.headers.get("location"), "https://elsewhere.example/hooks");
    });

    await t.step(
      "204 has no body; a scripted Connection header cannot keep the socket",
      async () => {
        receiver.script({ status: 204, headers: { connection: "keep-alive" } });
        const empty = await deliverAndRead(receiver);
        assert.equal(empty.status, 204);
        assert.equal(empty.text, "");
        assert.equal(empty.headers.get("connection"), "close");
      },
    );

    await t.step("bodyBytes answers that many bytes", async () => {
      receiver.script({ status: 500, bodyBytes: 10_000 });
      const big = await deliverAndRead(receiver);
      assert.equal(big.status, 500);
      assert.equal(big.text.length, 10_000);
      assert.match(big.text, /^x+$/);
      assert.equal(big.headers.get("content-type"), "text/plain");
    });

    assert.deepEqual(
      receiver.deliveries.map((d) => d.answeredStatus),
      [500, 202, 429, 302, 204, 500],
    );
    assert.deepEqual(receiver.accepted().map((d) => d.answeredStatus), [202, 204]);
  });
});

Deno.test("callback receiver: scripts apply `times` times, first in first out", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    receiver.script({ status: 500, times: 2 });
    receiver.script({ status: 503 });
    receiver.script({ status: 201 });
    const statuses = [];
    for (let i = 0; i < 5; i++) statuses.push((await deliverAndRead(receiver)).status);
    assert.deepEqual(statuses, [500, 500, 503, 201, 200]);

    receiver.script({ status: 500, times: 3 });
    receiver.clearScripts();
    assert.equal((await deliverAndRead(receiver)).status, 200);
  });
});

Deno.test("callback receiver: a delay slows the answer and counts as in flight", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    receiver.script({ status: 201, delayMs: 300 });
    const started = Date.now();
    const pending = deliverAndRead(receiver);
    const [delivery] = await receiver.waitFor(1);
    assert.equal(receiver.inFlight(), 1);
    assert.equal(delivery.answeredStatus, 0);
    const answer = await pending;
    assert.ok(Date.now() - started >= 250, `answered after ${Date.now() - started} ms`);
    assert.equal(answer.status, 201);
    assert.equal(delivery.answeredStatus, 201);
    assert.equal(receiver.inFlight(), 0);
  });
});

Deno.test("callback receiver: a reset makes fetch reject and is recorded as 0", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    receiver.script({ reset: true });
    await assert.rejects(deliver(receiver), TypeError);
    receiver.script({ reset: true, delayMs: 100 });
    await assert.rejects(deliver(receiver), TypeError);
    assert.equal((await deliverAndRead(receiver)).status, 200);
    assert.deepEqual(receiver.deliveries.map((d) => d.answeredStatus), [0, 0, 200]);
    assert.deepEqual(receiver.deliveries.map((d) => d.signatureValid), [true, true, true]);
    assert.equal(receiver.accepted().length, 1);
    assert.equal(receiver.inFlight(), 0);
  });
});

Deno.test("callback receiver: a hang never answers, until the client or close() ends it", async () => {
  const receiver = await startCallbackReceiver({ secrets: [SECRET] });
  try {
    receiver.script({ hang: true });
    await assert.rejects(
      deliver(receiver, { signal: AbortSignal.timeout(200) }),
      (error: Error) => error.name === "TimeoutError",
    );
    assert.equal(receiver.deliveries[0].answeredStatus, 0);
    await eventually(() => receiver.inFlight() === 0, "the abandoned request is settled");

    receiver.script({ hang: true, times: 2 });
    const hanging = [deliver(receiver), deliver(receiver)];
    await receiver.waitFor(3);
    assert.equal(receiver.inFlight(), 2);
    assert.equal(receiver.maxInFlight(), 2);
    const rejected = Promise.allSettled(hanging);
    await receiver.close();
    assert.deepEqual((await rejected).map((result) => result.status), ["rejected", "rejected"]);
    await eventually(() => receiver.inFlight() === 0, "close() ended the hanging requests");
    assert.deepEqual(receiver.deliveries.map((d) => d.answeredStatus), [0, 0, 0]);
  } finally {
    await receiver.close();
  }
});

Deno.test("callback receiver: inFlight and maxInFlight see concurrent requests", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    receiver.script({ delayMs: 300, times: 3 });
    const answers = Promise.all([1, 2, 3].map(() => deliverAndRead(receiver)));
    await receiver.waitFor(3);
    assert.equal(receiver.inFlight(), 3);
    assert.deepEqual((await answers).map((a) => a.status), [200, 200, 200]);
    assert.equal(receiver.inFlight(), 0);
    assert.equal(receiver.maxInFlight(), 3);
    // One at a time afterwards does not lower the maximum.
    await deliverAndRead(receiver);
    assert.equal(receiver.maxInFlight(), 3);
  });
});

Deno.test("callback receiver: waitFor resolves on arrival and rejects saying how many came", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    const waiting = receiver.waitFor(2);
    await deliverAndRead(receiver);
    await deliverAndRead(receiver);
    assert.equal((await waiting).length, 2);
    assert.equal((await receiver.waitFor(1)).length, 2);
    await assert.rejects(receiver.waitFor(3, 100), /waited 100 ms for 3 request\(s\), 2 arrived/);

    const cut = assert.rejects(receiver.waitFor(5), /closed for 5 request\(s\), 2 arrived/);
    await receiver.close();
    await cut;
  });
});

Deno.test("verify_delivery.ts accepts what the service signs and refuses the rest", async (t) => {
  const t0 = 1_700_000_000;
  const options = { nowSeconds: t0 + 10 };
  const header = signatureHeader([SECRET], t0, BODY);

  await t.step("valid", async () => {
    assert.equal(await verifyDelivery(SECRET, header, BODY, options), true);
    assert.equal(await verifyDelivery(SECRET, header, BODY, { nowSeconds: t0 + 300 }), true);
    assert.equal(
      await verifyDelivery(SECRET, ` ${header.replaceAll(",", " , ")} `, BODY, options),
      true,
    );
  });

  await t.step("a tampered body, a moved timestamp or a wrong secret", async () => {
    assert.equal(await verifyDelivery(SECRET, header, BODY + " ", options), false);
    assert.deepEqual(await checkDelivery(SECRET, header, BODY + " ", options), {
      valid: false,
      reason: "no_matching_signature",
    });
    assert.equal(
      await verifyDelivery(SECRET, header, BODY.replace("renewed", "expired"), options),
      false,
    );
    const moved = header.replace(`t=${t0}`, `t=${t0 + 5}`);
    assert.equal(await verifyDelivery(SECRET, moved, BODY, options), false);
    assert.equal(await verifyDelivery(NEW_SECRET, header, BODY, options), false);
  });

  await t.step("stale, or in the future beyond the tolerance", async () => {
    assert.equal(await verifyDelivery(SECRET, header, BODY, { nowSeconds: t0 + 301 }), false);
    assert.deepEqual(await checkDelivery(SECRET, header, BODY, { nowSeconds: t0 - 301 }), {
      valid: false,
      reason: "timestamp_outside_tolerance",
    });
    assert.equal(await verifyDelivery(SECRET, header, BODY, { nowSeconds: t0 - 301 }), false);
    assert.equal(await verifyDelivery(SECRET, header, BODY, { nowSeconds: t0 - 300 }), true);
    const strict = { nowSeconds: t0 + 61, toleranceSeconds: 60 };
    assert.equal(await verifyDelivery(SECRET, header, BODY, strict), false);
    // Without nowSeconds the clock is used: a fresh signature passes, an old one does not.
    const fresh = signatureHeader([SECRET], nowSeconds(), BODY);
    assert.equal(await verifyDelivery(SECRET, fresh, BODY), true);
    assert.equal(await verifyDelivery(SECRET, header, BODY), false);
  });

  await t.step("a rotation: two v1, either may match", async () => {
    const rotated = signatureHeader([NEW_SECRET, SECRET], t0, BODY);
    // The tenant still on the old secret matches the second v1 only.
    assert.equal(await verifyDelivery(SECRET, rotated, BODY, options), true);
    assert.equal(await verifyDelivery(NEW_SECRET, rotated, BODY, options), true);
    assert.equal(await verifyDelivery("whsec_other", rotated, BODY, options), false);
  });

  await t.step("malformed headers", async () => {
    const v1 = header.split(",")[1];
    const cases = [
      null,
      "",
      v1, // missing t
      `t=abc,${v1}`, // non-numeric t
      `t=-${t0},${v1}`,
      `t=${t0}.5,${v1}`,
      `t=${t0}`, // no v1
      `t=${t0},v1=`,
      `t=${t0},v1=zz`,
      `t=${t0},v0=${v1.slice(3)}`,
      `t=${t0},t=${t0},${v1}`, // ambiguous
      `t=${t0},${v1.slice(0, -2)}`, // truncated
      "garbage",
      ",,,",
    ];
    for (const malformed of cases) {
      assert.equal(await verifyDelivery(SECRET, malformed, BODY, options), false, `${malformed}`);
      const { reason } = await checkDelivery(SECRET, malformed, BODY, options);
      // A truncated v1 is still hex: it is a signature that does not match.
      const expected = !malformed
        ? "no_header"
        : malformed === `t=${t0},${v1.slice(0, -2)}`
        ? "no_matching_signature"
        : "malformed_header";
      assert.equal(reason, expected, `${malformed}`);
    }
  });
});

Deno.test("verify_delivery.ts verifies what the receiver recorded", async () => {
  await withReceiver({ secrets: [SECRET] }, async (receiver) => {
    await deliverAndRead(receiver, { secrets: [NEW_SECRET, SECRET] });
    const [delivery] = receiver.deliveries;
    const header = delivery.headers["x-service-signature"];
    assert.equal(await verifyDelivery(SECRET, header, delivery.body), true);
    assert.equal(await verifyDelivery(SECRET, header, JSON.stringify(delivery.json) + "\n"), false);
  });
});

Deno.test("the test vectors in docs/deliveries.md are what the service signs", async () => {
  const doc = await Deno.readTextFile(new URL("../docs/deliveries.md", import.meta.url));
  const oldSecret = "whsec_hsmCF1j6gqijxkIfFP3N1U-LwwLvcBfuyyy6Hp7tadM";
  const newSecret = "whsec_8rsBpUI49BhTUBQjleaWz-xpZbiHs78FIOnPIK_GpJs";
  const t = 1794694400;
  const body = '{"event":"test","eventId":"evt_01KA1D4C7W5GQ0VZ3RJ8N2T6XE"}';
  const single = signatureHeader([oldSecret], t, body);
  const rotated = signatureHeader([newSecret, oldSecret], t, body);
  for (const documented of [oldSecret, newSecret, body, single, rotated]) {
    assert.ok(doc.includes(documented), `docs/deliveries.md shows ${documented}`);
  }
  assert.equal(await verifyDelivery(oldSecret, single, body, { nowSeconds: t }), true);
  assert.equal(await verifyDelivery(newSecret, rotated, body, { nowSeconds: t }), true);
});

const python3 = await commandExists("python3");

Deno.test({
  name: "verify_delivery.py (CLI) exits 0 for a valid delivery and 1 otherwise",
  ignore: !python3,
  async fn() {
    const bodyFile = await Deno.makeTempFile({ suffix: ".json" });
    try {
      // Non-ASCII text: the Python side must sign bytes exactly as the service does.
      const body = JSON.stringify({ ...PAYLOAD, data: { note: "Grüße, 東京" } });
      await Deno.writeTextFile(bodyFile, body);
      const t = nowSeconds();
      const valid = await runPython(signatureHeader([SECRET], t, body), bodyFile);
      assert.deepEqual(valid, { code: 0, stdout: "valid" });
      const rotated = await runPython(signatureHeader([NEW_SECRET, SECRET], t, body), bodyFile);
      assert.deepEqual(rotated, { code: 0, stdout: "valid" });
      const tampered = await runPython(signatureHeader([SECRET], t, body + " "), bodyFile);
      assert.deepEqual(tampered, { code: 1, stdout: "invalid: no_matching_signature" });
      const stale = await runPython(signatureHeader([SECRET], t - 301, body), bodyFile);
      assert.deepEqual(stale, { code: 1, stdout: "invalid: timestamp_outside_tolerance" });
      const malformed = await runPython("v1=00", bodyFile);
      assert.deepEqual(malformed, { code: 1, stdout: "invalid: malformed_header" });
    } finally {
      await Deno.remove(bodyFile);
    }
  },
});

async function runPython(
  header: string,
  bodyFile: string,
): Promise<{ code: number; stdout: string }> {
  const output = await new Deno.Command("python3", {
    args: [PYTHON_EXAMPLE, SECRET, header, bodyFile],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  return { code: output.code, stdout: new TextDecoder().decode(output.stdout).trim() };
}

async function commandExists(command: string): Promise<boolean> {
  try {
    const { success } = await new Deno.Command(command, {
      args: ["--version"],
      stdout: "null",
      stderr: "null",
    }).output();
    return success;
  } catch {
    return false;
  }
}
