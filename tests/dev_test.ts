/**
 * `deno task dev` as a developer runs it: it starts, prints a tenant and an API key, and the
 * verify commands it prints answer 200 with a valid purchase of each store; a restart keeps the
 * tenant and the key; it refuses NODE_ENV=production. On the embedded engine from an empty
 * DATA_DIR, as on a fresh clone; with TEST_DATABASE_URL, on a fresh PostgreSQL database.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ENGINE, freshDatabase } from "./helpers/service.ts";
import { fetchLikeCurl, startDevLoop } from "./helpers/dev_loop.ts";

async function verifyBothStores(curlLines: string[]): Promise<void> {
  assert.equal(curlLines.length, 2, curlLines.join("\n"));
  const [storea, storeb] = curlLines;
  assert.match(storea, /\/v1\/storea\/verify /);
  assert.match(storeb, /\/v1\/storeb\/verify /);
  for (const line of curlLines) {
    const response = await fetchLikeCurl(line);
    const body = await response.json();
    assert.equal(response.status, 200, `${line}\n${JSON.stringify(body)}`);
    assert.equal(body.valid, true, JSON.stringify(body));
  }
}

Deno.test("deno task dev: a key, both stores verify with the printed curl, a restart keeps them", async () => {
  const database = await freshDatabase({ migrated: false });
  try {
    // No ENCRYPTION_KEY, no NODE_ENV: what a fresh clone has.
    const env = { ...database.env, PORT: "0" };
    const first = await startDevLoop(env);
    try {
      const { banner } = first;
      assert.match(banner.tenantId, /^tenant_[0-9A-Z]{26}$/);
      assert.match(banner.apiKey, /^service_test_[\w-]{43}$/);
      assert.equal(banner.callbackUrl, "http://localhost:3000/webhooks");
      assert.match(banner.webhookSecret, /^whsec_/);
      assert.equal(banner.kept, false);
      assert.match(banner.serviceUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
      await verifyBothStores(banner.curlLines);
      // The engine the caller's DATABASE_URL chose: deno task dev passes it on.
      const embedded = await Deno.stat(join(database.dataDir, "pglite")).then(
        () => true,
        () => false,
      );
      assert.equal(embedded, ENGINE === "embedded");
      // The signer's file exists while it runs, readable by its owner only.
      const signerFile = await Deno.stat(join(database.dataDir, "dev", "signer.json"));
      assert.equal(signerFile.mode! & 0o077, 0);
    } finally {
      assert.equal(await first.stop(), 0, first.output());
    }
    await assert.rejects(
      Deno.stat(join(database.dataDir, "dev", "signer.json")),
      Deno.errors.NotFound,
    );

    const second = await startDevLoop(env);
    try {
      assert.equal(second.banner.kept, true);
      assert.equal(second.banner.tenantId, first.banner.tenantId);
      assert.equal(second.banner.apiKey, first.banner.apiKey);
      await verifyBothStores(second.banner.curlLines);
    } finally {
      assert.equal(await second.stop(), 0, second.output());
    }
  } finally {
    await database.drop();
  }
});

Deno.test("deno task dev: refused with NODE_ENV=production, before it starts anything", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-dev-production-" });
  try {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["task", "-q", "dev"],
      cwd: new URL("../", import.meta.url),
      env: { NO_COLOR: "1", NODE_ENV: "production", DATA_DIR: join(dataDir, "data"), PORT: "0" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 2, stderr);
    assert.match(stderr, /refused when NODE_ENV is production/);
    await assert.rejects(Deno.stat(join(dataDir, "data")), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dataDir, { recursive: true });
  }
});
