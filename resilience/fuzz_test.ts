/**
 * Property-based fuzzing of every endpoint of a running service: a real process started with
 * `main.ts serve`, real loopback HTTP, and the store simulators behind it, so that fuzzed input
 * reaches deep code: API keys that authenticate, store A JWS signed by a trusted test PKI and then
 * tampered with, push tokens minted by the OIDC issuer with one claim wrong.
 *
 * Every answer must come within {@linkcode ANSWER_BOUND_MS}, never be a 500, carry the common
 * headers, use the error envelope with a documented code for every 4xx and 5xx, and be one of the
 * answers documented for its endpoint; where the docs alone decide the answer (a missing key, a
 * body over the limit, an unknown tenant, a single wrong claim) it must be exactly that. After the
 * runs the service must still be healthy and ready, alive, and have logged no error for fuzzed
 * input. A last property runs with the default rate limit and checks the 429 answers.
 *
 * Reproduce a run with `FUZZ_SEED=<seed printed at the start>`; scale the run counts with
 * `FUZZ_RUNS=<factor>` (default 1).
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import fc from "fast-check";
import {
  createTenantWithKey,
  ENGINE,
  type RunningService,
  startService,
} from "../tests/helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_ISSUER_ID,
  writeServiceAccountFile,
  writeStoreaKeyFile,
} from "../tests/helpers/fixtures.ts";
import { cliOk, createTenantWithCallback } from "../tests/helpers/relay.ts";
import { rawExchange } from "../tests/helpers/raw_http.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startStoreaApiSimulator, type StoreaApiSimulator } from "../simulators/storea_api.ts";
import { createServiceAccount } from "../simulators/service_account.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
} from "../simulators/storeb_play.ts";
import { type PushTokenIssuer, startPushTokenIssuer } from "../simulators/storeb_push.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { ENDPOINTS } from "../src/api/mod.ts";
import * as arb from "./fuzz_arbitraries.ts";

/** How long any answer may take; a request still unanswered then is a failure (a hang). */
const ANSWER_BOUND_MS = 10_000;
const JSON_TYPE = "application/json; charset=utf-8";
const REQUEST_ID = /^req_[0-9A-HJKMNP-TV-Z]{26}$/;
const EVENT_ID = /^evt_[0-9A-HJKMNP-TV-Z]{26}$/;
const BUNDLE_ID = "com.example.app";
const PACKAGE_NAME = "com.example.app";
const APP_ID = 1234567890;
/** The push audience of `storebCredentialArgs`. */
const PUSH_AUDIENCE = "https://relay.example.com/push";
const PUSH_ACCOUNT = "push@fuzz-project.iam.gserviceaccount.com";

/** Every error code of the API and its status (docs/integration.md and docs/operations.md). */
const SPEC_ERRORS: Record<string, number> = {
  UNAUTHENTICATED: 401,
  TENANT_NOT_FOUND: 404,
  CREDENTIALS_MISSING: 400,
  INVALID_REQUEST: 400,
  SIGNATURE_INVALID: 401,
  APPLE_API_ERROR: 502,
  GOOGLE_API_ERROR: 502,
  RATE_LIMITED: 429,
  INTERNAL_ERROR: 500,
};
/**
 * No endpoint answers these; the integration guide documents them for a path no endpoint has and
 * for a method an endpoint does not take. Only such requests may get them.
 */
const ROUTING_ERRORS: Record<string, number> = { NOT_FOUND: 404, METHOD_NOT_ALLOWED: 405 };
const ENVELOPE_KEYS = new Set(["valid", "error", "message", "details"]);
/** The endpoints a tenant's backend calls with its API key. */
const API_KEY_ROUTES: ReadonlySet<arb.RouteName> = new Set(
  ENDPOINTS.filter((e) => e.auth === "api-key").map((e) => e.name),
);

/**
 * What each endpoint may answer with a healthy database and reachable stores: `OK`, `VALID` and
 * `RECEIPT` are the 200 success shapes, `200:<code>` the domain failures (200 with `valid: false`),
 * anything else an error code. 500 `INTERNAL_ERROR` is in no list: it is reserved for failures of
 * the service itself, which fuzzed input must not cause.
 */
const OUTCOMES: Record<arb.RouteName, string[]> = {
  "health": ["OK"],
  "ready": ["OK"],
  "storea-verify": [
    "VALID",
    "200:TRANSACTION_NOT_FOUND",
    "200:BUNDLE_ID_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "APPLE_API_ERROR",
  ],
  "storeb-verify": [
    "VALID",
    "200:PURCHASE_NOT_FOUND",
    "200:PACKAGE_NAME_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "GOOGLE_API_ERROR",
  ],
  "storeb-acknowledge": [
    "VALID",
    "200:PURCHASE_NOT_FOUND",
    "200:PURCHASE_PENDING",
    "200:PACKAGE_NAME_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "GOOGLE_API_ERROR",
  ],
  "storeb-consume": [
    "VALID",
    "200:PURCHASE_NOT_FOUND",
    "200:PURCHASE_PENDING",
    "200:PACKAGE_NAME_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "GOOGLE_API_ERROR",
  ],
  "storea-subscriptions": [
    "VALID",
    "200:TRANSACTION_NOT_FOUND",
    "200:BUNDLE_ID_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "APPLE_API_ERROR",
  ],
  "storea-history": [
    "VALID",
    "200:TRANSACTION_NOT_FOUND",
    "200:BUNDLE_ID_MISMATCH",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "APPLE_API_ERROR",
  ],
  "storea-consumption": [
    "VALID",
    "200:TRANSACTION_NOT_FOUND",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "APPLE_API_ERROR",
  ],
  "storea-webhook": [
    "RECEIPT",
    "INVALID_REQUEST",
    "CREDENTIALS_MISSING",
    "SIGNATURE_INVALID",
    "TENANT_NOT_FOUND",
    // A certificate chain never seen, once the budget for those is spent
    // (docs/security.md, "Forged certificate chains").
    "RATE_LIMITED",
  ],
  "storeb-webhook": [
    "RECEIPT",
    "INVALID_REQUEST",
    "UNAUTHENTICATED",
    "SIGNATURE_INVALID",
    "TENANT_NOT_FOUND",
  ],
};

const SEED = Number(Deno.env.get("FUZZ_SEED") ?? Math.floor(Math.random() * 2 ** 31));
const RUNS_FACTOR = Number(Deno.env.get("FUZZ_RUNS") ?? "1");

/** The values an arbitrary generates. */
type Value<A> = A extends fc.Arbitrary<infer T> ? T : never;

/** fast-check parameters: a fixed seed (printed), and `runs` scaled by FUZZ_RUNS. */
function params<T>(runs: number): fc.Parameters<T> {
  return { seed: SEED, numRuns: Math.max(1, Math.round(runs * RUNS_FACTOR)) };
}

/** One request as the fuzzer sends it. */
interface Probe {
  method: string;
  /** Path and query, as given to fetch (which normalizes dot segments). */
  path: string;
  headers: Record<string, string | null>;
  body?: Uint8Array<ArrayBuffer> | null;
  transport?: "fixed" | "stream";
}

/** An answer, whole. */
interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

/** What a request must get. */
interface Expectation {
  /** Where the request lands, as the server sees its method and path. */
  route: arb.RouteOutcome;
  /** The one outcome the documented rules allow for this request, when they decide it alone. */
  exact?: string;
  /** Outcomes ruled out for this request beyond those its endpoint never gives. */
  forbidden?: string[];
  /** A request id the client sent, which the answer must not reuse. */
  sentRequestId?: string;
  /** Whether the method was HEAD (no body comes back). */
  head?: boolean;
}

/** Everything the properties share. */
interface World {
  service: RunningService;
  version: string;
  keys: Record<arb.KeyHolder, string>;
  tenants: Record<arb.TenantName, string>;
  signer: StoreaSigner;
  storeaApi: StoreaApiSimulator;
  issuer: PushTokenIssuer;
  push: arb.PushExpectation;
  /** Transaction ids known to the store A simulator. */
  transactions: { production: string; sandbox: string; otherBundle: string };
  /** Purchases known to the store B simulator. */
  purchases: {
    subscriptionToken: string;
    productToken: string;
    productId: string;
    /** A product bought but not yet acknowledged (until a probe acknowledges it). */
    unacknowledgedToken: string;
    /** A product whose payment is pending: neither acknowledged nor consumed, ever. */
    pendingToken: string;
  };
  /** Outcome and status of every fuzzed request, by request id (for the log check). */
  observed: Map<string, { outcome: string; status: number }>;
  /** How often each endpoint gave each outcome, for the summary. */
  stats: Map<string, number>;
  /** Credentials that must never appear in the logs. */
  secrets: string[];
  /** The service's environment, rate limit aside. */
  env: Record<string, string>;
}

Deno.test(`fuzz: every endpoint of a running service (${ENGINE})`, async (t) => {
  console.log(`fuzz seed ${SEED} (replay with FUZZ_SEED=${SEED}), runs x${RUNS_FACTOR}`);
  const closers: (() => Promise<unknown>)[] = [];
  try {
    const world = await createWorld(closers);
    await fuzzEveryEndpoint(t, world);
    // With the default limit the bucket empties; its 429s must be envelopes too.
    await t.step("default rate limit: bursts get 429 envelopes with Retry-After", async () => {
      const limited = await startService({ db: world.service.db, env: world.env });
      try {
        let seen429 = 0;
        await fc.assert(
          fc.asyncProperty(burstProbe, async (p) => {
            seen429 += await runBurst(world, limited, p);
          }),
          { ...params(4), examples: [[{ size: 400, holder: "main", body: "not-json" }]] },
        );
        assert.ok(seen429 > 0, "no burst was answered 429");
        const ready = await send(limited, { method: "GET", path: "/ready", headers: {} });
        checkAnswer(world, ready, { route: arb.routeOf("GET", "/ready"), exact: "OK" });
        checkLogs(world, limited);
      } finally {
        await limited.stop();
      }
    });
  } finally {
    for (const close of closers.reverse()) await close().catch(() => {});
  }
});

/** Every property against the service with a raised rate limit, then its health and logs. */
async function fuzzEveryEndpoint(t: Deno.TestContext, world: World): Promise<void> {
  const started = performance.now();
  let exited = false;
  world.service.exited.then(() => exited = true);
  try {
    await t.step("routing: unknown paths, wrong methods, odd paths and queries", async () => {
      await fc.assert(fc.asyncProperty(routingProbe, (p) => runRouting(world, p)), params(500));
    });
    await t.step("GET /health and /ready with odd queries and headers", async () => {
      await fc.assert(fc.asyncProperty(healthProbe, (p) => runHealth(world, p)), params(150));
    });
    await t.step("POST /v1/storea/verify", async () => {
      await fc.assert(
        fc.asyncProperty(storeaVerifyProbe, (p) => runStoreaVerify(world, p)),
        params(1000),
      );
    });
    await t.step("POST /v1/storeb/verify", async () => {
      await fc.assert(
        fc.asyncProperty(storebVerifyProbe, (p) => runStorebVerify(world, p)),
        params(1000),
      );
    });
    await t.step("POST /v1/storeb/acknowledge", async () => {
      await fc.assert(
        fc.asyncProperty(storebAcknowledgeProbe, (p) => runStorebAction(world, "acknowledge", p)),
        params(400),
      );
    });
    await t.step("POST /v1/storeb/consume", async () => {
      await fc.assert(
        fc.asyncProperty(storebConsumeProbe, (p) => runStorebAction(world, "consume", p)),
        params(400),
      );
    });
    await t.step("POST /v1/storea/subscriptions", async () => {
      await fc.assert(
        fc.asyncProperty(storeaSubscriptionsProbe, (p) => runStoreaSubscriptions(world, p)),
        params(400),
      );
    });
    await t.step("POST /v1/storea/history", async () => {
      await fc.assert(
        fc.asyncProperty(storeaHistoryProbe, (p) => runStoreaHistory(world, p)),
        params(500),
      );
    });
    await t.step("POST /v1/storea/consumption", async () => {
      await fc.assert(
        fc.asyncProperty(storeaConsumptionProbe, (p) => runStoreaConsumption(world, p)),
        params(500),
      );
    });
    await t.step("POST /v1/webhooks/storea/:tenantId", async () => {
      await fc.assert(
        fc.asyncProperty(storeaWebhookProbe, (p) => runStoreaWebhook(world, p)),
        params(1200),
      );
    });
    await t.step("POST /v1/webhooks/storeb/:tenantId", async () => {
      await fc.assert(
        fc.asyncProperty(storebWebhookProbe, (p) => runStorebWebhook(world, p)),
        params(1200),
      );
    });
    await t.step("the same notification several times at once: one event", async () => {
      await fc.assert(fc.asyncProperty(duplicateProbe, (p) => runDuplicates(world, p)), params(12));
    });
    await t.step("raw HTTP/1.1: unnormalized paths and Content-Length mismatches", async () => {
      await fc.assert(fc.asyncProperty(rawProbe, (p) => runRaw(world, p)), params(400));
    });
    await t.step(
      "afterwards: healthy, ready, alive, no error logged for fuzzed input",
      async () => {
        for (const path of ["/health", "/ready"]) {
          const answer = await send(world.service, { method: "GET", path, headers: {} });
          checkAnswer(world, answer, { route: arb.routeOf("GET", path), exact: "OK" });
        }
        assert.equal(exited, false, "the service process exited during the fuzzing");
        checkLogs(world, world.service);
      },
    );
  } finally {
    console.log(`fuzzing took ${Math.round(performance.now() - started)} ms`);
    printStats(world);
  }
  assert.equal(await world.service.stop(), 0, "the service did not stop cleanly");
}

// ---------------------------------------------------------------------------------------------
// The world: a service, its tenants and the simulators behind it

/** Starts the simulators and the service and sets up the tenants; `closers` undo it all. */
async function createWorld(closers: (() => Promise<unknown>)[]): Promise<World> {
  const dir = await Deno.makeTempDir({ prefix: "pr-fuzz-" });
  closers.push(() => Deno.remove(dir, { recursive: true }));
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const storeaApi = await startStoreaApiSimulator({ signer });
  closers.push(() => storeaApi.close());
  const play = await startStorebSimulator();
  closers.push(() => play.close());
  const issuer = await startPushTokenIssuer();
  closers.push(() => issuer.close());
  const receiver = await startCallbackReceiver();
  closers.push(() => receiver.close());

  const keyFile = await writeStoreaKeyFile(dir);
  await storeaApi.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: BUNDLE_ID,
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  const transactions = {
    production: "2000000000000001",
    sandbox: "2000000000000002",
    otherBundle: "2000000000000003",
  };
  await storeaApi.addTransaction(
    "production",
    signer.sampleTransaction({ transactionId: transactions.production }),
  );
  await storeaApi.addTransaction(
    "sandbox",
    signer.sampleTransaction({ transactionId: transactions.sandbox }),
  );
  await storeaApi.addTransaction(
    "production",
    signer.sampleTransaction({ transactionId: transactions.otherBundle, bundleId: "com.other" }),
  );

  const account = await createServiceAccount();
  await play.addServiceAccount(account);
  const accountFile = join(dir, "service-account.json");
  await Deno.writeTextFile(accountFile, account.json);
  const purchases = {
    subscriptionToken: "fuzz-subscription-token",
    productToken: "fuzz-product-token",
    productId: "coins_100",
    unacknowledgedToken: "fuzz-unacknowledged-token",
    pendingToken: "fuzz-pending-token",
  };
  play.addSubscription({
    packageName: PACKAGE_NAME,
    purchaseToken: purchases.subscriptionToken,
    purchase: sampleSubscriptionPurchase(),
  });
  play.addProduct({
    packageName: PACKAGE_NAME,
    productId: purchases.productId,
    purchaseToken: purchases.productToken,
    purchase: sampleProductPurchase(),
  });
  play.addProduct({
    packageName: PACKAGE_NAME,
    productId: purchases.productId,
    purchaseToken: purchases.unacknowledgedToken,
    purchase: sampleProductPurchase({ acknowledgementState: 0 }),
  });
  play.addProduct({
    packageName: PACKAGE_NAME,
    productId: purchases.productId,
    purchaseToken: purchases.pendingToken,
    purchase: sampleProductPurchase({ purchaseState: 2, acknowledgementState: 0 }),
  });

  const probeToken = await issuer.mint({ audience: PUSH_AUDIENCE, email: PUSH_ACCOUNT });
  const kid = JSON.parse(new TextDecoder().decode(
    Uint8Array.fromBase64(probeToken.split(".")[0], { alphabet: "base64url" }),
  )).kid;

  const partial = {
    signer,
    storeaApi,
    issuer,
    push: { audience: PUSH_AUDIENCE, email: PUSH_ACCOUNT, kid },
    transactions,
    purchases,
    env: {
      ...storeaApi.serviceEnv,
      ...play.serviceEnv,
      ...issuer.serviceEnv,
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      UPSTREAM_TIMEOUT: "5s",
      DELIVERY_TIMEOUT: "2s",
      VALIDATION_AUDIT_ENABLED: "true",
      VALIDATION_AUDIT_RETENTION_DAYS: "30",
    },
  };
  // A raised rate limit, so that fuzzing is not all 429s.
  const service = await startService({
    env: { ...partial.env, RATE_LIMIT_BURST: "1000000", RATE_LIMIT_PER_SECOND: "1000000" },
  });
  closers.push(async () => {
    await service.stop();
    await service.db.drop();
  });

  // main: every credential, a key and a callback; bare: only a key; inactive: deactivated.
  const main = await createTenantWithCallback(service, receiver.url);
  receiver.setSecrets([main.secret!]);
  const mainKey = await service.cli("key", "create", main.tenantId, "--env", "live");
  assert.equal(mainKey.code, 0, mainKey.stderr);
  await cliOk(service, ...storeaCredentialArgs(main.tenantId, keyFile), "--app-id", String(APP_ID));
  const pushArgs = (tenantId: string, file: string) =>
    storebCredentialArgs(tenantId, file, PUSH_ACCOUNT);
  await cliOk(service, ...pushArgs(main.tenantId, accountFile));
  const bare = await createTenantWithKey(service);
  const inactive = await createTenantWithCallback(service, null);
  const { path: otherAccount } = await writeServiceAccountFile(dir);
  await cliOk(service, ...pushArgs(inactive.tenantId, otherAccount));
  await cliOk(service, "tenant", "deactivate", inactive.tenantId);

  const health = await fetch(`${service.url}/health`).then((r) => r.json());
  return {
    ...partial,
    service,
    version: health.version,
    keys: { main: mainKey.json.key, bare: bare.key },
    tenants: { main: main.tenantId, bare: bare.tenantId, inactive: inactive.tenantId },
    observed: new Map(),
    stats: new Map(),
    secrets: [mainKey.json.key, bare.key, probeToken],
  };
}

// ---------------------------------------------------------------------------------------------
// Sending and checking

/** Sends `probe` with fetch; fails when no whole answer arrives within the bound. */
async function send(service: RunningService, probe: Probe): Promise<Answer> {
  const headers = new Headers();
  for (const [name, value] of Object.entries(probe.headers)) {
    if (value !== null) headers.set(name, value);
  }
  let body: BodyInit | null = null;
  if (probe.body) {
    body = probe.transport === "stream" ? new Blob([probe.body]).stream() : probe.body;
  }
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ANSWER_BOUND_MS);
  try {
    const response = await fetch(`${service.url}${probe.path}`, {
      method: probe.method,
      headers,
      body,
      // A redirect would be an answer of its own, not one to follow.
      redirect: "manual",
      signal: abort.signal,
    });
    const text = await response.text();
    return { status: response.status, headers: response.headers, text };
  } catch (error) {
    if (abort.signal.aborted) {
      throw new Error(`no answer within ${ANSWER_BOUND_MS} ms to ${probe.method} ${probe.path}`);
    }
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Checks what every answer must be (common headers, envelope, known code) and returns its outcome
 * label; records it for the log check and the summary.
 */
function checkAnswer(world: World, answer: Answer, expect: Expectation): string {
  const where = `${answer.status} ${answer.text.slice(0, 300)}`;
  assert.notEqual(answer.status, 500, `500 answered: ${where}`);
  assert.ok(answer.status === 200 || answer.status >= 400, `unexpected status: ${where}`);
  assert.equal(answer.headers.get("content-type"), JSON_TYPE, `Content-Type of ${where}`);
  const reqId = answer.headers.get("x-request-id") ?? "";
  assert.match(reqId, REQUEST_ID, `X-Request-Id of ${where}`);
  if (expect.sentRequestId !== undefined) assert.notEqual(reqId, expect.sentRequestId);
  assert.equal(answer.headers.get("x-service-version"), world.version, `version of ${where}`);

  let outcome: string;
  if (expect.head) {
    assert.equal(answer.text, "");
    outcome = answer.status === 405
      ? "METHOD_NOT_ALLOWED"
      : answer.status === 404
      ? "NOT_FOUND"
      : "?";
  } else {
    let json: unknown;
    try {
      json = JSON.parse(answer.text);
    } catch {
      assert.fail(`body is not JSON: ${where}`);
    }
    outcome = answer.status >= 400
      ? envelopeCode(answer, json, where)
      : successOutcome(world, expect.route, json, where);
  }

  const route = expect.route;
  const allowed = route.kind === "none"
    ? ["NOT_FOUND"]
    : route.kind === "wrong-method"
    ? ["METHOD_NOT_ALLOWED"]
    : OUTCOMES[route.name];
  assert.ok(allowed.includes(outcome), `${outcome} is not an answer of this endpoint: ${where}`);
  if (route.kind === "wrong-method") {
    assert.equal(answer.headers.get("allow"), route.allowed.join(", "), "Allow header");
  }
  if (expect.exact !== undefined) {
    assert.equal(outcome, expect.exact, `expected ${expect.exact}, got ${where}`);
  }
  if (expect.forbidden?.includes(outcome)) assert.fail(`${outcome} must not be answered: ${where}`);

  world.observed.set(reqId, { outcome, status: answer.status });
  const key = `${route.kind === "found" ? route.name : "routing"} ${outcome}`;
  world.stats.set(key, (world.stats.get(key) ?? 0) + 1);
  return outcome;
}

/** The envelope of a 4xx or 5xx, with a known code of the answer's status. */
function envelopeCode(answer: Answer, json: unknown, where: string): string {
  assert.ok(isPlainObject(json), `envelope is not an object: ${where}`);
  for (const key of Object.keys(json)) assert.ok(ENVELOPE_KEYS.has(key), `key ${key}: ${where}`);
  assert.equal(json.valid, false, `valid: ${where}`);
  assert.equal(typeof json.error, "string", `error: ${where}`);
  const code = json.error as string;
  const status = SPEC_ERRORS[code] ?? ROUTING_ERRORS[code];
  assert.ok(status !== undefined, `unknown error code ${code}: ${where}`);
  assert.equal(answer.status, status, `status of ${code}: ${where}`);
  assert.ok(typeof json.message === "string" && json.message.length > 0, `message: ${where}`);
  if ("details" in json) assert.ok(isPlainObject(json.details), `details: ${where}`);
  if (code === "RATE_LIMITED") {
    // Retry-After in seconds and the same number in details.retryAfterSeconds; an upstream quota
    // answer may carry neither when the store gave no hint.
    const retryAfter = answer.headers.get("retry-after");
    if (retryAfter !== null || "details" in json) {
      assert.match(retryAfter ?? "", /^[1-9]\d*$/, `Retry-After: ${where}`);
      const details = json.details as Record<string, unknown> | undefined;
      assert.equal(details?.retryAfterSeconds, Number(retryAfter), `retryAfterSeconds: ${where}`);
    }
  }
  return code;
}

/** The 200 shapes: verify answers, domain failures, receipts, `/health` and `/ready`. */
function successOutcome(
  world: World,
  route: arb.RouteOutcome,
  json: unknown,
  where: string,
): string {
  assert.ok(route.kind === "found", `200 without a route: ${where}`);
  assert.ok(isPlainObject(json), `body is not an object: ${where}`);
  switch (route.name) {
    case "health":
      assert.deepEqual(json, { status: "ok", version: world.version });
      return "OK";
    case "ready":
      assert.deepEqual(json, {
        status: "ok",
        version: world.version,
        checks: { db: "ok", encryption: "ok" },
      });
      return "OK";
    case "storea-verify":
    case "storeb-verify":
    case "storeb-acknowledge":
    case "storeb-consume":
    case "storea-subscriptions":
    case "storea-history":
    case "storea-consumption": {
      assert.equal(json.version, world.version, where);
      if (json.valid === false) {
        assert.deepEqual(Object.keys(json).sort(), ["error", "message", "valid", "version"]);
        assert.equal(typeof json.message, "string");
        return `200:${json.error}`;
      }
      assert.equal(json.valid, true, where);
      if (route.name !== "storea-verify" && route.name !== "storeb-verify") {
        gatewaySuccess(route.name, json, where);
        return "VALID";
      }
      assert.equal(json.valid, true, where);
      assert.ok(json.appUserId === null || typeof json.appUserId === "string", where);
      if (route.name === "storea-verify") {
        assert.deepEqual(Object.keys(json).sort(), [
          "appUserId",
          "environment",
          "transaction",
          "valid",
          "version",
        ]);
        assert.ok(["production", "sandbox"].includes(json.environment as string), where);
        assert.ok(isPlainObject(json.transaction), where);
      } else {
        // `acknowledged` and `acknowledgeError` only with `acknowledge: true` (runStorebVerify).
        const keys = Object.keys(json).filter((k) =>
          k !== "acknowledged" && k !== "acknowledgeError"
        );
        assert.deepEqual(keys.sort(), ["appUserId", "purchase", "valid", "version"]);
        assert.ok(isPlainObject(json.purchase), where);
        assert.ok(
          ["storeb#subscriptionPurchaseV2", "storeb#productPurchase"].includes(
            json.purchase.kind as string,
          ),
          where,
        );
      }
      return "VALID";
    }
    case "storea-webhook":
    case "storeb-webhook":
      assert.deepEqual(
        Object.keys(json).sort(),
        ["enqueuedDelivery", "eventId", "externalId", "isNew"],
        where,
      );
      assert.match(json.eventId as string, EVENT_ID, where);
      assert.equal(typeof json.externalId, "string", where);
      assert.equal(typeof json.isNew, "boolean", where);
      assert.equal(typeof json.enqueuedDelivery, "boolean", where);
      return "RECEIPT";
  }
}

/** The success shapes of the store lookups and actions, field by field. */
function gatewaySuccess(route: arb.RouteName, json: Record<string, unknown>, where: string): void {
  const keys = Object.keys(json).sort();
  switch (route) {
    case "storeb-acknowledge":
      assert.deepEqual(keys, ["acknowledged", "alreadyAcknowledged", "valid", "version"], where);
      assert.equal(json.acknowledged, true, where);
      assert.equal(typeof json.alreadyAcknowledged, "boolean", where);
      return;
    case "storeb-consume":
      assert.deepEqual(keys, ["alreadyConsumed", "consumed", "valid", "version"], where);
      assert.equal(json.consumed, true, where);
      assert.equal(typeof json.alreadyConsumed, "boolean", where);
      return;
    case "storea-subscriptions":
      assert.deepEqual(keys, ["appUserId", "environment", "subscriptions", "valid", "version"]);
      assert.ok(["production", "sandbox"].includes(json.environment as string), where);
      assert.ok(Array.isArray(json.subscriptions), where);
      for (const entry of json.subscriptions as Record<string, unknown>[]) {
        assert.deepEqual(Object.keys(entry).sort(), [
          "originalTransactionId",
          "renewal",
          "status",
          "statusName",
          "subscriptionGroupIdentifier",
          "transaction",
        ], where);
        assert.ok(isPlainObject(entry.transaction), where);
      }
      return;
    case "storea-history":
      assert.deepEqual(
        keys,
        ["environment", "hasMore", "revision", "transactions", "valid", "version"],
        where,
      );
      assert.ok(Array.isArray(json.transactions), where);
      assert.ok((json.transactions as unknown[]).length <= 20, where);
      assert.equal(typeof json.revision, "string", where);
      assert.equal(typeof json.hasMore, "boolean", where);
      return;
    case "storea-consumption":
      assert.deepEqual(keys, ["sent", "transactionId", "valid", "version"], where);
      assert.equal(json.sent, true, where);
      return;
    default:
      assert.fail(`${route} has no success shape here: ${where}`);
  }
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * No error or fatal line for fuzzed input. The one exception is by design: a 502 for an unexpected
 * upstream answer (the App Store refuses a transaction id that is not numeric) is logged as an
 * error with its code, and must correlate with a 502 the fuzzer saw.
 */
function checkLogs(world: World, service: RunningService): void {
  const unexpected = service.logs.filter((line) => {
    if (line.level !== "error" && line.level !== "fatal") return false;
    const seen = world.observed.get(line.reqId);
    const upstream = line.msg === "request_failed" &&
      (line.code === "APPLE_API_ERROR" || line.code === "GOOGLE_API_ERROR");
    return !(upstream && seen?.status === 502 && seen.outcome === line.code);
  });
  assert.deepEqual(unexpected, [], "error lines logged for fuzzed input");
  const raw = service.rawStdout();
  for (const line of raw.split("\n")) {
    if (line !== "") assert.doesNotThrow(() => JSON.parse(line), `log line is not JSON: ${line}`);
  }
  // One pass over the logs for anything shaped like an API key or a JWT.
  const secrets = new Set(world.secrets);
  const shaped = /service_(?:live|test)_[\w-]{43}|eyJ[\w-]+\.[\w-]+\.[\w-]*/g;
  for (const [candidate] of raw.matchAll(shaped)) {
    assert.ok(!secrets.has(candidate), "a credential reached the logs");
  }
}

function printStats(world: World): void {
  const rows = [...world.stats].sort(([a], [b]) => a.localeCompare(b));
  console.log(rows.map(([key, count]) => `  ${key}: ${count}`).join("\n"));
}

/** Fetch spells these methods in upper case whatever it is given (Fetch standard, "normalize"). */
function normalizeMethod(method: string): string {
  const upper = method.toUpperCase();
  return ["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT"].includes(upper) ? upper : method;
}

/** The path the server receives for `path` sent with fetch (dot segments resolved). */
function pathnameOf(world: World, path: string): string {
  return new URL(`${world.service.url}${path}`).pathname;
}

// ---------------------------------------------------------------------------------------------
// Routing

const routingProbe = fc.record({
  method: arb.method,
  path: arb.anyPath,
  query: fc.option(arb.queryString, { nil: null }),
  authorization: fc.option(arb.headerValue(60), { nil: null }),
  body: fc.option(fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 64 }), { nil: null }),
});

async function runRouting(world: World, p: Value<typeof routingProbe>): Promise<void> {
  const method = normalizeMethod(p.method);
  const path = p.query === null ? p.path : `${p.path}?${p.query}`;
  const withBody = p.body !== null && method !== "GET" && method !== "HEAD";
  const answer = await send(world.service, {
    method: p.method,
    path,
    headers: {
      authorization: p.authorization,
      "content-type": withBody ? "application/json" : null,
    },
    body: withBody ? new Uint8Array(p.body!) : null,
  });
  const route = arb.routeOf(method, pathnameOf(world, path));
  let exact: string | undefined;
  if (route.kind === "found") {
    // No real key or tenant is ever in these requests.
    if (route.name === "health" || route.name === "ready") exact = "OK";
    if (API_KEY_ROUTES.has(route.name)) exact = "UNAUTHENTICATED";
    if (route.name === "storeb-webhook") exact = "UNAUTHENTICATED";
  }
  checkAnswer(world, answer, { route, exact, head: method === "HEAD" });
}

// ---------------------------------------------------------------------------------------------
// Health

const headerName = fc.oneof(
  fc.constantFrom(
    "authorization",
    "content-type",
    "accept",
    "accept-encoding",
    "x-request-id",
    "x-service-version",
    "cookie",
    "range",
    "if-none-match",
    "x-forwarded-for",
  ),
  fc.stringMatching(/^x-fuzz-[a-z0-9-]{1,12}$/),
);

const healthProbe = fc.record({
  path: fc.constantFrom("/health", "/ready"),
  query: fc.option(arb.queryString, { nil: null }),
  headers: fc.dictionary(headerName, arb.headerValue(200), { maxKeys: 4 }),
  requestId: fc.option(fc.constant("req_01ARZ3NDEKTSV4RRFFQ69G5FAV"), { nil: null }),
});

async function runHealth(world: World, p: Value<typeof healthProbe>): Promise<void> {
  const path = p.query === null ? p.path : `${p.path}?${p.query}`;
  const headers: Record<string, string> = { ...p.headers };
  if (p.requestId !== null) headers["x-request-id"] = p.requestId;
  const answer = await send(world.service, { method: "GET", path, headers });
  checkAnswer(world, answer, {
    route: arb.routeOf("GET", p.path),
    exact: "OK",
    sentRequestId: headers["x-request-id"],
  });
}

// ---------------------------------------------------------------------------------------------
// Verify endpoints

const numericId = fc.stringMatching(/^[1-9][0-9]{0,18}$/);

const storeaVerifyProbe = fc.record({
  auth: arb.apiKeyAuth,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.VERIFY_LIMIT),
  transport: arb.transport,
  // The names of known transactions stand for their ids.
  transactionId: fc.oneof(fc.constantFrom("production", "sandbox", "otherBundle"), numericId),
  environment: fc.constantFrom(undefined, undefined, "production", "sandbox"),
  changes: arb.fieldChanges(
    ["transactionId", "environment"] as const,
    (name) => name === "transactionId" ? arb.oddField(128) : arb.oddValue,
  ),
  extra: arb.extraFields,
});

async function runStoreaVerify(world: World, p: Value<typeof storeaVerifyProbe>) {
  const named = world.transactions as Record<string, string>;
  const valid: Record<string, unknown> = {
    transactionId: named[p.transactionId] ?? p.transactionId,
    environment: p.environment,
  };
  const callsBefore = world.storeaApi.requests.length;
  const { fields, answer, shape, exact: admission } = await sendVerifyProbe(world, p, {
    path: "/v1/storea/verify",
    valid,
    violation: arb.storeaBodyViolation,
  });
  const transactionId = fields.transactionId;
  let exact = admission;
  if (exact === undefined && shape && typeof transactionId === "string") {
    const t = world.transactions;
    const env = fields.environment;
    if (transactionId === t.production && env !== "sandbox") exact = "VALID";
    else if (transactionId === t.sandbox && env !== "production") exact = "VALID";
    else if (transactionId === t.otherBundle && env !== "sandbox") exact = "200:BUNDLE_ID_MISMATCH";
    else if (/^\d+$/.test(transactionId)) exact = "200:TRANSACTION_NOT_FOUND";
  }
  const outcome = checkAnswer(world, answer, {
    route: { kind: "found", name: "storea-verify", tenantId: null },
    exact,
  });
  if (outcome === "VALID" || outcome.startsWith("200:")) {
    // The store must have been asked about this very id, not about another path.
    const asked = world.storeaApi.requests.slice(callsBefore).map((r) => r.transactionId);
    assert.ok(
      asked.includes(transactionId as string),
      `the App Store was asked about ${JSON.stringify(asked)}, not ${
        JSON.stringify(transactionId)
      }`,
    );
  }
}

const STOREB_FIELDS = ["packageName", "productId", "purchaseToken", "type"] as const;

/** What a store B probe names: the package, product and token (the known ones by name). */
const storebPurchase = {
  packageName: fc.constantFrom(PACKAGE_NAME, PACKAGE_NAME, PACKAGE_NAME, "com.other.app"),
  productId: fc.constantFrom("coins_100", "monthly", "pro.monthly"),
  // The known purchases' names stand for their tokens.
  purchaseToken: fc.oneof(
    fc.constantFrom("subscription", "product", "unacknowledged", "pending"),
    fc.string({ minLength: 1, maxLength: 60 }),
  ),
};

/** A change of one of `names`: odd values of the right kind for each store B field. */
function storebChanges<K extends string>(names: readonly K[]) {
  return arb.fieldChanges(
    names,
    (name) =>
      name === "type" || name === "acknowledge"
        ? fc.oneof(arb.oddValue, arb.anyString)
        : arb.oddField(name === "purchaseToken" ? 4096 : 200),
  );
}

const storebVerifyProbe = fc.record({
  auth: arb.apiKeyAuth,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.VERIFY_LIMIT),
  transport: arb.transport,
  ...storebPurchase,
  type: fc.constantFrom("subscription", "product"),
  acknowledge: fc.constantFrom(undefined, undefined, undefined, true, false),
  changes: storebChanges([...STOREB_FIELDS, "acknowledge"] as const),
  extra: arb.extraFields,
});

/** The fields of a store B probe with the known purchases' names replaced by their tokens. */
function storebFields(
  world: World,
  p: { packageName: string; productId: string; purchaseToken: string },
) {
  const { subscriptionToken, productToken, unacknowledgedToken, pendingToken } = world.purchases;
  const tokens: Record<string, string> = {
    subscription: subscriptionToken,
    product: productToken,
    unacknowledged: unacknowledgedToken,
    pending: pendingToken,
  };
  return {
    packageName: p.packageName,
    productId: p.productId,
    purchaseToken: tokens[p.purchaseToken] ?? p.purchaseToken,
  };
}

/** Which known purchase the fields name as a purchase of `type`, if any. */
function storebPurchaseNamed(
  world: World,
  fields: Record<string, unknown>,
  type: unknown,
): "subscription" | "product" | "pending" | null {
  const { subscriptionToken, productToken, unacknowledgedToken, pendingToken, productId } =
    world.purchases;
  const token = fields.purchaseToken;
  if (type === "subscription") return token === subscriptionToken ? "subscription" : null;
  if (type !== "product" || fields.productId !== productId) return null;
  if (token === productToken || token === unacknowledgedToken) return "product";
  return token === pendingToken ? "pending" : null;
}

async function runStorebVerify(world: World, p: Value<typeof storebVerifyProbe>) {
  const valid: Record<string, unknown> = {
    ...storebFields(world, p),
    type: p.type,
    acknowledge: p.acknowledge,
  };
  const { fields, answer, shape, exact: admission } = await sendVerifyProbe(world, p, {
    path: "/v1/storeb/verify",
    valid,
    violation: arb.storebBodyViolation,
  });
  let exact = admission;
  if (exact === undefined && shape) {
    if (fields.packageName !== PACKAGE_NAME) exact = "200:PACKAGE_NAME_MISMATCH";
    else {
      const found = storebPurchaseNamed(world, fields, fields.type) !== null;
      exact = found ? "VALID" : "200:PURCHASE_NOT_FOUND";
    }
  }
  const outcome = checkAnswer(world, answer, {
    route: { kind: "found", name: "storeb-verify", tenantId: null },
    exact,
  });
  if (outcome === "VALID" && shape) {
    // `acknowledged` exactly when it was asked for; a pending purchase is never acknowledged.
    const json = JSON.parse(answer.text);
    if (fields.acknowledge === true) {
      const named = storebPurchaseNamed(world, fields, fields.type);
      assert.equal(json.acknowledged, named !== "pending", answer.text);
      assert.equal("acknowledgeError" in json, false, answer.text);
    } else {
      assert.equal("acknowledged" in json, false, answer.text);
    }
  }
}

const storebAcknowledgeProbe = fc.record({
  auth: arb.apiKeyAuth,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.VERIFY_LIMIT),
  transport: arb.transport,
  ...storebPurchase,
  type: fc.constantFrom("subscription", "product"),
  changes: storebChanges([...STOREB_FIELDS, "acknowledge"] as const),
  extra: arb.extraFields,
});

const storebConsumeProbe = fc.record({
  auth: arb.apiKeyAuth,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.VERIFY_LIMIT),
  transport: arb.transport,
  ...storebPurchase,
  // Consume takes no type: one sent is an unknown field.
  type: fc.constantFrom(undefined, undefined, undefined, "product"),
  changes: storebChanges(STOREB_FIELDS),
  extra: arb.extraFields,
});

/**
 * Acknowledge or consume: the body checks, then the package, then the purchase as the store
 * knows it. Every action is safe to repeat, so the known purchases answer the same whatever came
 * before: acknowledged or consumed now or earlier, or pending for good.
 */
async function runStorebAction(
  world: World,
  action: "acknowledge" | "consume",
  p: Value<typeof storebAcknowledgeProbe> | Value<typeof storebConsumeProbe>,
) {
  const valid: Record<string, unknown> = { ...storebFields(world, p), type: p.type };
  const { fields, answer, shape, exact: admission } = await sendVerifyProbe(world, p, {
    path: `/v1/storeb/${action}`,
    valid,
    violation: action === "acknowledge"
      ? arb.storebAcknowledgeBodyViolation
      : arb.storebConsumeBodyViolation,
  });
  let exact = admission;
  if (exact === undefined && shape) {
    if (fields.packageName !== PACKAGE_NAME) exact = "200:PACKAGE_NAME_MISMATCH";
    else {
      const named = storebPurchaseNamed(
        world,
        fields,
        action === "consume" ? "product" : fields.type,
      );
      exact = named === null
        ? "200:PURCHASE_NOT_FOUND"
        : named === "pending"
        ? "200:PURCHASE_PENDING"
        : "VALID";
    }
  }
  checkAnswer(world, answer, {
    route: { kind: "found", name: `storeb-${action}`, tenantId: null },
    exact,
  });
}

/** What the store A simulator holds for `transactionId` asked in `environment`. */
function storeaTransactionNamed(
  world: World,
  transactionId: unknown,
  environment: unknown,
): "ours" | "otherBundle" | "unknown" | null {
  if (typeof transactionId !== "string" || !/^\d+$/.test(transactionId)) return null;
  const t = world.transactions;
  if (transactionId === t.production && environment !== "sandbox") return "ours";
  if (transactionId === t.sandbox && environment !== "production") return "ours";
  if (transactionId === t.otherBundle && environment !== "sandbox") return "otherBundle";
  return "unknown";
}

/** A store A lookup or action probe: verify's fields and those of the endpoint. */
function storeaProbe<K extends string>(
  names: readonly K[],
  fields: Record<string, fc.Arbitrary<unknown>>,
  change: (name: K) => fc.Arbitrary<unknown>,
  requiredKeys: string[] = [],
) {
  return fc.record({
    auth: arb.apiKeyAuth,
    contentType: arb.contentType,
    body: arb.bodyRecipe(arb.VERIFY_LIMIT),
    transport: arb.transport,
    transactionId: fc.oneof(fc.constantFrom("production", "sandbox", "otherBundle"), numericId),
    environment: fc.constantFrom(undefined, undefined, "production", "sandbox"),
    fields: fc.record(fields, { requiredKeys }),
    changes: arb.fieldChanges(
      ["transactionId", "environment", ...names] as const,
      (name) =>
        name === "transactionId"
          ? arb.oddField(128)
          : name === "environment"
          ? arb.oddValue
          : change(name as K),
    ),
    extra: arb.extraFields,
  });
}

/** Sends a store A probe; what its admission checks decide, and the fields as sent. */
async function sendStoreaProbe(
  world: World,
  p: Value<ReturnType<typeof storeaProbe>>,
  path: string,
  violation: (fields: Record<string, unknown>) => string | null,
) {
  const named = world.transactions as Record<string, string>;
  const valid: Record<string, unknown> = {
    transactionId: named[p.transactionId] ?? p.transactionId,
    environment: p.environment,
    ...p.fields,
  };
  return await sendVerifyProbe(world, p, { path, valid, violation });
}

const storeaSubscriptionsProbe = storeaProbe([], {}, () => arb.oddValue);

async function runStoreaSubscriptions(
  world: World,
  p: Value<typeof storeaSubscriptionsProbe>,
) {
  const { fields, answer, shape, exact: admission } = await sendStoreaProbe(
    world,
    p,
    "/v1/storea/subscriptions",
    arb.storeaBodyViolation,
  );
  let exact = admission;
  if (exact === undefined && shape) {
    const named = storeaTransactionNamed(world, fields.transactionId, fields.environment);
    if (named === "ours") exact = "VALID";
    if (named === "otherBundle") exact = "200:BUNDLE_ID_MISMATCH";
    if (named === "unknown") exact = "200:TRANSACTION_NOT_FOUND";
  }
  const outcome = checkAnswer(world, answer, {
    route: { kind: "found", name: "storea-subscriptions", tenantId: null },
    exact,
  });
  if (outcome === "VALID" && exact === "VALID") {
    // The known transactions are each a subscription of a customer of their own.
    const subscriptions = JSON.parse(answer.text).subscriptions;
    assert.equal(subscriptions.length, 1, answer.text);
    assert.equal(subscriptions[0].transaction.transactionId, fields.transactionId);
  }
}

/** A value for a history filter: valid ones mostly, and odd ones of its kind. */
function historyValue(name: string): fc.Arbitrary<unknown> {
  const nonString = arb.oddValue.filter((value) => typeof value !== "string");
  const dates = fc.constantFrom(...Object.keys(arb.HISTORY_DATES));
  const ids = fc.array(fc.constantFrom("pro.monthly", "coins_100", "21000001"), { maxLength: 3 });
  switch (name) {
    case "startDate":
    case "endDate":
      return fc.oneof({ weight: 4, arbitrary: dates }, { weight: 1, arbitrary: nonString });
    case "productIds":
    case "subscriptionGroupIdentifiers":
      return fc.oneof(
        { weight: 4, arbitrary: ids },
        {
          weight: 1,
          arbitrary: fc.constantFrom(
            Array.from({ length: 50 }, (_, i) => `p${i}`),
            Array.from({ length: 51 }, (_, i) => `p${i}`),
            [""],
            ["x".repeat(201)],
          ),
        },
        { weight: 2, arbitrary: arb.oddValue },
      );
    case "productTypes":
      return fc.oneof(
        { weight: 4, arbitrary: fc.subarray([...arb.HISTORY_PRODUCT_TYPES]) },
        { weight: 1, arbitrary: fc.constantFrom(["BUNDLE"], ["auto_renewable"]) },
        { weight: 1, arbitrary: arb.oddValue },
      );
    case "sort":
      return fc.oneof(fc.constantFrom("ascending", "descending", "ASCENDING"), arb.oddValue);
    case "inAppOwnershipType":
      return fc.oneof(fc.constantFrom("FAMILY_SHARED", "PURCHASED", "SHARED"), arb.oddValue);
    case "revoked":
      return fc.oneof(fc.boolean(), arb.oddValue);
    default: // revision
      return arb.oddField(1024);
  }
}

const HISTORY_FIELDS = [
  "revision",
  "sort",
  "startDate",
  "endDate",
  "productIds",
  "productTypes",
  "subscriptionGroupIdentifiers",
  "inAppOwnershipType",
  "revoked",
] as const;

const storeaHistoryProbe = storeaProbe(
  HISTORY_FIELDS,
  {
    sort: fc.constantFrom("ascending", "descending"),
    startDate: fc.constantFrom("2026-01-01T00:00:00Z", "1970-01-01T00:00:00Z"),
    endDate: fc.constantFrom("2030-12-31T23:59:59.999-05:00"),
    productIds: fc.constant(["pro.monthly"]),
    productTypes: fc.constantFrom(["AUTO_RENEWABLE"], ["CONSUMABLE", "NON_CONSUMABLE"]),
    inAppOwnershipType: fc.constantFrom("PURCHASED", "FAMILY_SHARED"),
    revoked: fc.boolean(),
  },
  historyValue,
);

async function runStoreaHistory(world: World, p: Value<typeof storeaHistoryProbe>) {
  const { fields, answer, shape, exact: admission } = await sendStoreaProbe(
    world,
    p,
    "/v1/storea/history",
    arb.storeaHistoryBodyViolation,
  );
  let exact = admission;
  if (exact === undefined && shape) {
    const named = storeaTransactionNamed(world, fields.transactionId, fields.environment);
    const filtered = HISTORY_FIELDS.some((name) => name !== "sort" && fields[name] !== undefined);
    // A revision the App Store did not make is refused by it, whatever the transaction.
    if (named !== null && fields.revision !== undefined) exact = "INVALID_REQUEST";
    else if (named === "ours") exact = "VALID";
    else if (named === "unknown") exact = "200:TRANSACTION_NOT_FOUND";
    // A filter may leave the other app's transaction out of the page: then nothing mismatches.
    else if (named === "otherBundle" && !filtered) exact = "200:BUNDLE_ID_MISMATCH";
  }
  const outcome = checkAnswer(world, answer, {
    route: { kind: "found", name: "storea-history", tenantId: null },
    exact,
  });
  if (outcome === "INVALID_REQUEST" && exact === "INVALID_REQUEST" && admission === undefined) {
    assert.deepEqual(JSON.parse(answer.text).details, { upstreamCode: 4000005 }, answer.text);
  }
}

const CONSUMPTION_FIELDS = [
  "customerConsented",
  "sampleContentProvided",
  "deliveryStatus",
  "consumptionPercentage",
  "refundPreference",
] as const;

const storeaConsumptionProbe = storeaProbe(
  CONSUMPTION_FIELDS,
  {
    customerConsented: fc.constant(true),
    sampleContentProvided: fc.boolean(),
    deliveryStatus: fc.constantFrom(...arb.DELIVERY_STATUSES),
    consumptionPercentage: fc.constantFrom(0, 1, 50_000, 99_999, 100_000),
    refundPreference: fc.constantFrom(...arb.REFUND_PREFERENCES),
  },
  (name) => {
    switch (name) {
      case "customerConsented":
        return fc.oneof(fc.constantFrom(false, "true", 1, undefined), arb.oddValue);
      case "consumptionPercentage":
        return fc.oneof(
          fc.constantFrom(-1, 100_001, 0.5, 45_200, 2 ** 31, undefined),
          arb.oddValue,
        );
      case "deliveryStatus":
      case "refundPreference":
        return fc.oneof(fc.constantFrom("delivered", "GRANT", undefined), arb.oddValue);
      default:
        return fc.oneof(fc.constant(undefined), arb.oddValue);
    }
  },
  ["customerConsented", "sampleContentProvided", "deliveryStatus"],
);

async function runStoreaConsumption(world: World, p: Value<typeof storeaConsumptionProbe>) {
  const { fields, answer, shape, exact: admission } = await sendStoreaProbe(
    world,
    p,
    "/v1/storea/consumption",
    arb.storeaConsumptionBodyViolation,
  );
  let exact = admission;
  if (exact === undefined && shape) {
    const named = storeaTransactionNamed(world, fields.transactionId, fields.environment);
    // The known transactions are auto-renewable subscriptions: Apple computes their percentage
    // and refuses one sent (the other app's too: consumption information checks no bundle).
    const percentage = fields.consumptionPercentage !== undefined;
    if (named === "ours" || named === "otherBundle") {
      exact = percentage ? "INVALID_REQUEST" : "VALID";
    }
    if (named === "unknown") exact = "200:TRANSACTION_NOT_FOUND";
  }
  const outcome = checkAnswer(world, answer, {
    route: { kind: "found", name: "storea-consumption", tenantId: null },
    exact,
  });
  if (outcome === "INVALID_REQUEST" && exact === "INVALID_REQUEST" && admission === undefined) {
    assert.deepEqual(JSON.parse(answer.text).details, { upstreamCode: 4000209 }, answer.text);
  }
}

/** What a verify probe shares: how its request is sent, and who its key belongs to. */
interface VerifyProbe {
  auth: Value<typeof arb.apiKeyAuth>;
  contentType: Value<typeof arb.contentType>;
  body: Value<ReturnType<typeof arb.bodyRecipe>>;
  transport: Value<typeof arb.transport>;
  changes: { field: string; value: unknown }[];
  extra: Record<string, unknown>;
}

/**
 * Sends a verify probe: `valid` fields with the probe's changes and extra fields, in the probe's
 * body, content type, key and transport. `exact` is the answer the admission checks decide, in
 * their documented order (key, content type, size, body, credentials), or undefined when they let
 * it through to the store; `shape` says whether the fields reached the service as built (the
 * store's own checks can then be predicted).
 */
async function sendVerifyProbe(
  world: World,
  p: VerifyProbe,
  request: {
    path: string;
    valid: Record<string, unknown>;
    violation: (fields: Record<string, unknown>) => string | null;
  },
) {
  const valid = { ...request.valid };
  for (const change of p.changes) valid[change.field] = change.value;
  const fields = arb.jsonObject({ ...p.extra, ...valid });
  const body = arb.buildBody(p.body, JSON.stringify(fields));
  const authorization = arb.buildApiKeyAuth(p.auth, world.keys);
  const holder = arb.apiKeyHolder(authorization, world.keys);
  const answer = await send(world.service, {
    method: "POST",
    path: request.path,
    headers: { authorization, "content-type": p.contentType },
    body,
    transport: p.transport,
  });
  const shape = arb.keepsShape(p.body) && Object.keys(p.extra).length === 0 &&
    wellFormed(fields);
  let exact: string | undefined;
  if (holder === null) exact = "UNAUTHENTICATED";
  else if (!arb.isJsonContentType(p.contentType)) exact = "INVALID_REQUEST";
  else if (body.length > arb.VERIFY_LIMIT) exact = "INVALID_REQUEST";
  else if (shape && request.violation(fields) !== null) exact = "INVALID_REQUEST";
  else if (shape && holder === "bare") exact = "CREDENTIALS_MISSING";
  return { fields, answer, shape, exact };
}

/**
 * Whether every string field is well-formed Unicode. Length limits count characters, which are
 * ambiguous in a string with an unpaired surrogate, so the oracle predicts nothing for one (the
 * service refuses it, 400).
 */
function wellFormed(fields: Record<string, unknown>): boolean {
  return Object.values(fields).every((value) => typeof value !== "string" || value.isWellFormed());
}

// ---------------------------------------------------------------------------------------------
// Receivers

/** Which tenant of the world `tenantId` names, if any. */
function tenantNamed(world: World, tenantId: string | null): arb.TenantName | null {
  for (const name of ["main", "bare", "inactive"] as const) {
    if (world.tenants[name] === tenantId) return name;
  }
  return null;
}

const storeaWebhookProbe = fc.record({
  tenant: arb.tenantSegment,
  pathShape: arb.pathShape,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.RECEIVER_LIMIT),
  transport: arb.transport,
  payload: arb.storeaPayload,
  payloadField: fc.oneof(
    { weight: 12, arbitrary: fc.constant("signed" as const) },
    { weight: 1, arbitrary: arb.oddValue },
  ),
  extra: arb.extraFields,
});

async function runStoreaWebhook(world: World, p: Value<typeof storeaWebhookProbe>) {
  const built = await arb.buildStoreaPayload(p.payload, world.signer, APP_ID);
  const signedPayload = p.payloadField === "signed" ? built.signedPayload : p.payloadField;
  const shapeText = JSON.stringify(arb.jsonObject({ ...p.extra, signedPayload }));
  const body = arb.buildBody(p.body, shapeText);
  const path = arb.buildReceiverPath(
    "storea",
    arb.buildTenantSegment(p.tenant, world.tenants),
    p.pathShape,
  );
  const answer = await send(world.service, {
    method: "POST",
    path,
    headers: { "content-type": p.contentType },
    body,
    transport: p.transport,
  });

  // Body (400) -> tenant (404) -> credentials (400) -> JWS (401) -> 200.
  const route = arb.routeOf("POST", pathnameOf(world, path));
  let exact: string | undefined;
  const tenant = route.kind === "found" ? tenantNamed(world, route.tenantId) : null;
  const bodyPasses = arb.keepsShape(p.body) && typeof signedPayload === "string" &&
    signedPayload.length > 0;
  if (route.kind !== "found") exact = undefined;
  else if (!arb.isJsonContentType(p.contentType)) exact = "INVALID_REQUEST";
  else if (body.length > arb.RECEIVER_LIMIT) exact = "INVALID_REQUEST";
  else if (bodyPasses && (tenant === null || tenant === "inactive")) exact = "TENANT_NOT_FOUND";
  else if (bodyPasses && tenant === "bare") exact = "CREDENTIALS_MISSING";
  else if (bodyPasses && p.payloadField === "signed") {
    const recipe = p.payload;
    if (recipe.kind === "valid") exact = "RECEIPT";
    if (recipe.kind === "tampered") {
      exact = arb.carriesSameSignedData(built.original!, built.signedPayload)
        ? "RECEIPT"
        : "SIGNATURE_INVALID";
    }
    if (recipe.kind === "header" && "alg" in recipe.header && recipe.header.alg !== "ES256") {
      exact = "SIGNATURE_INVALID";
    }
    if (recipe.kind === "header" && recipe.header.x5c !== "keep") exact = "SIGNATURE_INVALID";
    const nested = built.nested;
    if (nested && !arb.carriesSameSignedData(nested.original, nested.edited)) {
      exact = "SIGNATURE_INVALID";
    }
  }
  // A chain the service has never seen (an edited certificate or x5c, or an edit of the header
  // that still decodes to three certificates) spends a token of a small budget before it is
  // checked, and is refused 429 when none is left: that, or the prediction.
  const recipe = p.payload;
  const unseenChain = recipe.kind === "certificate" ||
    (recipe.kind === "header" && recipe.header.x5c !== "keep") ||
    (recipe.kind === "tampered" && recipe.segment === 0);
  const budget = unseenChain && exact !== undefined && answer.status === 429;
  const outcome = checkAnswer(world, answer, { route, exact: budget ? "RATE_LIMITED" : exact });
  if (outcome === "RECEIPT" && built.notificationUUID !== null && exact === "RECEIPT") {
    const receipt = JSON.parse(answer.text);
    assert.equal(receipt.externalId, built.notificationUUID);
    assert.equal(receipt.isNew, true);
    assert.equal(receipt.enqueuedDelivery, true);
  }
}

const storebWebhookProbe = fc.record({
  tenant: arb.tenantSegment,
  pathShape: arb.pathShape,
  contentType: arb.contentType,
  body: arb.bodyRecipe(arb.RECEIVER_LIMIT),
  transport: arb.transport,
  auth: arb.pushAuth,
  format: arb.pushAuthFormat,
  envelope: arb.envelope,
  extra: arb.extraFields,
});

async function runStorebWebhook(world: World, p: Value<typeof storebWebhookProbe>) {
  const token = await arb.buildPushAuth(p.auth, p.format, world.issuer, world.push);
  if (token.token !== null && p.auth.kind === "valid") world.secrets.push(token.token);
  const { envelope, valid } = arb.buildEnvelope(p.envelope, PACKAGE_NAME);
  const shapeText = JSON.stringify({ ...p.extra, ...envelope });
  const body = arb.buildBody(p.body, shapeText);
  const path = arb.buildReceiverPath(
    "storeb",
    arb.buildTenantSegment(p.tenant, world.tenants),
    p.pathShape,
  );
  const answer = await send(world.service, {
    method: "POST",
    path,
    headers: { authorization: token.header, "content-type": p.contentType },
    body,
    transport: p.transport,
  });

  // Tenant and token (401) -> inactive (404) -> envelope and package (400) -> 200.
  const route = arb.routeOf("POST", pathnameOf(world, path));
  const tenant = route.kind === "found" ? tenantNamed(world, route.tenantId) : null;
  const tokenVerdict = pushTokenVerdict(p, token);
  let exact: string | undefined;
  let forbidden: string[] | undefined;
  if (route.kind !== "found") exact = undefined;
  else if (tenant === null || tenant === "bare") exact = "UNAUTHENTICATED";
  else if (tokenVerdict === "mixed") forbidden = ["RECEIPT", "TENANT_NOT_FOUND", "INVALID_REQUEST"];
  else if (tokenVerdict !== "accepted" && tokenVerdict !== null) exact = tokenVerdict;
  else if (tokenVerdict === "accepted" && tenant === "inactive") exact = "TENANT_NOT_FOUND";
  else if (tokenVerdict === "accepted") {
    if (!arb.isJsonContentType(p.contentType)) exact = "INVALID_REQUEST";
    else if (body.length > arb.RECEIVER_LIMIT) exact = "INVALID_REQUEST";
    else if (arb.keepsShape(p.body) && valid && !("message" in p.extra)) exact = "RECEIPT";
  }
  const outcome = checkAnswer(world, answer, { route, exact, forbidden });
  if (outcome === "RECEIPT" && exact === "RECEIPT" && p.envelope.kind === "valid") {
    const receipt = JSON.parse(answer.text);
    const message = envelope.message as Record<string, unknown>;
    assert.equal(receipt.externalId, message.messageId ?? message.message_id);
    assert.equal(receipt.isNew, true);
  }
}

/**
 * What the documented checks say of the token of `p` for a tenant with store B credentials:
 * accepted, one code, `mixed` (refused, either code), or null when it cannot be told.
 */
function pushTokenVerdict(
  p: Value<typeof storebWebhookProbe>,
  token: { header: string | null; token: string | null; original: string | null },
): string | null {
  const auth = p.auth;
  if (auth.kind === "none" || auth.kind === "raw") return "UNAUTHENTICATED";
  if (!arb.isBearerFormat(p.format)) return "UNAUTHENTICATED";
  switch (auth.kind) {
    case "valid":
      return "accepted";
    case "fault":
      return arb.PUSH_FAULT_CODE[auth.fault];
    case "faults":
      return "mixed";
    case "tampered":
      return arb.carriesSameSignedData(token.original!, token.token!) ? null : "mixed";
    case "forged":
      if (auth.alg !== "RS256") return "UNAUTHENTICATED";
      if (auth.claims !== "valid" || auth.signature !== "random") return "mixed";
      return "SIGNATURE_INVALID";
  }
}

// ---------------------------------------------------------------------------------------------
// Duplicates in flight

const duplicateProbe = fc.record({
  store: fc.constantFrom("storea" as const, "storeb" as const),
  copies: fc.integer({ min: 2, max: 8 }),
});

/** Copies of one notification in flight together make one event, one `isNew`. */
async function runDuplicates(world: World, p: Value<typeof duplicateProbe>): Promise<void> {
  let probe: Probe;
  if (p.store === "storea") {
    const built = await arb.buildStoreaPayload(
      {
        kind: "valid",
        basics: {
          notificationType: "DID_RENEW",
          subtype: null,
          product: "Auto-Renewable Subscription",
          renewal: true,
          environment: "Production",
        },
      },
      world.signer,
      APP_ID,
    );
    probe = {
      method: "POST",
      path: `/v1/webhooks/storea/${world.tenants.main}`,
      headers: { "content-type": "application/json" },
      body: new TextEncoder().encode(JSON.stringify({ signedPayload: built.signedPayload })),
    };
  } else {
    const token = await world.issuer.mint({ audience: PUSH_AUDIENCE, email: PUSH_ACCOUNT });
    const { envelope } = arb.buildEnvelope({
      kind: "valid",
      notification: "subscription",
      notificationType: 2,
      spelling: "both",
    }, PACKAGE_NAME);
    probe = {
      method: "POST",
      path: `/v1/webhooks/storeb/${world.tenants.main}`,
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: new TextEncoder().encode(JSON.stringify(envelope)),
    };
  }
  const answers = await Promise.all(
    Array.from({ length: p.copies }, () => send(world.service, probe)),
  );
  const route = arb.routeOf("POST", probe.path);
  for (const answer of answers) checkAnswer(world, answer, { route, exact: "RECEIPT" });
  const receipts = answers.map((answer) => JSON.parse(answer.text));
  assert.equal(receipts.filter((receipt) => receipt.isNew).length, 1, answers[0].text);
  assert.equal(new Set(receipts.map((receipt) => receipt.eventId)).size, 1);
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1: what fetch cannot send

const rawSegment = fc.oneof(
  fc.constantFrom("v1", "webhooks", "storea", "storeb", "verify", "health", "ready"),
  fc.constantFrom("", ".", "..", "%2e%2e", "%2E", "%2f", "%00", "%zz", "%", "%C0%AE", "~", ";"),
  fc.string({ unit: "binary", maxLength: 8 }).map((s) => encodeURIComponent(s.toWellFormed())),
);

const rawProbe = fc.record({
  method: fc.constantFrom("GET", "POST", "POST", "POST", "PUT", "TRACE", "get", "OPTIONS"),
  path: fc.oneof(
    fc.constantFrom(
      "/health",
      "/ready",
      "/v1/storea/verify",
      "/v1/storeb/verify",
      "/v1/../health",
      "/v1/webhooks/storea/..",
      "/v1/webhooks/storeb/.",
      "/v1/webhooks/storea/%2e%2e",
      "//health",
      "/health/",
    ),
    fc.tuple(
      fc.constantFrom("/v1/webhooks/storea/", "/v1/webhooks/storeb/", "/v1/", "/"),
      fc.array(rawSegment, { minLength: 1, maxLength: 3 }),
    ).map(([prefix, segments]) => prefix + segments.join("/")),
  ),
  query: fc.option(fc.constantFrom("a=1", "x=%zz", "", "?", "tenantId=..%2f"), { nil: null }),
  lengthMode: fc.constantFrom(
    "exact" as const,
    "smaller" as const,
    "larger" as const,
    "chunked" as const,
    "none" as const,
  ),
  body: fc.oneof(
    fc.constant('{"transactionId":"2000000000000001"}'),
    fc.constant('{"signedPayload":"a.b.c"}'),
    fc.string({ maxLength: 40 }),
  ),
  contentType: fc.constantFrom("application/json", "text/plain"),
});

async function runRaw(world: World, p: Value<typeof rawProbe>): Promise<void> {
  const target = p.query === null ? p.path : `${p.path}?${p.query}`;
  const body = new TextEncoder().encode(p.body);
  const lines = [
    `${p.method} ${target} HTTP/1.1`,
    `Host: 127.0.0.1:${world.service.port}`,
    `Content-Type: ${p.contentType}`,
    `Authorization: Bearer ${world.keys.main}`,
    "Connection: close",
  ];
  let payload = body;
  if (p.lengthMode === "exact") lines.push(`Content-Length: ${body.length}`);
  if (p.lengthMode === "smaller") lines.push(`Content-Length: ${Math.floor(body.length / 2)}`);
  if (p.lengthMode === "larger") lines.push(`Content-Length: ${body.length + 10}`);
  if (p.lengthMode === "chunked") {
    lines.push("Transfer-Encoding: chunked");
    const size = body.length.toString(16);
    payload = new TextEncoder().encode(
      body.length === 0 ? "0\r\n\r\n" : `${size}\r\n${p.body}\r\n0\r\n\r\n`,
    );
  }
  const head = new TextEncoder().encode(`${lines.join("\r\n")}\r\n\r\n`);
  const request = new Uint8Array(head.length + payload.length);
  request.set(head, 0);
  request.set(payload, head.length);
  // A body shorter than its Content-Length ends only when the client half-closes. The server
  // may then answer, or close the connection without answering; it must not hang.
  const incomplete = p.lengthMode === "larger";
  const answer = await rawExchange(world.service.port, request, {
    halfClose: incomplete,
    boundMs: ANSWER_BOUND_MS,
  });
  if (answer === null && incomplete) return;
  assert.ok(answer !== null, "the connection closed without an answer");
  const route = arb.routeOf(p.method, p.path);
  checkAnswer(world, answer, { route });
}

// ---------------------------------------------------------------------------------------------
// The default rate limit

const burstProbe = fc.record({
  size: fc.integer({ min: 1, max: 420 }),
  holder: fc.constantFrom("main" as const, "bare" as const),
  body: fc.constantFrom("not-json" as const, "over-limit" as const, "missing-fields" as const),
});

/** Sends a burst at once; returns how many were answered 429. */
async function runBurst(
  world: World,
  service: RunningService,
  p: Value<typeof burstProbe>,
): Promise<number> {
  const body = p.body === "not-json"
    ? new TextEncoder().encode("{")
    : p.body === "over-limit"
    ? new Uint8Array(arb.VERIFY_LIMIT + 1).fill(0x20)
    : new TextEncoder().encode(
      JSON.stringify({ packageName: "x", productId: "y", type: "product" }),
    );
  const probe: Probe = {
    method: "POST",
    path: "/v1/storeb/verify",
    headers: {
      authorization: `Bearer ${world.keys[p.holder]}`,
      "content-type": "application/json",
    },
    body,
  };
  const started = performance.now();
  const answers = await Promise.all(Array.from({ length: p.size }, () => send(service, probe)));
  const elapsedSeconds = (performance.now() - started) / 1000;
  let limited = 0;
  for (const answer of answers) {
    const outcome = checkAnswer(world, answer, {
      route: { kind: "found", name: "storeb-verify", tenantId: null },
    });
    if (outcome === "RATE_LIMITED") limited++;
    else assert.equal(outcome, "INVALID_REQUEST");
  }
  // A bucket of 200 that refills 100 per second lets no more than that through.
  const admitted = answers.length - limited;
  assert.ok(
    admitted <= 200 + Math.ceil(elapsedSeconds * 100) + 1,
    `${admitted} of ${answers.length} admitted in ${elapsedSeconds.toFixed(2)} s`,
  );
  return limited;
}
