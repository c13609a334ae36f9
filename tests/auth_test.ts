/** API keys and the rate limit through real services. */
import assert from "node:assert/strict";
import { createTenantWithKey, ENGINE, startService, stopAndDrop } from "./helpers/service.ts";

const BODY = '{"transactionId":"1"}';

function verify(url: string, authorization?: string): Promise<Response> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (authorization !== undefined) headers.authorization = authorization;
  return fetch(`${url}/v1/storea/verify`, { method: "POST", headers, body: BODY });
}

async function codeOf(response: Response): Promise<string> {
  return (await response.json()).error;
}

Deno.test("auth: missing, malformed, unknown, revoked keys and inactive tenants", async (t) => {
  const service = await startService();
  try {
    const { key, keyId, tenantId } = await createTenantWithKey(service);
    await t.step("a valid key passes authentication", async () => {
      assert.equal(await codeOf(await verify(service.url, `Bearer ${key}`)), "CREDENTIALS_MISSING");
      assert.equal(
        await codeOf(await verify(service.url, `bearer  ${key}`)),
        "CREDENTIALS_MISSING",
        "scheme is case-insensitive",
      );
    });
    await t.step("anything else is 401 UNAUTHENTICATED", async () => {
      const wrong = [
        undefined,
        "",
        key,
        `Basic ${key}`,
        `Bearer ${key}x`,
        `Bearer ${key.slice(0, -1)}`,
        `Bearer ${key.replace("service_test_", "service_prod_")}`,
        `Bearer ${key.replace("service_test_", "service_live_")}`,
        `Bearer service_test_${"A".repeat(43)}`,
        `Bearer ${key.slice(0, -1)}!`,
      ];
      for (const header of wrong) {
        const response = await verify(service.url, header);
        assert.equal(response.status, 401, `header ${header}`);
        assert.equal(await codeOf(response), "UNAUTHENTICATED");
      }
    });
    await t.step("a deactivated tenant's keys stop working within a second", async () => {
      assert.equal((await service.cli("tenant", "deactivate", tenantId)).code, 0);
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal((await verify(service.url, `Bearer ${key}`)).status, 401);
      assert.equal((await service.cli("tenant", "activate", tenantId)).code, 0);
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(await codeOf(await verify(service.url, `Bearer ${key}`)), "CREDENTIALS_MISSING");
    });
    await t.step("lastUsedAt is written in the background", async () => {
      const deadline = Date.now() + 8000;
      let lastUsedAt = null;
      while (Date.now() < deadline && lastUsedAt === null) {
        const list = await service.cli("key", "list", tenantId);
        lastUsedAt = list.json.keys.find((k: { id: string }) => k.id === keyId).lastUsedAt;
        if (lastUsedAt === null) await new Promise((r) => setTimeout(r, 500));
      }
      assert.ok(lastUsedAt !== null, "lastUsedAt written within the flush interval");
    });
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("auth: a key revoked while the service runs is refused within one second", async () => {
  // One process, so it runs on both engines (the replicas' test below needs PostgreSQL).
  const service = await startService();
  try {
    const { key, keyId, tenantId } = await createTenantWithKey(service);
    const kept = await service.cli("key", "create", tenantId, "--env", "test");
    assert.equal(kept.code, 0, kept.stderr);
    const use = async (token: string) => await codeOf(await verify(service.url, `Bearer ${token}`));
    // The key stays in use, hence cached, until the revocation commits and after it.
    const answers: string[] = [await use(key)];
    let revokedAt: number | null = null;
    // The command exits after its commit: from then on the key must go within a second.
    const revoking = service.cli("key", "revoke", keyId).finally(() => revokedAt = Date.now());
    while (revokedAt === null || Date.now() < revokedAt + 1000) {
      answers.push(await use(key));
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    const revoke = await revoking;
    assert.equal(revoke.code, 0, revoke.stderr);
    // Sent a second after the revocation: refused.
    assert.equal(await use(key), "UNAUTHENTICATED");
    assert.equal(answers[0], "CREDENTIALS_MISSING", "the key worked before its revocation");
    // Once refused, refused for good: no cached copy of the key comes back.
    const refused = answers.indexOf("UNAUTHENTICATED");
    assert.ok(refused > 0, `never refused within the second: ${answers.length} answers`);
    assert.deepEqual([...new Set(answers.slice(refused))], ["UNAUTHENTICATED"]);
    // Only that key: the tenant's other key still authenticates.
    assert.equal(await use(kept.json.key), "CREDENTIALS_MISSING");
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test({
  name: "auth: a revoked key is refused by every replica within one second",
  // Replicas run on PostgreSQL; the embedded engine serves one service process.
  ignore: ENGINE === "embedded",
}, async () => {
  const first = await startService();
  const second = await startService({ db: first.db });
  try {
    const { key, keyId } = await createTenantWithKey(first);
    // Warm both replicas' caches with the key.
    for (const service of [first, second]) {
      assert.equal(await codeOf(await verify(service.url, `Bearer ${key}`)), "CREDENTIALS_MISSING");
    }
    const revoke = await first.cli("key", "revoke", keyId);
    assert.equal(revoke.code, 0);
    const revokedAt = Date.now();
    await new Promise((r) => setTimeout(r, Math.max(0, revokedAt + 1000 - Date.now())));
    for (const service of [first, second]) {
      const response = await verify(service.url, `Bearer ${key}`);
      assert.equal(response.status, 401);
      assert.equal(await codeOf(response), "UNAUTHENTICATED");
    }
  } finally {
    await second.stop();
    await stopAndDrop(first);
  }
});

Deno.test("auth: lastUsedAt is flushed on shutdown", async () => {
  const service = await startService();
  try {
    const { key, keyId, tenantId } = await createTenantWithKey(service);
    await (await verify(service.url, `Bearer ${key}`)).body?.cancel();
    assert.equal(await service.stop(), 0);
    const list = await service.cli("key", "list", tenantId);
    const record = list.json.keys.find((k: { id: string }) => k.id === keyId);
    assert.ok(record.lastUsedAt !== null);
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("rate limit: token bucket per tenant, 429 with Retry-After, after auth and before body", async () => {
  const service = await startService({
    env: { RATE_LIMIT_BURST: "3", RATE_LIMIT_PER_SECOND: "0.5" },
  });
  try {
    const a = await createTenantWithKey(service);
    const b = await createTenantWithKey(service);
    for (let i = 0; i < 3; i++) {
      assert.equal(
        await codeOf(await verify(service.url, `Bearer ${a.key}`)),
        "CREDENTIALS_MISSING",
      );
    }
    const limited = await verify(service.url, `Bearer ${a.key}`);
    assert.equal(limited.status, 429);
    const body = await limited.json();
    assert.equal(body.valid, false);
    assert.equal(body.error, "RATE_LIMITED");
    assert.equal(typeof body.message, "string");
    assert.ok(Number.isInteger(body.details.retryAfterSeconds));
    assert.ok(body.details.retryAfterSeconds >= 1 && body.details.retryAfterSeconds <= 2);
    assert.equal(limited.headers.get("retry-after"), String(body.details.retryAfterSeconds));
    // Order: a bad key is 401 even when the tenant is limited; a bad body is 429.
    assert.equal((await verify(service.url, "Bearer nope")).status, 401);
    const badBody = await fetch(`${service.url}/v1/storeb/verify`, {
      method: "POST",
      headers: { authorization: `Bearer ${a.key}`, "content-type": "text/plain" },
      body: "x",
    });
    assert.equal(badBody.status, 429);
    await badBody.body?.cancel();
    // Another tenant has its own bucket.
    assert.equal(await codeOf(await verify(service.url, `Bearer ${b.key}`)), "CREDENTIALS_MISSING");
    // Tokens come back at the configured rate.
    await new Promise((r) => setTimeout(r, 2100));
    assert.equal(await codeOf(await verify(service.url, `Bearer ${a.key}`)), "CREDENTIALS_MISSING");
    // Health is never rate limited.
    for (let i = 0; i < 10; i++) assert.equal((await fetch(`${service.url}/health`)).status, 200);
  } finally {
    await stopAndDrop(service);
  }
});
