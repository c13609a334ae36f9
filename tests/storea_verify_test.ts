/**
 * `POST /v1/storea/verify` end to end: a real service process, real HTTP on loopback, the App Store
 * simulator checking the service's ES256 tokens, and transactions signed by the simulator's test
 * PKI (trusted through STOREA_ROOT_CERTS).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  createTenantWithKey,
  databaseOf,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import { storeaCredentialArgs, TEST_ISSUER_ID, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  STOREA_API_ERRORS,
  storeaRateLimitedAnswer,
} from "../simulators/storea_api.ts";

const BUNDLE_ID = "com.example.app";

interface Caller {
  tenantId: string;
  // deno-lint-ignore no-explicit-any
  verify(body: unknown): Promise<{ status: number; headers: Headers; json: any }>;
}

async function callerFor(service: RunningService, keyFile: string, env?: string): Promise<Caller> {
  const { tenantId, key } = await createTenantWithKey(service);
  const args = storeaCredentialArgs(tenantId, keyFile);
  if (env) args.push("--environment", env);
  const set = await service.cli(...args);
  assert.equal(set.code, 0, set.stderr);
  return {
    tenantId,
    async verify(body) {
      const response = await fetch(`${service.url}/v1/storea/verify`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return { status: response.status, headers: response.headers, json: await response.json() };
    },
  };
}

Deno.test("store A verify through HTTP against the App Store simulator", async (t) => {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const api = await startStoreaApiSimulator({ signer });
  const keyFile = await writeStoreaKeyFile(dir);
  await api.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: BUNDLE_ID,
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  const service = await startService({
    env: {
      ...api.serviceEnv,
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      UPSTREAM_TIMEOUT: "2s",
      VALIDATION_AUDIT_ENABLED: "true",
      VALIDATION_AUDIT_RETENTION_DAYS: "30",
    },
  });
  const auto = await callerFor(service, keyFile);
  const callsOf = (id: string) =>
    api.requests.filter((r) => r.transactionId === id).map((r) => `${r.environment}:${r.status}`);

  try {
    await t.step("a production transaction: every field of the response", async () => {
      const payload = signer.sampleTransaction({
        transactionId: "2000000000000101",
        originalTransactionId: "2000000000000100",
        productId: "pro.monthly",
        type: "Auto-Renewable Subscription",
        purchaseDate: 1700000000000,
        originalPurchaseDate: 1690000000000,
        expiresDate: 1702592000000,
        appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
        price: 9990,
        currency: "USD",
        offerType: 1,
        offerIdentifier: "intro",
      });
      const jws = await api.addTransaction("production", payload);
      const { status, headers, json } = await auto.verify({ transactionId: "2000000000000101" });
      assert.equal(status, 200);
      assert.match(headers.get("x-request-id")!, /^req_[0-9A-HJKMNP-TV-Z]{26}$/);
      assert.equal(json.valid, true);
      assert.equal(json.version, "dev");
      assert.equal(json.environment, "production");
      assert.equal(json.appUserId, "7e3fb20b-4cdb-47cc-936d-99d65f608138");
      const tx = json.transaction;
      assert.equal(tx.transactionId, "2000000000000101");
      assert.equal(tx.originalTransactionId, "2000000000000100");
      assert.equal(tx.bundleId, BUNDLE_ID);
      assert.equal(tx.productId, "pro.monthly");
      assert.equal(tx.purchaseDate, "2023-11-14T22:13:20.000Z");
      assert.equal(tx.originalPurchaseDate, "2023-07-22T04:26:40.000Z");
      assert.equal(tx.expiresDate, "2023-12-14T22:13:20.000Z");
      assert.equal(tx.type, "Auto-Renewable Subscription");
      assert.equal(tx.inAppOwnershipType, payload.inAppOwnershipType);
      assert.equal(tx.quantity, 1);
      assert.equal(tx.webOrderLineItemId, payload.webOrderLineItemId ?? null);
      assert.equal(tx.revocationDate, null);
      assert.equal(tx.revocationReason, null);
      assert.equal(tx.offerType, 1);
      assert.equal(tx.offerIdentifier, "intro");
      assert.equal(tx.appAccountToken, "7e3fb20b-4cdb-47cc-936d-99d65f608138");
      assert.equal(tx.storefront, payload.storefront);
      assert.equal(tx.storefrontId, payload.storefrontId);
      assert.equal(tx.transactionReason, payload.transactionReason);
      assert.equal(tx.currency, "USD");
      assert.equal(tx.price, 999);
      // Passed through byte for byte, so the client can verify it again.
      assert.equal(tx.signedTransactionInfo, jws);
      assert.deepEqual(tx.rawDecodedPayload, { ...payload, environment: "Production" });
      assert.deepEqual(callsOf("2000000000000101"), ["production:200"]);
    });

    await t.step(
      "auto mode falls back to sandbox on 404, and says where it was found",
      async () => {
        await api.addTransaction("sandbox", signer.sampleTransaction({ transactionId: "201" }));
        const { status, json } = await auto.verify({ transactionId: "201" });
        assert.equal(status, 200);
        assert.equal(json.environment, "sandbox");
        assert.deepEqual(callsOf("201"), ["production:404", "sandbox:200"]);
      },
    );

    await t.step("auto mode falls back to sandbox when production answers 401", async () => {
      await api.addTransaction("sandbox", signer.sampleTransaction({ transactionId: "202" }));
      api.script("production", { status: 401 });
      const { json } = await auto.verify({ transactionId: "202" });
      assert.equal(json.valid, true);
      assert.deepEqual(callsOf("202"), ["production:401", "sandbox:200"]);
    });

    await t.step("found nowhere: 200 TRANSACTION_NOT_FOUND", async () => {
      const { status, json } = await auto.verify({ transactionId: "203" });
      assert.equal(status, 200);
      assert.deepEqual(Object.keys(json).sort(), ["error", "message", "valid", "version"]);
      assert.equal(json.valid, false);
      assert.equal(json.error, "TRANSACTION_NOT_FOUND");
      assert.match(json.message, /production or sandbox/);
      assert.deepEqual(callsOf("203"), ["production:404", "sandbox:404"]);
    });

    await t.step("ids that cannot be a URL path segment: 400 INVALID_REQUEST", async () => {
      // "." and ".." would be resolved away, asking another path of the API, whose 404 came
      // back as TRANSACTION_NOT_FOUND; an unpaired surrogate could not be encoded at all (500).
      for (const transactionId of [".", "..", "\ud800", "1\udc00"]) {
        const { status, json } = await auto.verify({ transactionId });
        assert.equal(status, 400, JSON.stringify(json));
        assert.equal(json.error, "INVALID_REQUEST");
      }
    });

    await t.step("the per-call environment overrides the tenant's automatic mode", async () => {
      await api.addTransaction(
        "sandbox",
        signer.sampleTransaction({ transactionId: "204", appAccountToken: undefined }),
      );
      const inSandbox = await auto.verify({ transactionId: "204", environment: "sandbox" });
      assert.equal(inSandbox.json.environment, "sandbox");
      // No appAccountToken on the purchase: appUserId is present and null.
      assert.equal(inSandbox.json.appUserId, null);
      assert.equal(inSandbox.json.transaction.appAccountToken, null);
      assert.deepEqual(callsOf("204"), ["sandbox:200"]);
      const inProduction = await auto.verify({ transactionId: "204", environment: "production" });
      assert.equal(inProduction.json.error, "TRANSACTION_NOT_FOUND");
      assert.deepEqual(callsOf("204"), ["sandbox:200", "production:404"]);
    });

    await t.step("a tenant configured for sandbox asks only sandbox", async () => {
      const sandboxOnly = await callerFor(service, keyFile, "sandbox");
      await api.addTransaction("production", signer.sampleTransaction({ transactionId: "205" }));
      const { json } = await sandboxOnly.verify({ transactionId: "205" });
      assert.equal(json.error, "TRANSACTION_NOT_FOUND");
      assert.deepEqual(callsOf("205"), ["sandbox:404"]);
    });

    await t.step("another app's transaction: 200 BUNDLE_ID_MISMATCH", async () => {
      await api.addTransaction(
        "production",
        signer.sampleTransaction({ transactionId: "206", bundleId: "com.other.app" }),
      );
      const { status, json } = await auto.verify({ transactionId: "206" });
      assert.equal(status, 200);
      assert.equal(json.valid, false);
      assert.equal(json.error, "BUNDLE_ID_MISMATCH");
      assert.match(json.message, /com\.other\.app/);
    });

    await t.step(
      "Apple's 429: RATE_LIMITED with its millisecond Retry-After in seconds",
      async () => {
        api.script("production", storeaRateLimitedAnswer({ retryAt: Date.now() + 30_000 }));
        const { status, headers, json } = await auto.verify({ transactionId: "207" });
        assert.equal(status, 429);
        assert.equal(json.error, "RATE_LIMITED");
        const seconds = Number(headers.get("retry-after"));
        assert.ok(seconds >= 28 && seconds <= 30, `Retry-After ${seconds}`);
        assert.equal(json.details.retryAfterSeconds, seconds);
      },
    );

    await t.step("a 5xx, a retryable errorCode or a reset is retried once", async () => {
      await api.addTransaction("production", signer.sampleTransaction({ transactionId: "208" }));
      api.script("production", { status: 500, body: STOREA_API_ERRORS.generalInternal });
      assert.equal((await auto.verify({ transactionId: "208" })).json.valid, true);
      assert.deepEqual(callsOf("208"), ["production:500", "production:200"]);

      api.script("production", { status: 400, body: STOREA_API_ERRORS.generalInternalRetryable });
      assert.equal((await auto.verify({ transactionId: "208" })).json.valid, true);

      api.script("production", { reset: true });
      assert.equal((await auto.verify({ transactionId: "208" })).json.valid, true);
      assert.deepEqual(callsOf("208").slice(2), [
        "production:400",
        "production:200",
        "production:null",
        "production:200",
      ]);
    });

    await t.step("the same failure twice: 502 APPLE_API_ERROR with the status", async () => {
      api.script("production", { status: 503, body: STOREA_API_ERRORS.generalInternal, times: 2 });
      const { status, json } = await auto.verify({ transactionId: "209" });
      assert.equal(status, 502);
      assert.equal(json.error, "APPLE_API_ERROR");
      assert.deepEqual(json.details, { status: 503, upstreamCode: 5000000 });

      // The simulator closes every connection, so each reset is one failed call.
      api.script("production", { reset: true, times: 2 });
      const reset = await auto.verify({ transactionId: "209" });
      assert.equal(reset.status, 502);
      assert.deepEqual(reset.json.details, { status: null, upstreamCode: null });
      assert.deepEqual(callsOf("209").slice(-2), ["production:null", "production:null"]);
    });

    await t.step("an unexpected status is not retried: 502 with Apple's errorCode", async () => {
      api.script("production", { status: 400, body: STOREA_API_ERRORS.invalidTransactionId });
      const { status, json } = await auto.verify({ transactionId: "210" });
      assert.equal(status, 502);
      assert.deepEqual(json.details, { status: 400, upstreamCode: 4000006 });
      assert.deepEqual(callsOf("210"), ["production:400"]);
    });

    await t.step("a 401 where no fallback applies means a bad key: 502", async () => {
      api.script("production", { status: 401 });
      const { status, json } = await auto.verify({
        transactionId: "211",
        environment: "production",
      });
      assert.equal(status, 502);
      assert.equal(json.error, "APPLE_API_ERROR");
      assert.deepEqual(json.details, { status: 401, upstreamCode: null });
    });

    await t.step("a slow App Store: 502 when UPSTREAM_TIMEOUT runs out", async () => {
      await api.addTransaction("production", signer.sampleTransaction({ transactionId: "212" }));
      api.script("production", { delayMs: 10_000 });
      const started = performance.now();
      const { status, json } = await auto.verify({ transactionId: "212" });
      const elapsed = performance.now() - started;
      assert.equal(status, 502);
      assert.equal(json.error, "APPLE_API_ERROR");
      assert.match(json.message, /in time/);
      assert.ok(elapsed < 5_000, `answered after ${elapsed} ms`);
    });

    await t.step("a signedTransactionInfo that does not verify is never trusted: 502", async () => {
      const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
      const forged = await stranger.signTransaction(
        stranger.sampleTransaction({ transactionId: "213" }),
      );
      api.script("production", { status: 200, body: { signedTransactionInfo: forged } });
      const { status, json } = await auto.verify({ transactionId: "213" });
      assert.equal(status, 502);
      assert.equal(json.error, "APPLE_API_ERROR");
      assert.match(json.message, /did not verify/);
    });

    await t.step("identical requests in flight share one App Store call", async () => {
      await api.addTransaction("production", signer.sampleTransaction({ transactionId: "214" }));
      api.script("production", { delayMs: 300 });
      const answers = await Promise.all(
        Array.from({ length: 5 }, () => auto.verify({ transactionId: "214" })),
      );
      assert.ok(answers.every((a) => a.json.valid === true));
      assert.deepEqual(callsOf("214"), ["production:200"]);
      // A different request is not folded into it.
      await auto.verify({ transactionId: "214", environment: "production" });
      assert.equal(callsOf("214").length, 2);
    });

    await t.step("one signed token serves many calls", () => {
      assert.equal(api.tokensSeen, 1);
      assert.ok(api.requests.every((r) => r.authFailure === undefined));
    });

    await t.step("the audit records outcomes with the id hashed, in the background", async () => {
      const sql = databaseOf(service);
      try {
        let rows: Record<string, unknown>[] = [];
        for (let i = 0; i < 50 && rows.length < 3; i++) {
          rows = await sql`
            SELECT tenant_id, store, subject_hash, outcome, upstream_status, latency_ms
            FROM validation_audit WHERE tenant_id = ${auto.tenantId} ORDER BY id`;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        const outcomes = new Set(rows.map((row) => `${row.outcome}:${row.upstream_status}`));
        for (
          const expected of [
            "valid:200",
            "TRANSACTION_NOT_FOUND:404",
            "BUNDLE_ID_MISMATCH:200",
            "RATE_LIMITED:429",
            "APPLE_API_ERROR:503",
          ]
        ) assert.ok(outcomes.has(expected), `${expected} in ${[...outcomes]}`);
        assert.ok(rows.every((row) => row.store === "storea"));
        assert.ok(rows.every((row) => /^[0-9a-f]{64}$/.test(row.subject_hash as string)));
        const dump = JSON.stringify(await sql`SELECT * FROM validation_audit`);
        assert.ok(!dump.includes("2000000000000101"), "a transaction id is stored in clear");

        // The CLI finds a transaction's entries by hashing the id it is given.
        const lookup = await service.cli(
          "audit",
          "lookup",
          auto.tenantId,
          "--subject",
          "2000000000000101",
        );
        assert.equal(lookup.code, 0, lookup.stderr);
        assert.deepEqual(
          lookup.json.entries.map((e: Record<string, unknown>) => [e.store, e.outcome]),
          [["storea", "valid"]],
        );
        const none = await service.cli("audit", "lookup", auto.tenantId, "--subject", "999");
        assert.deepEqual(none.json.entries, []);
      } finally {
        await sql.end();
      }
    });

    await t.step("no token, key or signed payload reaches the logs", () => {
      const logs = service.rawStdout();
      assert.ok(!logs.includes("eyJ"), "a JWT or JWS was logged");
      assert.ok(!logs.includes("BEGIN PRIVATE KEY"));
      assert.ok(logs.includes('"msg":"validation_audit_pruned"'));
      assert.ok(!logs.includes("validation_audit_enabled_no_retention"));
    });
  } finally {
    await stopAndDrop(service);
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
