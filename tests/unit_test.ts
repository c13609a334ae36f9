/** Pure modules tested with plain inputs. */
import assert from "node:assert/strict";
import { ConfigError, parseDuration, readConfig } from "../src/config.ts";
import { masterKeyId, SecretBox, SecretError } from "../src/crypto/secrets.ts";
import { RateLimiter } from "../src/auth/rate_limit.ts";
import { hashApiKey, mintApiKey, parseBearerKey } from "../src/auth/api_key.ts";
import { Router } from "../src/http/router.ts";
import { ServiceError } from "../src/errors.ts";
import { isId, newId, ulidFactory } from "../src/lib/ids.ts";
import { Logger } from "../src/observability/log.ts";

Deno.test("config: defaults match the documented ones", () => {
  const config = readConfig({});
  assert.equal(config.port, 8080);
  assert.equal(config.host, "0.0.0.0");
  assert.equal(config.env, "development");
  assert.equal(config.logLevel, "info");
  assert.equal(config.version, "dev");
  assert.equal(config.databaseUrl, null);
  assert.equal(config.databasePoolSize, 10);
  assert.equal(config.dataDir, "./data");
  assert.equal(config.encryptionKey, null);
  assert.equal(config.rateLimitPerSecond, 100);
  assert.equal(config.rateLimitBurst, 200);
  assert.equal(config.validationAuditEnabled, false);
  assert.equal(config.validationAuditRetentionDays, null);
  assert.equal(config.storeaApiUrlProduction, "https://api.storekit.apple.com");
  assert.equal(config.storeaApiUrlSandbox, "https://api.storekit-sandbox.apple.com");
  assert.deepEqual(config.storeaRootCerts, []);
  assert.equal(config.storebApiUrl, "https://androidpublisher.googleapis.com");
  assert.equal(config.storebTokenUrl, "https://oauth2.googleapis.com/token");
  assert.equal(config.storebOidcCertsUrl, "https://www.googleapis.com/oauth2/v3/certs");
  assert.deepEqual(config.storebOidcIssuers, [
    "https://accounts.google.com",
    "accounts.google.com",
  ]);
  assert.deepEqual(config.deliveryRetryScheduleMs, [
    30_000,
    120_000,
    600_000,
    3_600_000,
    21_600_000,
  ]);
  assert.equal(config.deliveryTimeoutMs, 10_000);
  assert.equal(config.upstreamTimeoutMs, 10_000);
  assert.equal(config.deliveryConcurrency, 64);
  assert.equal(config.deliveryTenantConcurrency, 8);
  // An unset NODE_ENV keeps production's callback rules; development is asked for.
  assert.equal(config.callbackAllowHttp, false);
  assert.equal(config.callbackAllowPrivateNetworks, false);
  const development = readConfig({ NODE_ENV: "development" });
  assert.equal(development.callbackAllowHttp, true);
  assert.equal(development.callbackAllowPrivateNetworks, true);
});

Deno.test("config: production requires a key and refuses insecure callbacks by default", () => {
  assert.throws(
    () => readConfig({ NODE_ENV: "production" }),
    (e) => e instanceof ConfigError && e.variable === "ENCRYPTION_KEY",
  );
  const key = btoa(String.fromCharCode(...new Uint8Array(32)));
  const config = readConfig({ NODE_ENV: "production", ENCRYPTION_KEY: key });
  assert.equal(config.callbackAllowHttp, false);
  assert.equal(config.callbackAllowPrivateNetworks, false);
  assert.equal(config.encryptionKey?.length, 32);
  const urlSafe = key.replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  assert.equal(readConfig({ ENCRYPTION_KEY: urlSafe }).encryptionKey?.length, 32);
});

Deno.test("config: errors name the variable and never a secret value", () => {
  const secret = "postgres://u:topsecret@h:5432/db";
  for (
    const [env, variable] of [
      [{ DATABASE_URL: "mysql://u:topsecret@h/db" }, "DATABASE_URL"],
      [{ ENCRYPTION_KEY: "dG9vIHNob3J0" }, "ENCRYPTION_KEY"],
      [{ VALIDATION_AUDIT_RETENTION_DAYS: "0" }, "VALIDATION_AUDIT_RETENTION_DAYS"],
      [{ STOREB_OIDC_ISSUERS: " , " }, "STOREB_OIDC_ISSUERS"],
    ] as const
  ) {
    assert.throws(() => readConfig(env), (e) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(e.variable, variable);
      assert.ok(!e.message.includes("topsecret"));
      assert.ok(!e.message.includes("dG9vIHNob3J0"));
      return true;
    });
  }
  assert.equal(readConfig({ DATABASE_URL: secret }).databaseUrl, secret);
});

Deno.test("config: durations", () => {
  assert.equal(parseDuration("500ms"), 500);
  assert.equal(parseDuration("30s"), 30_000);
  assert.equal(parseDuration("2m"), 120_000);
  assert.equal(parseDuration("1h"), 3_600_000);
  assert.equal(parseDuration("1d"), 86_400_000);
  assert.equal(parseDuration("1.5s"), 1500);
  for (const bad of ["", "10", "s", "-1s", "1w", "1 s"]) assert.equal(parseDuration(bad), null);
});

Deno.test("secrets: seal and open, bound to purpose and owner, tamper-evident", async () => {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const box = new SecretBox(key);
  const sealed = await box.seal("webhook-secret", "tenant_a", "whsec_value");
  assert.match(sealed, /^v1\.[0-9a-f]{8}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/);
  assert.equal(sealed.split(".")[1], masterKeyId(key));
  assert.ok(!sealed.includes("whsec_value"));
  assert.equal(await box.open("webhook-secret", "tenant_a", sealed), "whsec_value");
  assert.notEqual(
    await box.seal("webhook-secret", "tenant_a", "whsec_value"),
    sealed,
    "fresh nonce",
  );
  await assert.rejects(box.open("webhook-secret", "tenant_b", sealed), SecretError);
  await assert.rejects(box.open("storea-private-key", "tenant_a", sealed), SecretError);
  const parts = sealed.split(".");
  const flipped = parts[3][0] === "A" ? "B" + parts[3].slice(1) : "A" + parts[3].slice(1);
  await assert.rejects(
    box.open("webhook-secret", "tenant_a", [...parts.slice(0, 3), flipped].join(".")),
    SecretError,
  );
  const other = new SecretBox(crypto.getRandomValues(new Uint8Array(32)));
  await assert.rejects(other.open("webhook-secret", "tenant_a", sealed), /master key/);
  await assert.rejects(box.open("webhook-secret", "tenant_a", "garbage"), SecretError);
});

Deno.test("rate limiter: burst, refill, per tenant, retry hint", () => {
  let now = 0;
  const limiter = new RateLimiter({ perSecond: 2, burst: 3, now: () => now });
  for (let i = 0; i < 3; i++) limiter.take("a");
  assert.throws(() => limiter.take("a"), (e) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.code, "RATE_LIMITED");
    assert.equal(e.status, 429);
    assert.deepEqual(e.details, { retryAfterSeconds: 1 });
    assert.equal(e.headers?.["Retry-After"], "1");
    return true;
  });
  limiter.take("b");
  now = 500; // one token back at 2 per second
  limiter.take("a");
  assert.throws(() => limiter.take("a"));
  now = 100_000; // never more than the burst
  for (let i = 0; i < 3; i++) limiter.take("a");
  assert.throws(() => limiter.take("a"));
  const slow = new RateLimiter({ perSecond: 0.1, burst: 1, now: () => 0 });
  slow.take("x");
  assert.throws(() => slow.take("x"), (e) => (e as ServiceError).details?.retryAfterSeconds === 10);
});

Deno.test("api keys: minted shape, hashing, bearer parsing", () => {
  const live = mintApiKey("live");
  assert.match(live.token, /^service_live_[A-Za-z0-9_-]{43}$/);
  assert.match(mintApiKey("test").token, /^service_test_[A-Za-z0-9_-]{43}$/);
  assert.equal(live.hash, hashApiKey(live.token));
  assert.match(live.hash, /^[0-9a-f]{64}$/);
  assert.ok(live.token.startsWith(live.prefix));
  assert.ok(live.prefix.length < 20);
  assert.notEqual(mintApiKey("live").token, live.token);
  assert.equal(parseBearerKey(`Bearer ${live.token}`), live.token);
  assert.equal(parseBearerKey(`bearer ${live.token}`), live.token);
  for (
    const bad of [
      null,
      live.token,
      `Bearer`,
      `Bearer ${live.token} extra`,
      `Bearer service_dev_${"a".repeat(43)}`,
      `Bearer service_live_${"a".repeat(42)}`,
      `Bearer service_live_${"a".repeat(44)}`,
      `Bearer service_live_${"a".repeat(42)}=`,
    ]
  ) {
    assert.equal(parseBearerKey(bad), null, String(bad));
  }
});

Deno.test("router: params, 404 and 405", () => {
  const handler = () => new Response();
  const router = new Router([
    { method: "GET", pattern: "/health", handler },
    { method: "POST", pattern: "/v1/webhooks/storea/:tenantId", handler },
  ]);
  const found = router.match("POST", "/v1/webhooks/storea/tenant%5Fx");
  assert.equal(found.kind, "found");
  assert.deepEqual(found.kind === "found" && found.params, { tenantId: "tenant_x" });
  assert.deepEqual(router.match("GET", "/v1/webhooks/storea/t"), {
    kind: "method_not_allowed",
    allowed: ["POST"],
  });
  assert.equal(router.match("POST", "/v1/webhooks/storea/").kind, "not_found");
  assert.equal(router.match("POST", "/v1/webhooks/storea/%E0%A4%A").kind, "not_found");
  assert.equal(router.match("GET", "/health/").kind, "not_found");
  assert.equal(router.match("GET", "/HEALTH").kind, "not_found");
});

Deno.test("router: a route without parameters wins; other methods still reach the rest", () => {
  const exact = () => new Response("exact");
  const param = () => new Response("param");
  const router = new Router([
    { method: "GET", pattern: "/v1/items/:id", handler: param },
    { method: "GET", pattern: "/v1/items/new", handler: exact },
    { method: "POST", pattern: "/v1/items/:id", handler: param },
  ]);
  const get = router.match("GET", "/v1/items/new");
  assert.ok(get.kind === "found" && get.handler === exact);
  assert.deepEqual(get.params, {});
  const post = router.match("POST", "/v1/items/new");
  assert.ok(post.kind === "found" && post.handler === param);
  assert.deepEqual(post.params, { id: "new" });
  assert.deepEqual(router.match("DELETE", "/v1/items/new"), {
    kind: "method_not_allowed",
    allowed: ["GET", "POST"],
  });
  const other = router.match("GET", "/v1/items/7");
  assert.ok(other.kind === "found" && other.handler === param);
  assert.deepEqual(other.params, { id: "7" });
});

Deno.test("ids: prefix and ULID, monotonic", () => {
  const ids = Array.from({ length: 1000 }, () => newId("evt"));
  for (const id of ids) assert.ok(isId("evt", id), id);
  assert.deepEqual([...ids].sort(), ids);
  assert.equal(new Set(ids).size, ids.length);
  assert.equal(isId("tenant", ids[0]), false);
});

Deno.test("ids: the time part encodes the millisecond; the random part counts up and carries", () => {
  let clock = 1469918176385; // the ULID specification's example: 01ARYZ6S41
  // High half 0, low half 2^40 - 1: the second id of the millisecond carries into the high half.
  const next = ulidFactory(
    () => clock,
    (bytes) => bytes.set([0, 0, 0, 0, 0, 255, 255, 255, 255, 255]),
  );
  const first = next();
  const second = next();
  assert.equal(first, "01ARYZ6S41" + "00000000" + "ZZZZZZZZ");
  assert.equal(second, "01ARYZ6S41" + "00000001" + "00000000");
  // A clock that steps back keeps counting in the last millisecond: order is kept.
  clock -= 5;
  const third = next();
  assert.equal(third, "01ARYZ6S41" + "00000001" + "00000001");
  clock += 10;
  const fourth = next();
  assert.ok(fourth.startsWith("01ARYZ6S46"), fourth); // 5 ms after the first
  assert.deepEqual([first, second, third, fourth].toSorted(), [first, second, third, fourth]);
});

Deno.test("logger: JSON lines with ts, level, msg; levels; no stack in production", () => {
  const chunks: string[] = [];
  const logger = new Logger({
    level: "info",
    write: (bytes) => chunks.push(new TextDecoder().decode(bytes)),
  });
  logger.debug("hidden");
  logger.info("shown", { a: 1 });
  logger.error("failed", logger.errorFields(new TypeError("boom")));
  logger.flush();
  const lines = chunks.join("").trim().split("\n").map((line) => JSON.parse(line));
  assert.deepEqual(lines.map((l) => l.msg), ["shown", "failed"]);
  assert.deepEqual(Object.keys(lines[0]), ["ts", "level", "msg", "a"]);
  assert.equal(lines[1].errorClass, "TypeError");
  assert.ok(lines[1].stack.includes("boom"));
  logger.configure({ level: "info", production: true });
  const fields = logger.errorFields(new TypeError("secret detail"));
  assert.deepEqual(fields, { errorClass: "TypeError" });
});

Deno.test("logger: the timestamp follows the clock across milliseconds", async () => {
  const chunks: string[] = [];
  const logger = new Logger({ write: (bytes) => chunks.push(new TextDecoder().decode(bytes)) });
  const before = Date.now();
  logger.info("first");
  await new Promise((resolve) => setTimeout(resolve, 5));
  logger.info("second");
  logger.flush();
  const [first, second] = chunks.join("").trim().split("\n").map((l) =>
    Date.parse(JSON.parse(l).ts)
  );
  assert.ok(first >= before && first <= Date.now());
  assert.ok(second - first >= 4, `${first} then ${second}`);
});
