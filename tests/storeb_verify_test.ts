/**
 * `POST /v1/storeb/verify` end to end: a real service process talks over loopback HTTP to the store
 * B simulator running in this test process.
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
import { storebCredentialArgs } from "./helpers/fixtures.ts";
import {
  createServiceAccount,
  type GeneratedServiceAccount,
} from "../simulators/service_account.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
} from "../simulators/storeb_play.ts";
import { StorebVerifier } from "../src/storeb/verify.ts";
import type { StorebCredentials } from "../src/storeb/credentials.ts";
import { ServiceError } from "../src/errors.ts";

const PACKAGE = "com.example.app"; // the package storebCredentialArgs configures

interface Answer {
  status: number;
  headers: Headers;
  // deno-lint-ignore no-explicit-any
  body: any;
}

/** A fresh purchase token; distinctive, so the log check below can look for it. */
function newToken(): string {
  return `ptok-${crypto.randomUUID()}`;
}

async function verify(service: RunningService, key: string, body: unknown): Promise<Answer> {
  const response = await fetch(`${service.url}/v1/storeb/verify`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

function subscriptionRequest(purchaseToken: string, productId = "monthly") {
  return { packageName: PACKAGE, productId, purchaseToken, type: "subscription" };
}

function productRequest(purchaseToken: string, productId = "coins_100") {
  return { packageName: PACKAGE, productId, purchaseToken, type: "product" };
}

function assertGoogleApiError(answer: Answer, status: number | null, upstreamCode: string | null) {
  assert.equal(answer.status, 502, JSON.stringify(answer.body));
  assert.equal(answer.body.valid, false);
  assert.equal(answer.body.error, "GOOGLE_API_ERROR");
  assert.equal(typeof answer.body.message, "string");
  assert.deepEqual(answer.body.details, { status, upstreamCode });
}

/** Gives a tenant store B credentials through the CLI, with a service account the simulator knows. */
async function withStorebCredentials(
  service: RunningService,
  tenantId: string,
  account: GeneratedServiceAccount,
  dir: string,
): Promise<void> {
  const path = join(dir, `${tenantId}.json`);
  await Deno.writeTextFile(path, account.json);
  const set = await service.cli(...storebCredentialArgs(tenantId, path));
  assert.equal(set.code, 0, set.stderr);
}

Deno.test("storeb verify: every documented answer through a real service", async (t) => {
  const play = await startStorebSimulator();
  const service = await startService({
    env: {
      ...play.serviceEnv,
      RATE_LIMIT_BURST: "1000",
      UPSTREAM_TIMEOUT: "3s",
      VALIDATION_AUDIT_ENABLED: "true",
    },
  });
  const dir = await Deno.makeTempDir({ prefix: "pr-storeb-" });
  const tokensUsed: string[] = [];
  const token = () => {
    const value = newToken();
    tokensUsed.push(value);
    return value;
  };
  /** Counts the simulator's calls made by `run`. */
  const counting = async <T>(run: () => Promise<T>) => {
    const before = { api: play.apiRequests, token: play.tokenRequests };
    const result = await run();
    return {
      result,
      apiCalls: play.apiRequests - before.api,
      tokenCalls: play.tokenRequests - before.token,
    };
  };
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const { key, tenantId } = await createTenantWithKey(service);
    await withStorebCredentials(service, tenantId, account, dir);
    const version = (await fetch(`${service.url}/health`).then((r) => r.json())).version;

    const step = (name: string, run: () => Promise<void>) =>
      t.step(name, async () => {
        play.clearScripts();
        await run();
      });

    await step("a subscription: every field normalized from line item 0", async () => {
      const purchaseToken = token();
      const upstream = sampleSubscriptionPurchase({ regionCode: "GB" });
      upstream.lineItems![0].autoRenewingPlan!.recurringPrice = {
        currencyCode: "GBP",
        units: "4",
        nanos: 490_000_000,
      };
      play.addSubscription({ packageName: PACKAGE, purchaseToken, purchase: upstream });
      const { result: answer, apiCalls, tokenCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(purchaseToken))
      );
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        appUserId: "3f1c2a9e-7b4d-4e21-9a5f-0c8e6d2b1a47",
        purchase: {
          kind: "storeb#subscriptionPurchaseV2",
          packageName: PACKAGE,
          productId: "premium_monthly",
          purchaseToken,
          startTime: upstream.startTime,
          expiryTime: upstream.lineItems![0].expiryTime,
          autoRenewing: true,
          priceCurrencyCode: "GBP",
          priceAmountMicros: "4490000",
          countryCode: "GB",
          paymentState: null,
          acknowledgementState: 1,
          orderId: "GPA.3372-4150-9088-12345",
          obfuscatedExternalAccountId: "3f1c2a9e-7b4d-4e21-9a5f-0c8e6d2b1a47",
          rawResponse: upstream,
        },
      });
      assert.equal(apiCalls, 1);
      assert.equal(tokenCalls, 1, "the first verify gets a token");
    });

    await step(
      "a subscription: orderId fallback, pending acknowledgement, no account id",
      async () => {
        const purchaseToken = token();
        const upstream = sampleSubscriptionPurchase({
          acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING",
          lineItems: [{
            productId: "premium_yearly",
            expiryTime: "2026-02-01T00:00:00.000Z",
            autoRenewingPlan: {
              autoRenewEnabled: false,
              recurringPrice: { currencyCode: "USD", units: "-1", nanos: -500_000_001 },
            },
            latestSuccessfulOrderId: "GPA.0000-1111-2222-33333..0",
          }],
        });
        delete upstream.latestOrderId;
        delete upstream.externalAccountIdentifiers;
        play.addSubscription({ packageName: PACKAGE, purchaseToken, purchase: upstream });
        const answer = await verify(service, key, subscriptionRequest(purchaseToken));
        assert.equal(answer.status, 200);
        assert.equal(answer.body.appUserId, null);
        const purchase = answer.body.purchase;
        assert.equal(purchase.orderId, "GPA.0000-1111-2222-33333..0");
        assert.equal(purchase.acknowledgementState, 0);
        assert.equal(purchase.autoRenewing, false);
        assert.equal(purchase.productId, "premium_yearly");
        assert.equal(purchase.expiryTime, "2026-02-01T00:00:00.000Z");
        assert.equal(purchase.priceAmountMicros, "-1500000.001");
        assert.equal(purchase.obfuscatedExternalAccountId, null);
        assert.deepEqual(purchase.rawResponse, upstream);
      },
    );

    await step("a product: appUserId from the top level", async () => {
      const purchaseToken = token();
      const upstream = sampleProductPurchase({ obfuscatedExternalAccountId: "acct-77" });
      play.addProduct({
        packageName: PACKAGE,
        productId: "coins_100",
        purchaseToken,
        purchase: upstream,
      });
      const answer = await verify(service, key, productRequest(purchaseToken));
      assert.equal(answer.status, 200);
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        appUserId: "acct-77",
        purchase: {
          kind: "storeb#productPurchase",
          packageName: PACKAGE,
          productId: "coins_100",
          purchaseToken,
          purchaseTimeMillis: upstream.purchaseTimeMillis,
          purchaseState: 0,
          consumptionState: 0,
          acknowledgementState: 1,
          orderId: "GPA.3301-2954-7711-54321",
          obfuscatedExternalAccountId: "acct-77",
          rawResponse: upstream,
        },
      });
      // The product id is part of the lookup: another product with this token is not found.
      const other = await verify(service, key, productRequest(purchaseToken, "coins_200"));
      assert.equal(other.body.error, "PURCHASE_NOT_FOUND");
    });

    await step("odd characters in ids travel URL-encoded, one path segment each", async () => {
      const purchaseToken = `${token()}/a b?c#d%2F..é`;
      play.addProduct({
        packageName: PACKAGE,
        productId: "pack/of 10",
        purchaseToken,
        purchase: sampleProductPurchase(),
      });
      const answer = await verify(service, key, productRequest(purchaseToken, "pack/of 10"));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(answer.body.purchase.purchaseToken, purchaseToken);
      const dots = await verify(service, key, productRequest(".."));
      assert.equal(dots.status, 400);
      assert.equal(dots.body.error, "INVALID_REQUEST");
      // An unpaired surrogate cannot be percent-encoded: it failed with a 500.
      for (
        const body of [productRequest("tok\ud800"), productRequest("tok", "coins\udc00")]
      ) {
        const odd = await verify(service, key, body);
        assert.equal(odd.status, 400, JSON.stringify(odd.body));
        assert.equal(odd.body.error, "INVALID_REQUEST");
        assert.match(odd.body.message, /unpaired surrogate/);
      }
    });

    await step("the access token is cached across requests", async () => {
      const purchaseToken = token();
      play.addSubscription({
        packageName: PACKAGE,
        purchaseToken,
        purchase: sampleSubscriptionPurchase(),
      });
      const { result, apiCalls, tokenCalls } = await counting(async () => {
        const answers = [];
        for (let i = 0; i < 5; i++) {
          answers.push(await verify(service, key, subscriptionRequest(purchaseToken)));
        }
        // Distinct tokens, so coalescing does not fold these together.
        const others = Array.from({ length: 5 }, () => token());
        for (const other of others) {
          play.addSubscription({
            packageName: PACKAGE,
            purchaseToken: other,
            purchase: sampleSubscriptionPurchase(),
          });
        }
        answers.push(
          ...await Promise.all(
            others.map((other) => verify(service, key, subscriptionRequest(other))),
          ),
        );
        return answers;
      });
      for (const answer of result) assert.equal(answer.status, 200);
      assert.equal(apiCalls, 10);
      assert.equal(tokenCalls, 0);
      assert.equal(play.tokenRequests, 1, "one token for everything so far");
    });

    await step("identical requests in flight share one store call", async () => {
      const purchaseToken = token();
      play.addSubscription({
        packageName: PACKAGE,
        purchaseToken,
        purchase: sampleSubscriptionPurchase(),
      });
      play.script({ delayMs: 300 });
      const { result, apiCalls } = await counting(() =>
        Promise.all(
          Array.from({ length: 5 }, () => verify(service, key, subscriptionRequest(purchaseToken))),
        )
      );
      for (const answer of result) assert.equal(answer.body.valid, true);
      assert.equal(apiCalls, 1);
      // The same token asked as a product is another question: not folded in.
      const { apiCalls: asProduct } = await counting(() =>
        verify(service, key, { ...subscriptionRequest(purchaseToken), type: "product" })
      );
      assert.equal(asProduct, 1);
    });

    await step("404: PURCHASE_NOT_FOUND, the token never existed", async () => {
      const answer = await verify(service, key, subscriptionRequest(token()));
      assert.equal(answer.status, 200);
      assert.deepEqual(Object.keys(answer.body).sort(), ["error", "message", "valid", "version"]);
      assert.equal(answer.body.valid, false);
      assert.equal(answer.body.version, version);
      assert.equal(answer.body.error, "PURCHASE_NOT_FOUND");
      assert.match(answer.body.message, /never existed/);
    });

    await step("410: PURCHASE_NOT_FOUND, no longer valid", async () => {
      const purchaseToken = token();
      play.script({ status: 410, purchaseToken });
      const answer = await verify(service, key, productRequest(purchaseToken));
      assert.equal(answer.status, 200);
      assert.equal(answer.body.valid, false);
      assert.equal(answer.body.error, "PURCHASE_NOT_FOUND");
      assert.match(
        answer.body.message,
        /no longer valid: consumed, refunded or expired too long ago/,
      );
      assert.doesNotMatch(answer.body.message, /never existed/);
    });

    await step("PACKAGE_NAME_MISMATCH without asking the store", async () => {
      const { result: answer, apiCalls, tokenCalls } = await counting(() =>
        verify(service, key, { ...subscriptionRequest(token()), packageName: "com.other.app" })
      );
      assert.equal(answer.status, 200);
      assert.equal(answer.body.valid, false);
      assert.equal(answer.body.version, version);
      assert.equal(answer.body.error, "PACKAGE_NAME_MISMATCH");
      assert.equal(apiCalls, 0);
      assert.equal(tokenCalls, 0);
    });

    await step(
      "upstream 429 with a hint: 429 RATE_LIMITED, Retry-After and retryAfterSeconds",
      async () => {
        play.script({ status: 429, headers: { "retry-after": "17" } });
        const { result: answer, apiCalls } = await counting(() =>
          verify(service, key, subscriptionRequest(token()))
        );
        assert.equal(answer.status, 429);
        assert.equal(answer.body.valid, false);
        assert.equal(answer.body.error, "RATE_LIMITED");
        assert.equal(typeof answer.body.message, "string");
        assert.deepEqual(answer.body.details, { retryAfterSeconds: 17 });
        assert.equal(answer.headers.get("retry-after"), "17");
        assert.equal(apiCalls, 1, "a 429 is not retried");
      },
    );

    await step("upstream 429 without a hint: 429 RATE_LIMITED with the default wait", async () => {
      play.script({ status: 429 });
      const answer = await verify(service, key, subscriptionRequest(token()));
      assert.equal(answer.status, 429);
      assert.equal(answer.body.error, "RATE_LIMITED");
      assert.deepEqual(answer.body.details, { retryAfterSeconds: 60 });
      assert.equal(answer.headers.get("retry-after"), "60");
    });

    const known = token();
    play.addSubscription({
      packageName: PACKAGE,
      purchaseToken: known,
      purchase: sampleSubscriptionPurchase(),
    });

    await step("a 5xx once: retried, and the retry's answer counts", async () => {
      play.script({ status: 503 });
      const { result: answer, apiCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assert.equal(answer.status, 200);
      assert.equal(answer.body.valid, true);
      assert.equal(apiCalls, 2);
    });

    await step("a 5xx twice: 502 GOOGLE_API_ERROR with the status, retried only once", async () => {
      play.script({ status: 500, times: 5 });
      const { result: answer, apiCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assertGoogleApiError(answer, 500, "INTERNAL");
      assert.equal(apiCalls, 2);
    });

    await step("another status: 502 GOOGLE_API_ERROR with Google's code, not retried", async () => {
      play.script({ status: 403 });
      const { result: answer, apiCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assertGoogleApiError(answer, 403, "PERMISSION_DENIED");
      assert.equal(apiCalls, 1);
      play.script({ status: 400, rawBody: "<html>Bad Request</html>" });
      assertGoogleApiError(await verify(service, key, subscriptionRequest(known)), 400, null);
    });

    await step("a redirect is not followed: 502", async () => {
      const location = `${play.apiUrl}/androidpublisher/v3/applications/${PACKAGE}` +
        `/purchases/subscriptionsv2/tokens/${known}`;
      play.script({ status: 302, headers: { location }, rawBody: "" });
      const { result: answer, apiCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assertGoogleApiError(answer, 302, null);
      assert.equal(apiCalls, 1);
    });

    await step("a 200 that is not a purchase object: 502", async () => {
      play.script({ status: 200, body: ["not", "an", "object"] });
      assertGoogleApiError(await verify(service, key, subscriptionRequest(known)), 200, null);
      play.script({ status: 200, rawBody: "<html>maintenance</html>" });
      assertGoogleApiError(await verify(service, key, productRequest(known)), 200, null);
    });

    await step("a reset connection: retried once", async () => {
      play.script({ reset: true });
      const once = await counting(() => verify(service, key, subscriptionRequest(known)));
      assert.equal(once.result.status, 200);
      assert.equal(once.apiCalls, 2);
      play.script({ reset: true, times: 2 });
      const twice = await counting(() => verify(service, key, subscriptionRequest(known)));
      assertGoogleApiError(twice.result, null, null);
      assert.equal(twice.apiCalls, 2);
    });

    await step("upstream 401 once: one token refresh, then success", async () => {
      play.revokeAccessTokens();
      const { result: answer, apiCalls, tokenCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assert.equal(answer.status, 200);
      assert.equal(apiCalls, 2);
      assert.equal(tokenCalls, 1);
      const after = await counting(() => verify(service, key, subscriptionRequest(known)));
      assert.equal(after.tokenCalls, 0, "the fresh token is cached");
    });

    await step("upstream 401 again after the refresh: 502, and only one refresh", async () => {
      play.script({ status: 401, times: 3 });
      const { result: answer, apiCalls, tokenCalls } = await counting(() =>
        verify(service, key, subscriptionRequest(known))
      );
      assertGoogleApiError(answer, 401, "UNAUTHENTICATED");
      assert.equal(apiCalls, 2);
      assert.equal(tokenCalls, 1);
    });

    await step("a token endpoint that refuses the assertion: 502 GOOGLE_API_ERROR", async () => {
      const stranger = await createTenantWithKey(service);
      // A service account the simulator does not know: Google answers invalid_grant.
      await withStorebCredentials(service, stranger.tenantId, await createServiceAccount(), dir);
      const { result: answer, apiCalls, tokenCalls } = await counting(() =>
        verify(service, stranger.key, subscriptionRequest(known))
      );
      assertGoogleApiError(answer, 400, "invalid_grant");
      assert.equal(tokenCalls, 1);
      assert.equal(apiCalls, 0);
    });

    await step("a cold cache: concurrent verifies share one token request", async () => {
      const fresh = await createTenantWithKey(service);
      const freshAccount = await createServiceAccount();
      await play.addServiceAccount(freshAccount);
      await withStorebCredentials(service, fresh.tenantId, freshAccount, dir);
      play.script({ endpoint: "token", delayMs: 300 });
      const { result, tokenCalls } = await counting(() =>
        Promise.all(
          Array.from({ length: 6 }, () => verify(service, fresh.key, subscriptionRequest(known))),
        )
      );
      for (const answer of result) assert.equal(answer.status, 200);
      assert.equal(tokenCalls, 1);
    });

    await step("request validation and missing credentials come first", async () => {
      const { result: bad, apiCalls } = await counting(() =>
        verify(service, key, { ...subscriptionRequest(known), type: "refund" })
      );
      assert.equal(bad.status, 400);
      assert.equal(bad.body.error, "INVALID_REQUEST");
      assert.equal(apiCalls, 0);
      const bare = await createTenantWithKey(service);
      const missing = await verify(service, bare.key, subscriptionRequest(known));
      assert.equal(missing.status, 400);
      assert.equal(missing.body.error, "CREDENTIALS_MISSING");
    });

    await step("an upstream slower than UPSTREAM_TIMEOUT: 502 in bounded time", async () => {
      play.script({ delayMs: 15_000 });
      const started = performance.now();
      const answer = await verify(service, key, subscriptionRequest(known));
      const elapsed = performance.now() - started;
      assertGoogleApiError(answer, null, null);
      assert.ok(elapsed >= 2_500 && elapsed < 5_000, `answered after ${elapsed} ms`);
    });

    await step("the audit records every outcome, the token only as a keyed hash", async () => {
      const sql = databaseOf(service);
      try {
        let outcomes = new Set<string>();
        for (let i = 0; i < 50 && !outcomes.has("GOOGLE_API_ERROR:null"); i++) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          const rows = await sql`
            SELECT outcome, upstream_status FROM validation_audit
            WHERE tenant_id = ${tenantId} AND store = 'storeb'`;
          outcomes = new Set(rows.map((row) => `${row.outcome}:${row.upstream_status}`));
        }
        for (
          const expected of [
            "valid:200",
            "PURCHASE_NOT_FOUND:404",
            "PURCHASE_NOT_FOUND:410",
            "PACKAGE_NAME_MISMATCH:null",
            "RATE_LIMITED:429",
            "GOOGLE_API_ERROR:500",
            "GOOGLE_API_ERROR:null",
          ]
        ) assert.ok(outcomes.has(expected), `${expected} in ${[...outcomes]}`);
        const dump = JSON.stringify(await sql`SELECT * FROM validation_audit`);
        for (const used of tokensUsed) assert.ok(!dump.includes(used), "a token stored in clear");
      } finally {
        await sql.end();
      }
    });

    await step("no purchase token, access token or key material in the logs", async () => {
      await new Promise((r) => setTimeout(r, 100)); // the logger flushes at the end of a tick
      const raw = service.rawStdout();
      assert.ok(raw.includes("GOOGLE_API_ERROR"), "the error lines were written");
      assert.ok(play.issuedAccessTokens.length >= 3);
      for (const secret of [...tokensUsed, ...play.issuedAccessTokens]) {
        assert.ok(!raw.includes(secret), "a token is in the logs");
        assert.ok(!raw.includes(encodeURIComponent(secret)), "an encoded token is in the logs");
      }
      assert.ok(!raw.includes("PRIVATE KEY"));
      assert.ok(!raw.includes(account.privateKeyPem.split("\n")[1]));
    });
  } finally {
    await stopAndDrop(service);
    await play.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("storeb verify: an unreachable API is 502, and its URL stays out of the logs", async () => {
  const play = await startStorebSimulator();
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const closedPort = listener.addr.port;
  listener.close();
  const service = await startService({
    env: { STOREB_API_URL: `http://127.0.0.1:${closedPort}`, STOREB_TOKEN_URL: play.tokenUrl },
  });
  const dir = await Deno.makeTempDir({ prefix: "pr-storeb-" });
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const { key, tenantId } = await createTenantWithKey(service);
    await withStorebCredentials(service, tenantId, account, dir);
    const purchaseToken = newToken();
    assertGoogleApiError(
      await verify(service, key, subscriptionRequest(purchaseToken)),
      null,
      null,
    );
    const failed = await service.waitForLog((line) => line.msg === "request_failed");
    assert.equal(failed.code, "GOOGLE_API_ERROR");
    assert.match(failed.errorMessage, /refused/i, "the reason is logged");
    const raw = service.rawStdout();
    assert.ok(!raw.includes(purchaseToken), "the purchase token is in the logs");
    for (const accessToken of play.issuedAccessTokens) assert.ok(!raw.includes(accessToken));
  } finally {
    await stopAndDrop(service);
    await play.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("storeb verifier: the deadline covers retries and token requests", async () => {
  const play = await startStorebSimulator();
  try {
    const verifier = new StorebVerifier({
      apiUrl: play.apiUrl,
      tokenUrl: play.tokenUrl,
      timeoutMs: 600,
    });
    const credentialsOf = async (): Promise<StorebCredentials> => {
      const account = await createServiceAccount();
      await play.addServiceAccount(account);
      return {
        packageName: PACKAGE,
        clientEmail: account.clientEmail,
        serviceAccountJson: account.json,
        pushAudience: "https://relay.example.com/push",
        pushServiceAccount: null,
      };
    };
    play.addSubscription({
      packageName: PACKAGE,
      purchaseToken: "t",
      purchase: sampleSubscriptionPurchase(),
    });
    const request = {
      packageName: PACKAGE,
      productId: "monthly",
      purchaseToken: "t",
      type: "subscription" as const,
    };
    const timedOut = (e: unknown) =>
      e instanceof ServiceError && e.code === "GOOGLE_API_ERROR" &&
      e.details?.status === null && /store B API did not answer within 600 ms/.test(e.message);

    const warm = await credentialsOf();
    assert.equal((await verifier.verify(warm, request)).valid, true);
    // A 503, then a retry that is too slow: the deadline is the whole call's.
    play.script({ status: 503 });
    play.script({ delayMs: 3_000 });
    let started = performance.now();
    await assert.rejects(verifier.verify(warm, request), timedOut);
    assert.ok(performance.now() - started < 2_000);
    assert.equal(play.apiRequests, 3);

    // A slow token endpoint counts against the same deadline.
    const cold = await credentialsOf();
    play.script({ endpoint: "token", delayMs: 3_000 });
    started = performance.now();
    await assert.rejects(verifier.verify(cold, request), timedOut);
    assert.ok(performance.now() - started < 2_000);
    assert.equal(play.apiRequests, 3, "no API call without a token");

    const outcome = await verifier.verify(warm, request);
    assert.equal(outcome.valid, true);
    assert.equal(outcome.upstreamStatus, 200);
  } finally {
    await play.close();
  }
});
