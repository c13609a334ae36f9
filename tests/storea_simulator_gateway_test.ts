/**
 * The App Store simulator answers the store gateway's calls by Apple's rules: subscription
 * statuses, history pages and filters, consumption information checked as Apple checks it, and
 * test notifications really posted, with Apple's send attempt results.
 */
import assert from "node:assert/strict";
import { compactVerify, importPKCS8, importX509, SignJWT } from "jose";
import { createStoreaTestPki, derToPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  STOREA_API_ERRORS,
  type StoreaApiEnvironment,
  type StoreaApiSimulatorOptions,
} from "../simulators/storea_api.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { TEST_ISSUER_ID, writeStoreaKeyFile } from "./helpers/fixtures.ts";

const KEY_ID = "ABC123DEFG";
const BUNDLE_ID = "com.example.app";
// deno-lint-ignore no-explicit-any
type Json = any;

async function startApi(options: Partial<StoreaApiSimulatorOptions> = {}) {
  const dir = await Deno.makeTempDir();
  const privateKeyPem = await Deno.readTextFile(await writeStoreaKeyFile(dir));
  const signer = new StoreaSigner(await createStoreaTestPki());
  const api = await startStoreaApiSimulator({ signer, ...options });
  await api.addKey({ issuerId: TEST_ISSUER_ID, keyId: KEY_ID, bundleId: BUNDLE_ID, privateKeyPem });
  const key = await importPKCS8(privateKeyPem, "ES256");
  const now = Math.floor(Date.now() / 1000);
  const token = await new SignJWT({
    iss: TEST_ISSUER_ID,
    iat: now,
    exp: now + 1800,
    aud: "appstoreconnect-v1",
    bid: BUNDLE_ID,
  }).setProtectedHeader({ alg: "ES256", kid: KEY_ID, typ: "JWT" }).sign(key);
  const call = async (
    method: string,
    path: string,
    body?: unknown,
    environment: StoreaApiEnvironment = "production",
  ) => {
    const base = environment === "production" ? api.productionUrl : api.sandboxUrl;
    const response = await fetch(`${base}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    return { status: response.status, text, json: text === "" ? null : JSON.parse(text) as Json };
  };
  return {
    api,
    signer,
    call,
    async cleanup() {
      await api.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

function payloadOf(jws: string): Json {
  const [, payload] = jws.split(".");
  return JSON.parse(
    new TextDecoder().decode(Uint8Array.fromBase64(payload, { alphabet: "base64url" })),
  );
}

Deno.test("storea api: subscription statuses group the customer's latest transactions", async () => {
  const { api, signer, call, cleanup } = await startApi();
  try {
    const add = (id: string, original: string, group: string, purchaseDate: number, extra = {}) =>
      api.addTransaction(
        "production",
        signer.sampleTransaction({
          transactionId: id,
          originalTransactionId: original,
          subscriptionGroupIdentifier: group,
          purchaseDate,
          expiresDate: purchaseDate + 30 * 86_400_000,
          ...extra,
        }),
        { customer: "c1" },
      );
    await add("101", "100", "g1", Date.now() - 40 * 86_400_000);
    const latest = await add("102", "100", "g1", Date.now() - 10 * 86_400_000);
    await add("201", "200", "g2", Date.now() - 60 * 86_400_000);
    await add("301", "300", "g2", Date.now(), { revocationDate: Date.now() });
    await api.addTransaction(
      "production",
      signer.sampleTransaction({ transactionId: "401", type: "Consumable" }),
      { customer: "c1" },
    );
    // Another customer's subscription is not theirs.
    await api.addTransaction("production", signer.sampleTransaction({ transactionId: "501" }));

    const { status, json } = await call("GET", "/inApps/v1/subscriptions/201");
    assert.equal(status, 200);
    assert.equal(json.environment, "Production");
    assert.equal(json.bundleId, BUNDLE_ID);
    assert.deepEqual(
      json.data.map((g: Json) => [
        g.subscriptionGroupIdentifier,
        g.lastTransactions.map((t: Json) => [t.originalTransactionId, t.status]),
      ]),
      [["g1", [["100", 1]]], ["g2", [["200", 2], ["300", 5]]]],
    );
    const active = json.data[0].lastTransactions[0];
    assert.equal(active.signedTransactionInfo, latest);
    const renewal = payloadOf(active.signedRenewalInfo);
    assert.equal(renewal.originalTransactionId, "100");
    assert.equal(renewal.autoRenewStatus, 1);
    assert.equal(renewal.environment, "Production");
    assert.equal(payloadOf(json.data[1].lastTransactions[0].signedRenewalInfo).expirationIntent, 1);

    const filtered = await call("GET", "/inApps/v1/subscriptions/201?status=2");
    assert.deepEqual(filtered.json.data.map((g: Json) => g.subscriptionGroupIdentifier), ["g2"]);
    assert.equal((await call("GET", "/inApps/v1/subscriptions/201?status=9")).status, 400);
    assert.equal((await call("GET", "/inApps/v1/subscriptions/999")).status, 404);
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: history pages, filters and refuses what Apple refuses", async () => {
  const { api, signer, call, cleanup } = await startApi({ historyPageSize: 2 });
  try {
    const base = 1_700_000_000_000;
    for (let i = 0; i < 5; i++) {
      await api.addTransaction(
        "production",
        signer.sampleTransaction({
          transactionId: `10${i}`,
          originalTransactionId: `10${i}`,
          purchaseDate: base + i * 1000,
          type: i % 2 === 0 ? "Auto-Renewable Subscription" : "Consumable",
        }),
        { customer: "c" },
      );
    }
    const ids = (json: Json) =>
      json.signedTransactions.map((t: string) => payloadOf(t).transactionId);
    const first = await call("GET", "/inApps/v2/history/100?sort=DESCENDING");
    assert.deepEqual(ids(first.json), ["104", "103"]);
    assert.equal(first.json.hasMore, true);
    const second = await call(
      "GET",
      `/inApps/v2/history/100?revision=${first.json.revision}&sort=DESCENDING`,
    );
    assert.deepEqual(ids(second.json), ["102", "101"]);
    const types = await call(
      "GET",
      `/inApps/v2/history/100?productType=CONSUMABLE&startDate=${base}&endDate=${base + 3001}`,
    );
    assert.deepEqual(ids(types.json), ["101", "103"]);
    assert.equal(types.json.hasMore, false);

    const refusals: [string, unknown][] = [
      ["sort=ascending", STOREA_API_ERRORS.invalidSort],
      ["startDate=yesterday", STOREA_API_ERRORS.invalidStartDate],
      [`startDate=${base}&endDate=${base}`, STOREA_API_ERRORS.startDateAfterEndDate],
      ["productType=SUBSCRIPTION", STOREA_API_ERRORS.invalidProductType],
      ["inAppOwnershipType=SHARED", STOREA_API_ERRORS.invalidInAppOwnershipType],
      ["revoked=yes", STOREA_API_ERRORS.invalidRevoked],
      // A revision made for another query.
      [`revision=${first.json.revision}`, STOREA_API_ERRORS.invalidRequestRevision],
    ];
    for (const [query, error] of refusals) {
      const { status, json } = await call("GET", `/inApps/v2/history/100?${query}`);
      assert.equal(status, 400, query);
      assert.deepEqual(json, error, query);
    }
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: consumption information is checked as Apple documents it", async () => {
  const { api, signer, call, cleanup } = await startApi();
  try {
    await api.addTransaction(
      "production",
      signer.sampleTransaction({ transactionId: "700", type: "Consumable" }),
    );
    await api.addTransaction("production", signer.sampleTransaction({ transactionId: "800" }));
    const good = {
      customerConsented: true,
      deliveryStatus: "DELIVERED",
      sampleContentProvided: false,
    };
    const put = (id: string, body: unknown) =>
      call("PUT", `/inApps/v2/transactions/consumption/${id}`, body);
    const accepted = await put("700", { ...good, consumptionPercentage: 40_000 });
    assert.equal(accepted.status, 202);
    assert.equal(accepted.text, "");
    assert.deepEqual(api.consumptionRequests.map((r) => r.body), [
      { ...good, consumptionPercentage: 40_000 },
    ]);
    const cases: [string, unknown, unknown][] = [
      ["700", { ...good, customerConsented: false }, STOREA_API_ERRORS.invalidCustomerConsented],
      ["700", { ...good, deliveryStatus: "LOST" }, STOREA_API_ERRORS.invalidDeliveryStatus],
      [
        "700",
        { ...good, sampleContentProvided: "no" },
        STOREA_API_ERRORS.invalidSampleContentProvided,
      ],
      ["700", { ...good, refundPreference: "MAYBE" }, STOREA_API_ERRORS.invalidRefundPreference],
      [
        "700",
        { ...good, consumptionPercentage: 100_001 },
        STOREA_API_ERRORS.consumptionPercentageOutOfRange,
      ],
      [
        "700",
        { ...good, deliveryStatus: "UNDELIVERED_OTHER", consumptionPercentage: 1 },
        STOREA_API_ERRORS.undeliveredConsumptionPercentageNonZero,
      ],
      [
        "700",
        { ...good, refundPreference: "GRANT_PRORATED", consumptionPercentage: 0 },
        STOREA_API_ERRORS.consumptionPercentageOutOfRange,
      ],
      [
        "800",
        { ...good, consumptionPercentage: 1 },
        STOREA_API_ERRORS.consumptionPercentageAutoRenewableSubscription,
      ],
    ];
    for (const [id, body, error] of cases) {
      const { status, json } = await put(id, body);
      assert.equal(status, 400, JSON.stringify(body));
      assert.deepEqual(json, error, JSON.stringify(body));
    }
    assert.equal((await put("900", good)).status, 404);
    const malformed = await fetch(`${api.productionUrl}/inApps/v2/transactions/consumption/700`, {
      method: "PUT",
      body: "{",
    });
    assert.equal(malformed.status, 401); // no token: refused before the body is read
    await malformed.body?.cancel();
    assert.equal(api.consumptionRequests.length, 1);
  } finally {
    await cleanup();
  }
});

Deno.test("storea api: a test notification is really posted, and its attempt reported", async () => {
  const { api, signer, call, cleanup } = await startApi({ notificationTimeoutMs: 500 });
  const receiver = await startCallbackReceiver();
  try {
    const status = async (token: string) => {
      for (let i = 0; i < 50; i++) {
        const answer = await call("GET", `/inApps/v1/notifications/test/${token}`);
        if (answer.json?.sendAttempts?.length) return answer.json;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      throw new Error("no attempt reported");
    };
    const none = await call("POST", "/inApps/v1/notifications/test");
    assert.equal(none.status, 404);
    assert.deepEqual(none.json, STOREA_API_ERRORS.serverNotificationUrlNotFound);

    api.setNotificationUrl({ bundleId: BUNDLE_ID, url: receiver.url, appAppleId: 1234 });
    const requested = await call("POST", "/inApps/v1/notifications/test");
    assert.equal(requested.status, 200);
    const reported = await status(requested.json.testNotificationToken);
    assert.equal(reported.sendAttempts[0].sendAttemptResult, "SUCCESS");
    assert.equal(typeof reported.sendAttempts[0].attemptDate, "number");
    const posted = receiver.deliveries.at(-1)!;
    assert.equal(JSON.parse(posted.body).signedPayload, reported.signedPayload);
    const leafKey = await importX509(derToPem(signer.pki.certificates.leaf), "ES256");
    const { payload } = await compactVerify(reported.signedPayload, leafKey);
    const decoded = JSON.parse(new TextDecoder().decode(payload));
    assert.equal(decoded.notificationType, "TEST");
    assert.equal(decoded.data.bundleId, BUNDLE_ID);
    assert.equal(decoded.data.environment, "Production");
    assert.equal(decoded.data.appAppleId, 1234);
    assert.equal(decoded.data.signedTransactionInfo, undefined);

    receiver.script({ status: 503 });
    const refused = await call("POST", "/inApps/v1/notifications/test");
    assert.equal(
      (await status(refused.json.testNotificationToken)).sendAttempts[0].sendAttemptResult,
      "UNSUCCESSFUL_HTTP_RESPONSE_CODE",
    );
    receiver.script({ hang: true });
    const slow = await call("POST", "/inApps/v1/notifications/test");
    assert.equal(
      (await status(slow.json.testNotificationToken)).sendAttempts[0].sendAttemptResult,
      "TIMED_OUT",
    );
    const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (closed.addr as Deno.NetAddr).port;
    closed.close();
    api.setNotificationUrl({ bundleId: BUNDLE_ID, url: `http://127.0.0.1:${port}/hooks` });
    const unreachable = await call("POST", "/inApps/v1/notifications/test");
    assert.equal(
      (await status(unreachable.json.testNotificationToken)).sendAttempts[0].sendAttemptResult,
      "NO_RESPONSE",
    );
    const unknown = await call("GET", "/inApps/v1/notifications/test/nope_1");
    assert.equal(unknown.status, 404);
    assert.deepEqual(unknown.json, STOREA_API_ERRORS.testNotificationNotFound);
    // Tokens belong to the environment they were asked in.
    const sandbox = await call(
      "GET",
      `/inApps/v1/notifications/test/${requested.json.testNotificationToken}`,
      undefined,
      "sandbox",
    );
    assert.equal(sandbox.status, 404);
  } finally {
    await receiver.close();
    await cleanup();
  }
});
