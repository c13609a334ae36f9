/**
 * `POST /v1/storeb/acknowledge`, `POST /v1/storeb/consume` and verify's `acknowledge: true` end to
 * end: a real service process talks over loopback HTTP to the store B simulator running in this
 * test process, which records every call, so each step can say how many reads and writes reached
 * the store.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  createTenantWithKey,
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
  type StorebSimulator,
} from "../simulators/storeb_play.ts";

const PACKAGE = "com.example.app"; // the package storebCredentialArgs configures
const UNACKNOWLEDGED = "ACKNOWLEDGEMENT_STATE_PENDING";
const ACKNOWLEDGED = "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED";

interface Answer {
  status: number;
  headers: Headers;
  // deno-lint-ignore no-explicit-any
  body: any;
}

async function call(
  service: RunningService,
  key: string,
  path: string,
  body: unknown,
): Promise<Answer> {
  const response = await fetch(`${service.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

function subscriptionBody(purchaseToken: string, productId = "premium_monthly") {
  return { packageName: PACKAGE, productId, purchaseToken, type: "subscription" };
}

function productBody(purchaseToken: string, productId = "coins_100") {
  return { packageName: PACKAGE, productId, purchaseToken, type: "product" };
}

function consumeBody(purchaseToken: string, productId = "coins_100") {
  return { packageName: PACKAGE, productId, purchaseToken };
}

/** Reads and writes the simulator received about one purchase token, on one line. */
function callsSummary(play: StorebSimulator, purchaseToken: string): string {
  const { reads, acknowledges, consumes, all } = callsAbout(play, purchaseToken);
  return `reads ${reads}, acknowledges ${acknowledges}, consumes ${consumes}, all ${all}`;
}

/** Reads and writes the simulator received about one purchase token. */
function callsAbout(play: StorebSimulator, purchaseToken: string) {
  return {
    reads: play.calls({ operation: "get", purchaseToken }).length,
    acknowledges: play.calls({ operation: "acknowledge", purchaseToken }).length,
    consumes: play.calls({ operation: "consume", purchaseToken }).length,
    all: play.calls({ purchaseToken }).length,
  };
}

function assertGoogleApiError(answer: Answer, status: number | null, upstreamCode: string | null) {
  assert.equal(answer.status, 502, JSON.stringify(answer.body));
  assert.equal(answer.body.valid, false);
  assert.equal(answer.body.error, "GOOGLE_API_ERROR");
  assert.equal(typeof answer.body.message, "string");
  assert.deepEqual(answer.body.details, { status, upstreamCode });
}

function assertDomainFailure(answer: Answer, version: string, error: string) {
  assert.equal(answer.status, 200, JSON.stringify(answer.body));
  assert.deepEqual(Object.keys(answer.body).sort(), ["error", "message", "valid", "version"]);
  assert.equal(answer.body.valid, false);
  assert.equal(answer.body.version, version);
  assert.equal(answer.body.error, error);
  assert.equal(typeof answer.body.message, "string");
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

async function sha256Prefix(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return new Uint8Array(digest).toHex().slice(0, 12);
}

Deno.test("storeb actions: acknowledge, consume and verify+acknowledge through a real service", async (t) => {
  const play = await startStorebSimulator();
  const service = await startService({
    env: { ...play.serviceEnv, RATE_LIMIT_BURST: "1000", UPSTREAM_TIMEOUT: "1s" },
  });
  const dir = await Deno.makeTempDir({ prefix: "pr-storeb-actions-" });
  const tokensUsed: string[] = [];
  const token = () => {
    const value = `ptok-${crypto.randomUUID()}`;
    tokensUsed.push(value);
    return value;
  };
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const { key, keyId, tenantId } = await createTenantWithKey(service);
    await withStorebCredentials(service, tenantId, account, dir);
    const version = (await fetch(`${service.url}/health`).then((r) => r.json())).version;
    const acknowledge = (body: unknown) => call(service, key, "/v1/storeb/acknowledge", body);
    const consume = (body: unknown) => call(service, key, "/v1/storeb/consume", body);
    const verify = (body: unknown) => call(service, key, "/v1/storeb/verify", body);
    const subscription = (overrides = {}) => {
      const purchaseToken = token();
      play.addSubscription({
        packageName: PACKAGE,
        purchaseToken,
        purchase: sampleSubscriptionPurchase({
          acknowledgementState: UNACKNOWLEDGED,
          ...overrides,
        }),
      });
      return purchaseToken;
    };
    const product = (overrides = {}) => {
      const purchaseToken = token();
      play.addProduct({
        packageName: PACKAGE,
        productId: "coins_100",
        purchaseToken,
        purchase: sampleProductPurchase({ acknowledgementState: 0, ...overrides }),
      });
      return purchaseToken;
    };
    const ackStateOf = (purchaseToken: string) =>
      play.subscription(PACKAGE, purchaseToken)?.acknowledgementState ??
        play.product(PACKAGE, "coins_100", purchaseToken)?.acknowledgementState;
    const step = (name: string, run: () => Promise<void>) =>
      t.step(name, async () => {
        play.clearScripts();
        await run();
      });

    await step("acknowledge a subscription: one read, one write", async () => {
      const purchaseToken = subscription();
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        acknowledged: true,
        alreadyAcknowledged: false,
      });
      assert.equal(ackStateOf(purchaseToken), ACKNOWLEDGED);
      assert.equal(callsSummary(play, purchaseToken), "reads 1, acknowledges 1, consumes 0, all 2");
      const [read, write] = play.calls({ purchaseToken });
      assert.match(read.pathname, /\/purchases\/subscriptionsv2\/tokens\/[^/]+$/);
      assert.equal(write.method, "POST");
      assert.match(
        write.pathname,
        new RegExp(
          `/applications/${PACKAGE}/purchases/subscriptions/premium_monthly/tokens/` +
            `${purchaseToken}:acknowledge$`,
        ),
      );
    });

    await step("acknowledge twice: the second is alreadyAcknowledged, with no write", async () => {
      const purchaseToken = subscription();
      assert.equal((await acknowledge(subscriptionBody(purchaseToken))).status, 200);
      const again = await acknowledge(subscriptionBody(purchaseToken));
      assert.deepEqual(again.body, {
        valid: true,
        version,
        acknowledged: true,
        alreadyAcknowledged: true,
      });
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 1, consumes 0, all 3");
    });

    await step("acknowledge a product; one acknowledged before is not written", async () => {
      const purchaseToken = product();
      const answer = await acknowledge(productBody(purchaseToken));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        acknowledged: true,
        alreadyAcknowledged: false,
      });
      assert.equal(ackStateOf(purchaseToken), 1);
      const [, write] = play.calls({ purchaseToken });
      assert.match(write.pathname, /\/purchases\/products\/coins_100\/tokens\/[^/]+:acknowledge$/);
      const before = product({ acknowledgementState: 1 });
      const already = await acknowledge(productBody(before));
      assert.equal(already.body.alreadyAcknowledged, true);
      assert.equal(callsAbout(play, before).acknowledges, 0);
      // Consuming acknowledges: a consumed product is not acknowledged again.
      const consumed = product({ consumptionState: 1 });
      assert.equal((await acknowledge(productBody(consumed))).body.alreadyAcknowledged, true);
      assert.equal(callsAbout(play, consumed).acknowledges, 0);
    });

    await step("odd characters in ids travel percent-encoded, `:` included", async () => {
      const purchaseToken = `${token()}:consume/a b?c#d%2F..é`;
      play.addProduct({
        packageName: PACKAGE,
        productId: "pack:of 10",
        purchaseToken,
        purchase: sampleProductPurchase({ acknowledgementState: 0 }),
      });
      const answer = await consume(consumeBody(purchaseToken, "pack:of 10"));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(answer.body.consumed, true);
      assert.equal(play.product(PACKAGE, "pack:of 10", purchaseToken)?.consumptionState, 1);
      assert.equal(callsAbout(play, purchaseToken).consumes, 1);
    });

    await step("consume an unacknowledged product: consumed and acknowledged", async () => {
      const purchaseToken = product();
      const answer = await consume(consumeBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        consumed: true,
        alreadyConsumed: false,
      });
      const held = play.product(PACKAGE, "coins_100", purchaseToken);
      assert.equal(held?.consumptionState, 1);
      assert.equal(held?.acknowledgementState, 1);
      const again = await consume(consumeBody(purchaseToken));
      assert.deepEqual(again.body, { valid: true, version, consumed: true, alreadyConsumed: true });
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 0, consumes 1, all 3");
      const write = play.calls({ operation: "consume", purchaseToken })[0];
      assert.match(write.pathname, /\/purchases\/products\/coins_100\/tokens\/[^/]+:consume$/);
    });

    await step("a pending purchase: PURCHASE_PENDING, and no write", async () => {
      const pendingSubscription = subscription({ subscriptionState: "SUBSCRIPTION_STATE_PENDING" });
      const pendingProduct = product({ purchaseState: 2 });
      assertDomainFailure(
        await acknowledge(subscriptionBody(pendingSubscription)),
        version,
        "PURCHASE_PENDING",
      );
      assertDomainFailure(
        await acknowledge(productBody(pendingProduct)),
        version,
        "PURCHASE_PENDING",
      );
      const consumed = await consume(consumeBody(pendingProduct));
      assertDomainFailure(consumed, version, "PURCHASE_PENDING");
      assert.match(consumed.body.message, /pending/);
      assert.equal(
        callsSummary(play, pendingSubscription),
        "reads 1, acknowledges 0, consumes 0, all 1",
      );
      assert.equal(
        callsSummary(play, pendingProduct),
        "reads 2, acknowledges 0, consumes 0, all 2",
      );
    });

    await step("404 and 410: PURCHASE_NOT_FOUND, and no write", async () => {
      const missing = token();
      const never = await acknowledge(subscriptionBody(missing));
      assertDomainFailure(never, version, "PURCHASE_NOT_FOUND");
      assert.match(never.body.message, /never existed/);
      assertDomainFailure(await consume(consumeBody(missing)), version, "PURCHASE_NOT_FOUND");
      const gone = product();
      play.script({ operation: "get", status: 410, purchaseToken: gone, times: 2 });
      const goneAnswer = await consume(consumeBody(gone));
      assertDomainFailure(goneAnswer, version, "PURCHASE_NOT_FOUND");
      assert.match(goneAnswer.body.message, /no longer valid/);
      assertDomainFailure(await acknowledge(productBody(gone)), version, "PURCHASE_NOT_FOUND");
      assert.equal(callsAbout(play, missing).all, 2);
      assert.equal(callsAbout(play, gone).all, 2);
      // A 404 on the write itself (the purchase went away after the read) is the same failure.
      const vanishing = product();
      play.script({ operation: "acknowledge", status: 404, purchaseToken: vanishing });
      assertDomainFailure(
        await acknowledge(productBody(vanishing)),
        version,
        "PURCHASE_NOT_FOUND",
      );
      assert.equal(callsAbout(play, vanishing).acknowledges, 1);
    });

    await step("PACKAGE_NAME_MISMATCH: no call reaches the store", async () => {
      const purchaseToken = product();
      const tokensBefore = play.tokenRequests;
      const other = { packageName: "com.other.app" };
      assertDomainFailure(
        await acknowledge({ ...productBody(purchaseToken), ...other }),
        version,
        "PACKAGE_NAME_MISMATCH",
      );
      assertDomainFailure(
        await consume({ ...consumeBody(purchaseToken), ...other }),
        version,
        "PACKAGE_NAME_MISMATCH",
      );
      assert.equal(callsAbout(play, purchaseToken).all, 0);
      assert.equal(play.tokenRequests, tokensBefore);
    });

    await step("upstream 429 on the read, with and without Retry-After: no write", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "get", status: 429, headers: { "retry-after": "17" } });
      const hinted = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(hinted.status, 429);
      assert.equal(hinted.body.error, "RATE_LIMITED");
      assert.deepEqual(hinted.body.details, { retryAfterSeconds: 17 });
      assert.equal(hinted.headers.get("retry-after"), "17");
      const consumable = product();
      play.script({ operation: "get", status: 429 });
      const bare = await consume(consumeBody(consumable));
      assert.equal(bare.status, 429);
      assert.deepEqual(bare.body.details, { retryAfterSeconds: 60 });
      assert.equal(bare.headers.get("retry-after"), "60");
      assert.equal(callsAbout(play, purchaseToken).all, 1, "a 429 is not retried");
      assert.equal(callsAbout(play, consumable).all, 1);
    });

    await step("upstream 429 on the write: RATE_LIMITED, not retried", async () => {
      const purchaseToken = product();
      play.script({ operation: "consume", status: 429, headers: { "retry-after": "5" } });
      const answer = await consume(consumeBody(purchaseToken));
      assert.equal(answer.status, 429);
      assert.deepEqual(answer.body.details, { retryAfterSeconds: 5 });
      assert.equal(callsSummary(play, purchaseToken), "reads 1, acknowledges 0, consumes 1, all 2");
      assert.equal(play.product(PACKAGE, "coins_100", purchaseToken)?.consumptionState, 0);
    });

    await step("a 500 on the write, then success: read, then one more write", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "acknowledge", status: 500 });
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(answer.body.alreadyAcknowledged, false);
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 2, consumes 0, all 4");
      assert.equal(ackStateOf(purchaseToken), ACKNOWLEDGED);
    });

    await step("a 5xx that took effect: the read says done, no second write", async () => {
      const purchaseToken = product();
      play.script({ operation: "consume", status: 503, applyWrite: true });
      const answer = await consume(consumeBody(purchaseToken));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        consumed: true,
        alreadyConsumed: false,
      });
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 0, consumes 1, all 3");
    });

    await step("a 5xx on every write: 502 after exactly one retry", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "acknowledge", status: 503, times: 5 });
      assertGoogleApiError(await acknowledge(subscriptionBody(purchaseToken)), 503, "UNAVAILABLE");
      assert.equal(callsSummary(play, purchaseToken), "reads 3, acknowledges 2, consumes 0, all 5");
      assert.equal(ackStateOf(purchaseToken), UNACKNOWLEDGED);
    });

    await step("a dropped connection after the write took effect: no second write", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "acknowledge", reset: true, applyWrite: true });
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(answer.body.alreadyAcknowledged, false);
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 1, consumes 0, all 3");
    });

    await step(
      "a dropped connection before the write took effect: read, then one retry",
      async () => {
        const purchaseToken = product();
        play.script({ operation: "consume", reset: true });
        const answer = await consume(consumeBody(purchaseToken));
        assert.equal(answer.status, 200, JSON.stringify(answer.body));
        assert.equal(
          callsSummary(play, purchaseToken),
          "reads 2, acknowledges 0, consumes 2, all 4",
        );
        assert.equal(play.product(PACKAGE, "coins_100", purchaseToken)?.consumptionState, 1);
      },
    );

    await step("a write that times out but took effect: the read says done", async () => {
      const purchaseToken = product();
      play.script({ operation: "consume", delayMs: 2_500, applyWrite: true });
      const started = performance.now();
      const answer = await consume(consumeBody(purchaseToken));
      const elapsed = performance.now() - started;
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(answer.body.alreadyConsumed, false);
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 0, consumes 1, all 3");
      assert.ok(elapsed >= 900 && elapsed < 2_400, `answered after ${elapsed} ms`);
    });

    await step("a write that times out before taking effect: retried once", async () => {
      const purchaseToken = subscription();
      // The first write is carried out only after its caller gave up: the read in between sees
      // no acknowledgement, so the write is sent once more.
      play.script({ operation: "acknowledge", delayMs: 1_500 });
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 2, consumes 0, all 4");
    });

    await step("writes that never answer: 502 within three times UPSTREAM_TIMEOUT", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "acknowledge", delayMs: 10_000, times: 2 });
      const started = performance.now();
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      const elapsed = performance.now() - started;
      assertGoogleApiError(answer, null, null);
      assert.ok(elapsed < 3_500, `answered after ${elapsed} ms`);
      assert.equal(callsAbout(play, purchaseToken).acknowledges, 2);
    });

    await step("a refusal of the write: 502 with Google's code, not retried", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "acknowledge", status: 403 });
      assertGoogleApiError(
        await acknowledge(subscriptionBody(purchaseToken)),
        403,
        "PERMISSION_DENIED",
      );
      assert.equal(callsSummary(play, purchaseToken), "reads 1, acknowledges 1, consumes 0, all 2");
    });

    await step("a 400 because it was done meanwhile: alreadyAcknowledged; else 502", async () => {
      const raced = product();
      // The app acknowledged it between the read and the write; Google refuses the write.
      play.script({ operation: "acknowledge", status: 400, applyWrite: true });
      const answer = await acknowledge(productBody(raced));
      assert.deepEqual(answer.body, {
        valid: true,
        version,
        acknowledged: true,
        alreadyAcknowledged: true,
      });
      assert.deepEqual(callsAbout(play, raced), { reads: 2, acknowledges: 1, consumes: 0, all: 3 });
      const refused = product();
      play.script({ operation: "acknowledge", status: 400 });
      assertGoogleApiError(await acknowledge(productBody(refused)), 400, "INVALID_ARGUMENT");
      assert.equal(callsAbout(play, refused).acknowledges, 1);
    });

    await step("a 401 on the write: one retry with a fresh token", async () => {
      const purchaseToken = subscription();
      const tokensBefore = play.tokenRequests;
      play.script({ operation: "acknowledge", status: 401 });
      const answer = await acknowledge(subscriptionBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(play.tokenRequests - tokensBefore, 1);
      assert.equal(callsAbout(play, purchaseToken).acknowledges, 2);
      const stubborn = subscription();
      play.script({ operation: "acknowledge", status: 401, times: 3 });
      assertGoogleApiError(
        await acknowledge(subscriptionBody(stubborn)),
        401,
        "UNAUTHENTICATED",
      );
      assert.equal(callsAbout(play, stubborn).acknowledges, 2, "only one refresh");
    });

    await step("a 401 on the read: one fresh token, as verify does", async () => {
      const purchaseToken = product();
      play.revokeAccessTokens();
      const tokensBefore = play.tokenRequests;
      const answer = await consume(consumeBody(purchaseToken));
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.equal(play.tokenRequests - tokensBefore, 1);
      assert.equal(callsSummary(play, purchaseToken), "reads 2, acknowledges 0, consumes 1, all 3");
    });

    await step("identical requests in flight share one read and one write", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "get", delayMs: 300, purchaseToken });
      const answers = await Promise.all(
        Array.from({ length: 5 }, () => acknowledge(subscriptionBody(purchaseToken))),
      );
      for (const answer of answers) {
        assert.deepEqual(answer.body, {
          valid: true,
          version,
          acknowledged: true,
          alreadyAcknowledged: false,
        });
      }
      assert.equal(callsSummary(play, purchaseToken), "reads 1, acknowledges 1, consumes 0, all 2");
      const consumable = product();
      play.script({ operation: "get", delayMs: 300, purchaseToken: consumable });
      const consumed = await Promise.all(
        Array.from({ length: 5 }, () => consume(consumeBody(consumable))),
      );
      for (const answer of consumed) assert.equal(answer.body.consumed, true);
      assert.equal(callsAbout(play, consumable).consumes, 1);
    });

    await step("verify acknowledge:true on a paid purchase: acknowledged in the call", async () => {
      const purchaseToken = subscription();
      const answer = await verify({ ...subscriptionBody(purchaseToken), acknowledge: true });
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.deepEqual(
        Object.keys(answer.body),
        ["valid", "version", "appUserId", "purchase", "acknowledged"],
      );
      assert.equal(answer.body.valid, true);
      assert.equal(answer.body.acknowledged, true);
      assert.equal(answer.body.purchase.acknowledgementState, 1);
      assert.equal(answer.body.purchase.rawResponse.acknowledgementState, UNACKNOWLEDGED);
      assert.equal(ackStateOf(purchaseToken), ACKNOWLEDGED);
      assert.equal(callsSummary(play, purchaseToken), "reads 1, acknowledges 1, consumes 0, all 2");
      const paidProduct = product();
      const productAnswer = await verify({ ...productBody(paidProduct), acknowledge: true });
      assert.equal(productAnswer.body.acknowledged, true);
      assert.equal(productAnswer.body.purchase.acknowledgementState, 1);
      assert.equal(ackStateOf(paidProduct), 1);
      // In grace period is paid too.
      const grace = subscription({ subscriptionState: "SUBSCRIPTION_STATE_IN_GRACE_PERIOD" });
      assert.equal(
        (await verify({ ...subscriptionBody(grace), acknowledge: true })).body
          .acknowledged,
        true,
      );
      assert.equal(callsAbout(play, grace).acknowledges, 1);
      // Canceled but still within its paid period: paid, or Google refunds it after 3 days.
      const canceled = subscription({ subscriptionState: "SUBSCRIPTION_STATE_CANCELED" });
      assert.equal(
        (await verify({ ...subscriptionBody(canceled), acknowledge: true })).body.acknowledged,
        true,
      );
      assert.equal(callsAbout(play, canceled).acknowledges, 1);
    });

    await step("verify acknowledge:true on an acknowledged purchase: no write", async () => {
      const purchaseToken = subscription({ acknowledgementState: ACKNOWLEDGED });
      const answer = await verify({ ...subscriptionBody(purchaseToken), acknowledge: true });
      assert.equal(answer.body.acknowledged, true);
      assert.equal(answer.body.purchase.acknowledgementState, 1);
      assert.equal(answer.body.acknowledgeError, undefined);
      assert.equal(callsAbout(play, purchaseToken).all, 1);
    });

    await step(
      "verify acknowledge:true on an unpaid purchase: false, no error, no write",
      async () => {
        for (
          const purchaseToken of [
            subscription({ subscriptionState: "SUBSCRIPTION_STATE_PENDING" }),
            subscription({ subscriptionState: "SUBSCRIPTION_STATE_EXPIRED" }),
          ]
        ) {
          const answer = await verify({ ...subscriptionBody(purchaseToken), acknowledge: true });
          assert.equal(answer.status, 200);
          assert.deepEqual(
            Object.keys(answer.body),
            ["valid", "version", "appUserId", "purchase", "acknowledged"],
          );
          assert.equal(answer.body.acknowledged, false);
          assert.equal(answer.body.purchase.acknowledgementState, 0);
          assert.equal(callsAbout(play, purchaseToken).acknowledges, 0);
        }
        for (const purchaseState of [2, 1]) {
          const purchaseToken = product({ purchaseState });
          const answer = await verify({ ...productBody(purchaseToken), acknowledge: true });
          assert.equal(answer.body.acknowledged, false);
          assert.equal(answer.body.acknowledgeError, undefined);
          assert.equal(callsAbout(play, purchaseToken).acknowledges, 0);
        }
      },
    );

    await step(
      "verify acknowledge:true whose acknowledgement fails: acknowledgeError",
      async () => {
        const purchaseToken = subscription();
        play.script({ operation: "acknowledge", status: 503, times: 5 });
        const answer = await verify({ ...subscriptionBody(purchaseToken), acknowledge: true });
        assert.equal(answer.status, 200, JSON.stringify(answer.body));
        assert.equal(answer.body.valid, true);
        assert.equal(answer.body.acknowledged, false);
        assert.equal(answer.body.purchase.acknowledgementState, 0);
        assert.deepEqual(Object.keys(answer.body.acknowledgeError).sort(), ["error", "message"]);
        assert.equal(answer.body.acknowledgeError.error, "GOOGLE_API_ERROR");
        assert.equal(callsAbout(play, purchaseToken).acknowledges, 2);
        play.clearScripts();
        const limited = product();
        play.script({ operation: "acknowledge", status: 429 });
        const limitedAnswer = await verify({ ...productBody(limited), acknowledge: true });
        assert.equal(limitedAnswer.status, 200);
        assert.equal(limitedAnswer.body.acknowledged, false);
        assert.equal(limitedAnswer.body.acknowledgeError.error, "RATE_LIMITED");
      },
    );

    await step("verify without acknowledge: the answer and the calls of before", async () => {
      for (const acknowledgeField of [{}, { acknowledge: false }]) {
        const purchaseToken = subscription();
        const answer = await verify({ ...subscriptionBody(purchaseToken), ...acknowledgeField });
        assert.equal(answer.status, 200);
        assert.deepEqual(Object.keys(answer.body), ["valid", "version", "appUserId", "purchase"]);
        assert.equal(answer.body.purchase.acknowledgementState, 0);
        assert.equal(
          callsSummary(play, purchaseToken),
          "reads 1, acknowledges 0, consumes 0, all 1",
        );
      }
      const notFound = await verify({ ...subscriptionBody(token()), acknowledge: true });
      assertDomainFailure(notFound, version, "PURCHASE_NOT_FOUND");
      const bad = await verify({ ...subscriptionBody(token()), acknowledge: "yes" });
      assert.equal(bad.status, 400);
      assert.equal(bad.body.error, "INVALID_REQUEST");
    });

    await step("verify with and without acknowledge in flight together: not folded", async () => {
      const purchaseToken = subscription();
      play.script({ operation: "get", delayMs: 300, purchaseToken, times: 2 });
      const [plain, acknowledging] = await Promise.all([
        verify(subscriptionBody(purchaseToken)),
        verify({ ...subscriptionBody(purchaseToken), acknowledge: true }),
      ]);
      assert.equal(plain.body.acknowledged, undefined);
      assert.equal(acknowledging.body.acknowledged, true);
      assert.equal(callsAbout(play, purchaseToken).reads, 2);
    });

    await step("store_action lines name the action with a short token digest", async () => {
      await new Promise((r) => setTimeout(r, 100)); // the logger flushes at the end of a tick
      const actions = service.logs.filter((line) => line.msg === "store_action");
      const outcomes = new Set(actions.map((line) => `${line.action}:${line.outcome}`));
      for (
        const expected of [
          "acknowledge:acknowledged",
          "acknowledge:already_acknowledged",
          "acknowledge:not_paid",
          "acknowledge:PURCHASE_PENDING",
          "acknowledge:PURCHASE_NOT_FOUND",
          "acknowledge:PACKAGE_NAME_MISMATCH",
          "acknowledge:RATE_LIMITED",
          "acknowledge:GOOGLE_API_ERROR",
          "consume:consumed",
          "consume:already_consumed",
          "consume:PURCHASE_PENDING",
          "consume:RATE_LIMITED",
        ]
      ) assert.ok(outcomes.has(expected), `${expected} in ${[...outcomes]}`);
      // The first step acknowledged the first token.
      const digest = await sha256Prefix(tokensUsed[0]);
      const line = actions.find((l) => l.purchaseTokenSha256 === digest)!;
      assert.equal(line.outcome, "acknowledged");
      assert.equal(line.action, "acknowledge");
      assert.equal(line.level, "info");
      assert.equal(line.tenantId, tenantId);
      assert.equal(line.keyId, keyId);
      assert.equal(line.store, "storeb");
      assert.equal(line.productId, "premium_monthly");
      assert.match(line.purchaseTokenSha256, /^[0-9a-f]{12}$/);
      assert.equal(line.purchaseToken, undefined);
    });

    await step("no purchase token, access token or key material in the logs", () => {
      const raw = service.rawStdout();
      assert.ok(raw.includes("store_action"));
      assert.ok(play.issuedAccessTokens.length >= 2);
      for (const secret of [...tokensUsed, ...play.issuedAccessTokens]) {
        assert.ok(!raw.includes(secret), "a token is in the logs");
        assert.ok(!raw.includes(encodeURIComponent(secret)), "an encoded token is in the logs");
      }
      assert.ok(!raw.includes("PRIVATE KEY"));
      assert.ok(!raw.includes(account.privateKeyPem.split("\n")[1]));
      return Promise.resolve();
    });
  } finally {
    await stopAndDrop(service);
    await play.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("storeb actions: the order of checks, and the rate limit shared with verify", async () => {
  const play = await startStorebSimulator();
  const service = await startService({
    env: { ...play.serviceEnv, RATE_LIMIT_BURST: "4", RATE_LIMIT_PER_SECOND: "0.01" },
  });
  const dir = await Deno.makeTempDir({ prefix: "pr-storeb-actions-" });
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const version = (await fetch(`${service.url}/health`).then((r) => r.json())).version;
    const purchaseToken = `ptok-${crypto.randomUUID()}`;
    play.addProduct({
      packageName: PACKAGE,
      productId: "coins_100",
      purchaseToken,
      purchase: sampleProductPurchase({ acknowledgementState: 0 }),
    });
    const paths = ["/v1/storeb/acknowledge", "/v1/storeb/consume"];
    const good = {
      "/v1/storeb/acknowledge": productBody(purchaseToken),
      "/v1/storeb/consume": consumeBody(purchaseToken),
    } as Record<string, unknown>;
    const configured = async () => {
      const tenant = await createTenantWithKey(service);
      await withStorebCredentials(service, tenant.tenantId, account, dir);
      return tenant;
    };

    // 401 before everything: a bad key with a bad body.
    for (const path of paths) {
      const answer = await call(service, "service_test_nope", path, "{not json");
      assert.equal(answer.status, 401);
      assert.equal(answer.body.error, "UNAUTHENTICATED");
    }

    // The bucket is verify's: four verifies spend it, then both actions are 429, bad body or not.
    const spender = await configured();
    for (let i = 0; i < 4; i++) {
      const answer = await call(
        service,
        spender.key,
        "/v1/storeb/verify",
        productBody(purchaseToken),
      );
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
    }
    for (const path of paths) {
      for (const body of [good[path], "{not json"]) {
        const limited = await call(service, spender.key, path, body);
        assert.equal(limited.status, 429, path);
        assert.equal(limited.body.error, "RATE_LIMITED");
        assert.ok(limited.body.details.retryAfterSeconds >= 1);
        assert.equal(
          limited.headers.get("retry-after"),
          String(limited.body.details.retryAfterSeconds),
        );
      }
      // Still 401 for a bad key while the tenant is limited.
      assert.equal((await call(service, "service_test_nope", path, good[path])).status, 401);
    }

    // 400 before CREDENTIALS_MISSING: a tenant without credentials sending bad bodies.
    const bare = await createTenantWithKey(service);
    const invalid = [
      ["/v1/storeb/acknowledge", { ...productBody(purchaseToken), extra: 1 }],
      ["/v1/storeb/consume", { ...consumeBody(purchaseToken), type: "product" }],
      ["/v1/storeb/acknowledge", { ...productBody(purchaseToken), type: "refund" }],
      ["/v1/storeb/consume", { ...consumeBody(purchaseToken), productId: ".." }],
    ] as const;
    for (const [path, body] of invalid) {
      const answer = await call(service, bare.key, path, body);
      assert.equal(answer.status, 400, JSON.stringify(body));
      assert.equal(answer.body.error, "INVALID_REQUEST");
    }
    // CREDENTIALS_MISSING before PACKAGE_NAME_MISMATCH.
    const bareToo = await createTenantWithKey(service);
    for (const path of paths) {
      const answer = await call(service, bareToo.key, path, {
        ...(good[path] as object),
        packageName: "com.other.app",
      });
      assert.equal(answer.status, 400);
      assert.equal(answer.body.error, "CREDENTIALS_MISSING");
    }
    // A body over 16 KB.
    const big = await call(service, bareToo.key, "/v1/storeb/consume", {
      ...consumeBody(purchaseToken),
      purchaseToken: "x".repeat(17_000),
    });
    assert.equal(big.status, 400);
    assert.equal(big.body.error, "INVALID_REQUEST");

    // PACKAGE_NAME_MISMATCH last, with no upstream call.
    const mismatched = await configured();
    for (const path of paths) {
      const answer = await call(service, mismatched.key, path, {
        ...(good[path] as object),
        packageName: "com.other.app",
      });
      assertDomainFailure(answer, version, "PACKAGE_NAME_MISMATCH");
    }
    assert.equal(play.calls({ operation: "acknowledge" }).length, 0);
    assert.equal(play.calls({ operation: "consume" }).length, 0);
    assert.equal(play.calls().length, 4, "only the four verifies reached the store");
  } finally {
    await stopAndDrop(service);
    await play.close();
    await Deno.remove(dir, { recursive: true });
  }
});
