/**
 * The store A half of the store gateway end to end: `POST /v1/storea/subscriptions`,
 * `/v1/storea/history` and `/v1/storea/consumption` on a real service process, against the App
 * Store simulator checking the service's tokens and signing with a test PKI the service trusts
 * through STOREA_ROOT_CERTS.
 */
import assert from "node:assert/strict";
import {
  createTenantWithKey,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import { storeaCredentialArgs } from "./helpers/fixtures.ts";
import { createStoreaTestPki } from "../simulators/storea_pki.ts";
import { StoreaSigner, type StoreaTransactionPayload } from "../simulators/storea_signer.ts";
import {
  STOREA_API_ERRORS,
  type StoreaApiEnvironment,
  type StoreaApiSimulator,
  storeaRateLimitedAnswer,
} from "../simulators/storea_api.ts";
import { startStoreaWorld } from "./helpers/storea_world.ts";

const BUNDLE_ID = "com.example.app";
const GROUP_A = "21000001";
const GROUP_B = "21000002";

// deno-lint-ignore no-explicit-any
type Json = any;

interface Caller {
  tenantId: string;
  keyId: string;
  post(path: string, body: unknown): Promise<{ status: number; headers: Headers; json: Json }>;
}

async function callerFor(
  service: RunningService,
  keyFile: string | null,
  env?: string,
): Promise<Caller> {
  const { tenantId, key, keyId } = await createTenantWithKey(service);
  if (keyFile !== null) {
    const args = storeaCredentialArgs(tenantId, keyFile);
    if (env) args.push("--environment", env);
    const set = await service.cli(...args);
    assert.equal(set.code, 0, set.stderr);
  }
  return {
    tenantId,
    keyId,
    async post(path, body) {
      const response = await fetch(`${service.url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });
      return { status: response.status, headers: response.headers, json: await response.json() };
    },
  };
}

/** The simulator, a key it accepts, and a service that trusts its PKI. */
async function startWorld(env: Record<string, string> = {}) {
  const dir = await Deno.makeTempDir();
  const { signer, api, keyFile, rootPemPath } = await startStoreaWorld(dir, {
    historyPageSize: 3,
  });
  const service = await startService({
    env: {
      ...api.serviceEnv,
      STOREA_ROOT_CERTS: rootPemPath,
      UPSTREAM_TIMEOUT: "2s",
      ...env,
    },
  });
  return {
    dir,
    signer,
    api,
    keyFile,
    service,
    async close() {
      await stopAndDrop(service);
      await api.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** `operation environment:status` of the simulator's calls about `id`. */
function callsOf(api: StoreaApiSimulator, id: string): string[] {
  return api.requests.filter((r) => r.transactionId === id)
    .map((r) => `${r.operation} ${r.environment}:${r.status}`);
}

const iso = (ms: number) => new Date(ms).toISOString();

Deno.test("store A gateway: subscriptions, history and consumption against the simulator", async (t) => {
  const world = await startWorld();
  const { signer, api, service } = world;
  const auto = await callerFor(service, world.keyFile);
  const add = (
    environment: StoreaApiEnvironment,
    customer: string,
    overrides: Partial<StoreaTransactionPayload>,
  ) => {
    const payload = signer.sampleTransaction(overrides);
    return api.addTransaction(environment, payload, { customer }).then((jws) => ({ payload, jws }));
  };
  const apiCalls = () => api.requests.length;

  try {
    // Alice: two subscriptions in two groups (the first renewed once) and a consumable.
    const older = await add("production", "alice", {
      transactionId: "2000000000001001",
      originalTransactionId: "2000000000001000",
      subscriptionGroupIdentifier: GROUP_A,
      productId: "pro.monthly",
      purchaseDate: 1_700_000_000_000,
      originalPurchaseDate: 1_700_000_000_000,
      expiresDate: 1_702_592_000_000,
    });
    const renewed = await add("production", "alice", {
      transactionId: "2000000000001002",
      originalTransactionId: "2000000000001000",
      subscriptionGroupIdentifier: GROUP_A,
      productId: "pro.monthly",
      purchaseDate: 1_702_592_000_000,
      originalPurchaseDate: 1_700_000_000_000,
      expiresDate: 4_102_444_800_000,
      transactionReason: "RENEWAL",
    });
    const other = await add("production", "alice", {
      transactionId: "2000000000002001",
      originalTransactionId: "2000000000002000",
      subscriptionGroupIdentifier: GROUP_B,
      productId: "extra.yearly",
      purchaseDate: 1_703_000_000_000,
      originalPurchaseDate: 1_703_000_000_000,
      expiresDate: 1_703_500_000_000,
      appAccountToken: "0f5c4e7a-3a59-4d5e-9e43-8f1c2b6d7e90",
    });
    const consumable = await add("production", "alice", {
      transactionId: "2000000000003001",
      originalTransactionId: "2000000000003001",
      type: "Consumable",
      productId: "coins.100",
      purchaseDate: 1_701_000_000_000,
      originalPurchaseDate: 1_701_000_000_000,
      price: 990,
      currency: "USD",
    });

    await t.step("subscriptions: every field, one entry per subscription group", async () => {
      // Within the test certificates' validity, which the signature check requires.
      const signedDate = Date.now() - 60_000;
      const graceRenewal = signer.sampleRenewalInfo({
        originalTransactionId: "2000000000002000",
        productId: "extra.yearly",
        autoRenewProductId: "extra.monthly",
        autoRenewStatus: 1,
        expirationIntent: 2,
        isInBillingRetryPeriod: true,
        gracePeriodExpiresDate: 1_703_600_000_000,
        recentSubscriptionStartDate: 1_703_000_000_000,
        renewalDate: undefined,
        offerType: 2,
        offerIdentifier: "winback",
        signedDate,
      });
      const signedRenewal = await api.setSubscriptionState("production", "2000000000002000", {
        status: 4,
        renewalInfo: graceRenewal,
      });

      const { status, json } = await auto.post("/v1/storea/subscriptions", {
        transactionId: older.payload.transactionId,
      });
      assert.equal(status, 200, JSON.stringify(json));
      assert.deepEqual(Object.keys(json).sort(), [
        "appUserId",
        "environment",
        "subscriptions",
        "valid",
        "version",
      ]);
      assert.equal(json.valid, true);
      assert.equal(json.version, "dev");
      assert.equal(json.environment, "production");
      // The transaction bought last is the other subscription's.
      assert.equal(json.appUserId, "0f5c4e7a-3a59-4d5e-9e43-8f1c2b6d7e90");
      assert.equal(json.subscriptions.length, 2);
      const [first, second] = json.subscriptions;
      for (const entry of json.subscriptions) {
        assert.deepEqual(Object.keys(entry).sort(), [
          "originalTransactionId",
          "renewal",
          "status",
          "statusName",
          "subscriptionGroupIdentifier",
          "transaction",
        ]);
      }

      assert.equal(first.subscriptionGroupIdentifier, GROUP_A);
      assert.equal(first.originalTransactionId, "2000000000001000");
      assert.equal(first.status, 1);
      assert.equal(first.statusName, "active");
      // Exactly what verify answers for the group's last transaction.
      const verified = await auto.post("/v1/storea/verify", {
        transactionId: renewed.payload.transactionId,
      });
      assert.deepEqual(first.transaction, verified.json.transaction);
      assert.equal(first.transaction.signedTransactionInfo, renewed.jws);
      assert.equal(first.renewal.originalTransactionId, "2000000000001000");
      assert.equal(first.renewal.autoRenewStatus, 1);
      assert.equal(first.renewal.renewalDate, iso(4_102_444_800_000));
      assert.equal(first.renewal.expirationIntent, null);
      assert.equal(first.renewal.gracePeriodExpiresDate, null);
      assert.equal(first.renewal.isInBillingRetryPeriod, null);
      assert.match(first.renewal.signedRenewalInfo, /^eyJ[\w-]+\.[\w-]+\.[\w-]+$/);

      assert.equal(second.subscriptionGroupIdentifier, GROUP_B);
      assert.equal(second.originalTransactionId, "2000000000002000");
      assert.equal(second.status, 4);
      assert.equal(second.statusName, "grace_period");
      assert.equal(second.transaction.transactionId, other.payload.transactionId);
      assert.equal(second.transaction.price, 999);
      assert.deepEqual(second.renewal, {
        originalTransactionId: "2000000000002000",
        autoRenewProductId: "extra.monthly",
        productId: "extra.yearly",
        autoRenewStatus: 1,
        expirationIntent: 2,
        gracePeriodExpiresDate: iso(1_703_600_000_000),
        isInBillingRetryPeriod: true,
        offerType: 2,
        offerIdentifier: "winback",
        recentSubscriptionStartDate: iso(1_703_000_000_000),
        renewalDate: null,
        signedDate: iso(signedDate),
        signedRenewalInfo: signedRenewal,
        rawDecodedPayload: { ...graceRenewal, environment: "Production" },
      });
      assert.deepEqual(callsOf(api, older.payload.transactionId), [
        "subscriptions production:200",
      ]);
    });

    await t.step("subscriptions: status 1 to 5 by name; no renewal info answers null", async () => {
      for (const status of [1, 2, 3, 4, 5]) {
        const original = `20000000000050${status}0`;
        await add("production", "bob", {
          transactionId: original,
          originalTransactionId: original,
          subscriptionGroupIdentifier: "21000005",
          purchaseDate: 1_700_000_000_000 + status,
        });
        await api.setSubscriptionState("production", original, {
          status,
          ...(status === 5 ? { renewalInfo: null } : {}),
        });
      }
      const { json } = await auto.post("/v1/storea/subscriptions", {
        transactionId: "2000000000005010",
      });
      assert.deepEqual(
        json.subscriptions.map((s: Json) => [s.status, s.statusName, s.renewal === null]),
        [
          [1, "active", false],
          [2, "expired", false],
          [3, "billing_retry", false],
          [4, "grace_period", false],
          [5, "revoked", true],
        ],
      );
      assert.equal(json.subscriptions[2].renewal.isInBillingRetryPeriod, true);
    });

    await t.step(
      "subscriptions: automatic mode finds sandbox; nowhere is a domain failure",
      async () => {
        const carol = await add("sandbox", "carol", {
          transactionId: "2000000000006001",
          originalTransactionId: "2000000000006001",
        });
        const { json } = await auto.post("/v1/storea/subscriptions", {
          transactionId: carol.payload.transactionId,
        });
        assert.equal(json.environment, "sandbox");
        assert.equal(json.subscriptions[0].transaction.transactionId, "2000000000006001");
        assert.deepEqual(callsOf(api, "2000000000006001"), [
          "subscriptions production:404",
          "subscriptions sandbox:200",
        ]);

        const missing = await auto.post("/v1/storea/subscriptions", {
          transactionId: "2000000000006999",
        });
        assert.equal(missing.status, 200);
        assert.deepEqual(Object.keys(missing.json).sort(), [
          "error",
          "message",
          "valid",
          "version",
        ]);
        assert.equal(missing.json.error, "TRANSACTION_NOT_FOUND");
        assert.deepEqual(callsOf(api, "2000000000006999"), [
          "subscriptions production:404",
          "subscriptions sandbox:404",
        ]);
      },
    );

    await t.step("subscriptions: another app's transaction is BUNDLE_ID_MISMATCH", async () => {
      await add("production", "dave", {
        transactionId: "2000000000007001",
        originalTransactionId: "2000000000007001",
        bundleId: "com.other.app",
      });
      const { status, json } = await auto.post("/v1/storea/subscriptions", {
        transactionId: "2000000000007001",
      });
      assert.equal(status, 200);
      assert.equal(json.valid, false);
      assert.equal(json.error, "BUNDLE_ID_MISMATCH");
      assert.match(json.message, /com\.other\.app/);
    });

    await t.step(
      "subscriptions: a JWS signed by an untrusted chain is never used: 502",
      async () => {
        const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
        const forgedTransaction = await stranger.signTransaction(
          stranger.sampleTransaction({ transactionId: "2000000000008001" }),
        );
        const forgedRenewal = await stranger.signRenewalInfo(stranger.sampleRenewalInfo());
        const statusBody = (signedTransactionInfo: string, signedRenewalInfo: string) => ({
          environment: "Production",
          bundleId: BUNDLE_ID,
          data: [{
            subscriptionGroupIdentifier: GROUP_A,
            lastTransactions: [{
              status: 1,
              originalTransactionId: "2000000000008001",
              signedTransactionInfo,
              signedRenewalInfo,
            }],
          }],
        });
        const trustedRenewal = (await api.setSubscriptionState("production", "x", {
          renewalInfo: signer.sampleRenewalInfo(),
        }))!;
        api.script("production", {
          status: 200,
          operation: "subscriptions",
          body: statusBody(forgedTransaction, trustedRenewal),
        });
        const transaction = await auto.post("/v1/storea/subscriptions", {
          transactionId: "2000000000008001",
        });
        assert.equal(transaction.status, 502);
        assert.equal(transaction.json.error, "APPLE_API_ERROR");
        assert.match(transaction.json.message, /signedTransactionInfo did not verify/);

        api.script("production", {
          status: 200,
          operation: "subscriptions",
          body: statusBody(renewed.jws, forgedRenewal),
        });
        const renewal = await auto.post("/v1/storea/subscriptions", {
          transactionId: "2000000000008001",
        });
        assert.equal(renewal.status, 502);
        assert.match(renewal.json.message, /signedRenewalInfo did not verify/);
      },
    );

    // Erin: seven transactions for the history, one a month apart.
    const erin: StoreaTransactionPayload[] = [];
    const erinKinds: Partial<StoreaTransactionPayload>[] = [
      {
        type: "Auto-Renewable Subscription",
        productId: "pro.monthly",
        subscriptionGroupIdentifier: "g1",
      },
      { type: "Consumable", productId: "coins.100" },
      {
        type: "Auto-Renewable Subscription",
        productId: "pro.monthly",
        subscriptionGroupIdentifier: "g1",
      },
      { type: "Non-Consumable", productId: "level.pack", inAppOwnershipType: "FAMILY_SHARED" },
      {
        type: "Consumable",
        productId: "coins.100",
        revocationDate: 1_706_000_000_000,
        revocationReason: 0,
      },
      { type: "Non-Renewing Subscription", productId: "season.pass" },
      {
        type: "Auto-Renewable Subscription",
        productId: "pro.yearly",
        subscriptionGroupIdentifier: "g2",
      },
    ];
    for (const [i, kind] of erinKinds.entries()) {
      const { payload } = await add("production", "erin", {
        transactionId: `200000000001100${i}`,
        originalTransactionId: `200000000001100${i}`,
        purchaseDate: 1_700_000_000_000 + i * 2_592_000_000,
        originalPurchaseDate: 1_700_000_000_000 + i * 2_592_000_000,
        ...kind,
      });
      erin.push(payload);
    }
    const erinIds = erin.map((p) => p.transactionId);
    const history = (body: Record<string, unknown>) =>
      auto.post("/v1/storea/history", { transactionId: erinIds[0], ...body });

    await t.step("history: pages in ascending order, each revision giving the next", async () => {
      const seen: string[] = [];
      const pages: boolean[] = [];
      let revision: string | undefined;
      for (let page = 0; page < 5; page++) {
        const { status, json } = await history(revision === undefined ? {} : { revision });
        assert.equal(status, 200, JSON.stringify(json));
        assert.deepEqual(Object.keys(json).sort(), [
          "environment",
          "hasMore",
          "revision",
          "transactions",
          "valid",
          "version",
        ]);
        assert.equal(json.environment, "production");
        seen.push(...json.transactions.map((tx: Json) => tx.transactionId));
        pages.push(json.hasMore);
        revision = json.revision;
        if (!json.hasMore) break;
      }
      assert.deepEqual(seen, erinIds);
      assert.deepEqual(pages, [true, true, false]);
      const { json } = await history({});
      const verified = await auto.post("/v1/storea/verify", { transactionId: erinIds[1] });
      assert.deepEqual(json.transactions[1], verified.json.transaction);
      // Apple's parameters: the sort is always sent, the revision only once there is one.
      const sent = api.requests.filter((r) => r.operation === "history").map((r) => r.query);
      assert.deepEqual(sent[0], [["sort", "ASCENDING"]]);
      assert.equal(sent[1][0][0], "revision");
      assert.deepEqual(sent[1][1], ["sort", "ASCENDING"]);
    });

    await t.step("history: descending, and every filter in Apple's query parameters", async () => {
      const descending = await history({ sort: "descending" });
      assert.deepEqual(
        descending.json.transactions.map((tx: Json) => tx.transactionId),
        erinIds.slice(-3).reverse(),
      );
      const filtered = await history({
        sort: "descending",
        startDate: "2023-11-14T22:13:20Z",
        endDate: "2024-06-01T00:00:00.000+02:00",
        productIds: ["pro.monthly", "coins.100"],
        productTypes: ["AUTO_RENEWABLE", "CONSUMABLE"],
        subscriptionGroupIdentifiers: ["g1"],
        inAppOwnershipType: "PURCHASED",
        revoked: false,
      });
      assert.equal(filtered.status, 200, JSON.stringify(filtered.json));
      assert.deepEqual(api.requests.at(-1)!.query, [
        ["sort", "DESCENDING"],
        ["startDate", "1700000000000"],
        ["endDate", String(Date.parse("2024-05-31T22:00:00Z"))],
        ["productId", "pro.monthly"],
        ["productId", "coins.100"],
        ["productType", "AUTO_RENEWABLE"],
        ["productType", "CONSUMABLE"],
        ["subscriptionGroupIdentifier", "g1"],
        ["inAppOwnershipType", "PURCHASED"],
        ["revoked", "false"],
      ]);
      // Subscriptions of group g1 bought in the window (the consumables have no group).
      assert.deepEqual(
        filtered.json.transactions.map((tx: Json) => tx.transactionId),
        [erinIds[2], erinIds[0]],
      );
      const revoked = await history({ revoked: true });
      assert.deepEqual(revoked.json.transactions.map((tx: Json) => tx.transactionId), [
        erinIds[4],
      ]);
      assert.equal(revoked.json.transactions[0].revocationDate, iso(1_706_000_000_000));
    });

    await t.step("history: bad filters are refused before the App Store is asked", async () => {
      const before = apiCalls();
      const refused: Record<string, unknown>[] = [
        { startDate: "2024-01-01" },
        { endDate: "1700000000000" },
        { startDate: "2024-02-30T00:00:00Z" },
        { startDate: "2024-03-01T00:00:00Z", endDate: "2024-03-01T00:00:00Z" },
        { sort: "ASCENDING" },
        { productTypes: ["SUBSCRIPTION"] },
        { productIds: Array.from({ length: 51 }, (_, i) => `p${i}`) },
        { subscriptionGroupIdentifiers: [""] },
        { inAppOwnershipType: "SHARED" },
        { revoked: "true" },
        { revision: "" },
        { excludeRevoked: true },
        { transactionId: ".." },
      ];
      for (const body of refused) {
        const { status, json } = await history(body);
        assert.equal(status, 400, JSON.stringify(body));
        assert.equal(json.error, "INVALID_REQUEST", JSON.stringify(body));
      }
      const fifty = await history({ productIds: Array.from({ length: 50 }, (_, i) => `p${i}`) });
      assert.equal(fifty.status, 200);
      assert.equal(apiCalls(), before + 1);
    });

    await t.step("history: Apple's refusal of a revision is the tenant's 400", async () => {
      const first = await history({});
      const other = await history({ revision: first.json.revision, sort: "descending" });
      assert.equal(other.status, 400);
      assert.equal(other.json.error, "INVALID_REQUEST");
      assert.equal(
        other.json.details.upstreamCode,
        STOREA_API_ERRORS.invalidRequestRevision.errorCode,
      );
    });

    await t.step("history: not found anywhere, and another app's transactions", async () => {
      const missing = await auto.post("/v1/storea/history", { transactionId: "2000000000019999" });
      assert.equal(missing.json.error, "TRANSACTION_NOT_FOUND");
      assert.deepEqual(callsOf(api, "2000000000019999"), [
        "history production:404",
        "history sandbox:404",
      ]);
      const foreign = await auto.post("/v1/storea/history", { transactionId: "2000000000007001" });
      assert.equal(foreign.json.error, "BUNDLE_ID_MISMATCH");
    });

    await t.step(
      "history: a transaction signed by an untrusted chain is never used: 502",
      async () => {
        const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
        const forged = await stranger.signTransaction(
          stranger.sampleTransaction({ transactionId: erinIds[0] }),
        );
        const trusted = erin[1];
        api.script("production", {
          status: 200,
          operation: "history",
          body: {
            revision: "r1",
            hasMore: false,
            bundleId: BUNDLE_ID,
            environment: "Production",
            signedTransactions: [await signer.signTransaction(trusted), forged],
          },
        });
        const { status, json } = await history({});
        assert.equal(status, 502);
        assert.equal(json.error, "APPLE_API_ERROR");
        assert.match(json.message, /signedTransactionInfo did not verify/);
      },
    );

    const consumption = (body: Record<string, unknown>) =>
      auto.post("/v1/storea/consumption", {
        transactionId: consumable.payload.transactionId,
        customerConsented: true,
        sampleContentProvided: false,
        deliveryStatus: "DELIVERED",
        ...body,
      });

    await t.step("consumption: Apple's 202 is sent: true, logged as a store action", async () => {
      const { status, headers, json } = await consumption({
        consumptionPercentage: 25_000,
        refundPreference: "GRANT_PRORATED",
      });
      assert.equal(status, 200, JSON.stringify(json));
      assert.deepEqual(json, {
        valid: true,
        version: "dev",
        transactionId: consumable.payload.transactionId,
        sent: true,
      });
      assert.deepEqual(api.consumptionRequests.at(-1), {
        environment: "production",
        transactionId: consumable.payload.transactionId,
        body: {
          customerConsented: true,
          consumptionPercentage: 25_000,
          deliveryStatus: "DELIVERED",
          refundPreference: "GRANT_PRORATED",
          sampleContentProvided: false,
        },
        at: api.consumptionRequests.at(-1)!.at,
      });
      assert.equal(api.requests.at(-1)!.method, "PUT");
      const line = await service.waitForLog((l) =>
        l.msg === "store_action" && l.transactionId === consumable.payload.transactionId
      );
      assert.equal(line.level, "info");
      assert.equal(line.tenantId, auto.tenantId);
      assert.equal(line.keyId, auto.keyId);
      assert.equal(line.store, "storea");
      assert.equal(line.action, "consumption");
      assert.equal(line.outcome, "sent");
      // Beside its request's http_request line.
      assert.equal(line.reqId, headers.get("x-request-id"));
    });

    await t.step(
      "consumption: without consent, or against Apple's rules: 400, no call",
      async () => {
        const before = apiCalls();
        const refused: [Record<string, unknown>, RegExp][] = [
          [{ customerConsented: false }, /customerConsented: must be true/],
          [{ customerConsented: "true" }, /customerConsented/],
          [{ customerConsented: undefined }, /customerConsented/],
          [{ sampleContentProvided: undefined }, /sampleContentProvided/],
          [{ deliveryStatus: "UNDELIVERED" }, /deliveryStatus/],
          [{ deliveryStatus: 0 }, /deliveryStatus/],
          [{ consumptionPercentage: 100_001 }, /consumptionPercentage/],
          [{ consumptionPercentage: -1 }, /consumptionPercentage/],
          [{ consumptionPercentage: 12.5 }, /consumptionPercentage/],
          [
            { deliveryStatus: "UNDELIVERED_SERVER_OUTAGE", consumptionPercentage: 10 },
            /must be 0 when deliveryStatus is not DELIVERED/,
          ],
          [{ refundPreference: "GRANT_PRORATED", consumptionPercentage: 0 }, /GRANT_PRORATED/],
          [
            { refundPreference: "GRANT_PRORATED", consumptionPercentage: 100_000 },
            /GRANT_PRORATED/,
          ],
          [{ refundPreference: "GRANT_PARTIAL" }, /refundPreference/],
          [{ consumptionStatus: 2 }, /consumptionStatus/],
          [{ transactionId: "." }, /transactionId/],
        ];
        for (const [body, message] of refused) {
          const { status, json } = await consumption(body);
          assert.equal(status, 400, JSON.stringify(body));
          assert.equal(json.error, "INVALID_REQUEST");
          assert.match(json.message, message, JSON.stringify(body));
        }
        assert.equal(apiCalls(), before);
      },
    );

    await t.step("consumption: Apple's 400 is INVALID_REQUEST with its errorCode", async () => {
      const { status, json } = await consumption({
        transactionId: renewed.payload.transactionId,
        consumptionPercentage: 50_000,
      });
      assert.equal(status, 400);
      assert.equal(json.error, "INVALID_REQUEST");
      assert.deepEqual(json.details, { upstreamCode: 4000209 });
      assert.match(json.message, /auto-renewable/);
      const line = await service.waitForLog((l) =>
        l.msg === "store_action" && l.transactionId === renewed.payload.transactionId
      );
      assert.equal(line.outcome, "INVALID_REQUEST");
    });

    await t.step("consumption: a transaction found nowhere is TRANSACTION_NOT_FOUND", async () => {
      const { status, json } = await consumption({ transactionId: "2000000000029999" });
      assert.equal(status, 200);
      assert.equal(json.valid, false);
      assert.equal(json.error, "TRANSACTION_NOT_FOUND");
      assert.deepEqual(callsOf(api, "2000000000029999"), [
        "consumption production:404",
        "consumption sandbox:404",
      ]);
    });

    await t.step(
      "upstream: Apple's 429 is RATE_LIMITED with its millisecond Retry-After",
      async () => {
        api.script(
          "production",
          storeaRateLimitedAnswer({ retryAt: Date.now() + 30_000, operation: "subscriptions" }),
        );
        const { status, headers, json } = await auto.post("/v1/storea/subscriptions", {
          transactionId: older.payload.transactionId,
        });
        assert.equal(status, 429);
        assert.equal(json.error, "RATE_LIMITED");
        const seconds = Number(headers.get("retry-after"));
        assert.ok(seconds >= 28 && seconds <= 30, `Retry-After ${seconds}`);
        assert.equal(json.details.retryAfterSeconds, seconds);
      },
    );

    await t.step(
      "upstream: a 5xx is retried once, reads and the idempotent PUT alike",
      async () => {
        api.script("production", {
          status: 500,
          body: STOREA_API_ERRORS.generalInternal,
          operation: "history",
        });
        assert.equal((await history({})).json.valid, true);
        assert.deepEqual(callsOf(api, erinIds[0]).slice(-2), [
          "history production:500",
          "history production:200",
        ]);

        const sent = api.consumptionRequests.length;
        api.script("production", {
          status: 503,
          body: STOREA_API_ERRORS.generalInternalRetryable,
          operation: "consumption",
        });
        assert.equal((await consumption({})).json.sent, true);
        assert.deepEqual(callsOf(api, consumable.payload.transactionId).slice(-2), [
          "consumption production:503",
          "consumption production:202",
        ]);
        assert.equal(api.consumptionRequests.length, sent + 1);

        api.script("production", {
          status: 503,
          body: STOREA_API_ERRORS.generalInternal,
          times: 2,
          operation: "subscriptions",
        });
        const twice = await auto.post("/v1/storea/subscriptions", {
          transactionId: older.payload.transactionId,
        });
        assert.equal(twice.status, 502);
        assert.equal(twice.json.error, "APPLE_API_ERROR");
        assert.deepEqual(twice.json.details, { status: 503, upstreamCode: 5000000 });

        api.script("production", { reset: true, times: 2, operation: "consumption" });
        const reset = await consumption({});
        assert.equal(reset.status, 502);
        assert.deepEqual(reset.json.details, { status: null, upstreamCode: null });
      },
    );

    await t.step("upstream: production's 401 moves on to sandbox in automatic mode", async () => {
      const sandboxOnly = await add("sandbox", "frank", {
        transactionId: "2000000000031001",
        originalTransactionId: "2000000000031001",
        type: "Consumable",
        productId: "coins.100",
      });
      api.script("production", { status: 401, operation: "consumption" });
      const sent = await consumption({ transactionId: sandboxOnly.payload.transactionId });
      assert.equal(sent.json.sent, true);
      api.script("production", { status: 401, operation: "subscriptions" });
      const subscriptions = await auto.post("/v1/storea/subscriptions", {
        transactionId: sandboxOnly.payload.transactionId,
      });
      assert.equal(subscriptions.json.environment, "sandbox");
      api.script("production", { status: 401, operation: "history" });
      const page = await auto.post("/v1/storea/history", {
        transactionId: sandboxOnly.payload.transactionId,
      });
      assert.equal(page.json.environment, "sandbox");
      assert.deepEqual(callsOf(api, sandboxOnly.payload.transactionId), [
        "consumption production:401",
        "consumption sandbox:202",
        "subscriptions production:401",
        "subscriptions sandbox:200",
        "history production:401",
        "history sandbox:200",
      ]);
      // With no fallback a 401 is the tenant's key: 502.
      api.script("production", { status: 401, operation: "history" });
      const refused = await history({ environment: "production" });
      assert.equal(refused.status, 502);
      assert.deepEqual(refused.json.details, { status: 401, upstreamCode: null });
    });

    await t.step("order: key, then body, then credentials, none asking the App Store", async () => {
      const before = apiCalls();
      for (
        const path of ["/v1/storea/subscriptions", "/v1/storea/history", "/v1/storea/consumption"]
      ) {
        const anonymous = await fetch(`${service.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ transactionId: erinIds[0] }),
        });
        assert.equal(anonymous.status, 401, path);
        assert.equal((await anonymous.json()).error, "UNAUTHENTICATED");
      }
      const bare = await callerFor(service, null);
      const valid = {
        "/v1/storea/subscriptions": { transactionId: erinIds[0] },
        "/v1/storea/history": { transactionId: erinIds[0] },
        "/v1/storea/consumption": {
          transactionId: erinIds[0],
          customerConsented: true,
          sampleContentProvided: true,
          deliveryStatus: "DELIVERED",
        },
      };
      for (const [path, body] of Object.entries(valid)) {
        const invalid = await bare.post(path, { ...body, unknown: 1 });
        assert.equal(invalid.json.error, "INVALID_REQUEST", path);
        const missing = await bare.post(path, body);
        assert.equal(missing.status, 400, path);
        assert.equal(missing.json.error, "CREDENTIALS_MISSING", path);
      }
      const unconsented = await bare.post("/v1/storea/consumption", {
        ...valid["/v1/storea/consumption"],
        customerConsented: false,
      });
      assert.equal(unconsented.json.error, "INVALID_REQUEST");
      assert.equal(apiCalls(), before);
    });

    await t.step("no token, key or signed payload reaches the logs", () => {
      const logs = service.rawStdout();
      assert.ok(!logs.includes("eyJ"), "a JWT or JWS was logged");
      assert.ok(!logs.includes("BEGIN PRIVATE KEY"));
    });
  } finally {
    await world.close();
  }
});

Deno.test("store A gateway: the endpoints share verify's rate limit bucket", async () => {
  const world = await startWorld({ RATE_LIMIT_BURST: "3", RATE_LIMIT_PER_SECOND: "0.1" });
  try {
    const caller = await callerFor(world.service, world.keyFile);
    const id = "2000000000041001";
    await world.api.addTransaction(
      "production",
      world.signer.sampleTransaction({ transactionId: id, type: "Consumable" }),
    );
    assert.equal((await caller.post("/v1/storea/verify", { transactionId: id })).status, 200);
    assert.equal((await caller.post("/v1/storea/history", { transactionId: id })).status, 200);
    const consumption = await caller.post("/v1/storea/consumption", {
      transactionId: id,
      customerConsented: true,
      sampleContentProvided: true,
      deliveryStatus: "DELIVERED",
    });
    assert.equal(consumption.status, 200);
    const calls = world.api.requests.length;
    const limited = await caller.post("/v1/storea/subscriptions", { transactionId: id });
    assert.equal(limited.status, 429);
    assert.equal(limited.json.error, "RATE_LIMITED");
    assert.ok(Number(limited.headers.get("retry-after")) >= 1);
    // Before the body: even a bad one is answered 429.
    assert.equal((await caller.post("/v1/storea/history", "{")).status, 429);
    assert.equal((await caller.post("/v1/storea/verify", { transactionId: id })).status, 429);
    assert.equal(world.api.requests.length, calls);
  } finally {
    await world.close();
  }
});
