/** Boot, readiness, configuration failures and shutdown of real service processes. */
import assert from "node:assert/strict";
import net from "node:net";
import {
  createTenantWithKey,
  ENGINE,
  freshDatabase,
  startService,
  stopAndDrop,
  TEST_ENCRYPTION_KEY,
} from "./helpers/service.ts";
import { servicePermissions } from "../src/process/permissions.ts";

const OTHER_KEY = btoa(String.fromCharCode(...new Uint8Array(32).fill(9)));

Deno.test("lifecycle: listening once, shutdown once on SIGTERM and SIGINT, exit 0", async () => {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    const service = await startService();
    try {
      const listening = service.logs.filter((l) => l.msg === "listening");
      assert.equal(listening.length, 1);
      assert.equal(listening[0].port, service.port);
      assert.equal(listening[0].env, "test");
      assert.equal(await service.stop(signal), 0);
      const shutdown = service.logs.filter((l) => l.msg === "shutdown");
      assert.equal(shutdown.length, 1);
      assert.equal(shutdown[0].signal, signal);
      await assert.rejects(fetch(`${service.url}/health`));
    } finally {
      await stopAndDrop(service);
    }
  }
});

Deno.test("lifecycle: a request in flight finishes during shutdown; /ready says 503 meanwhile", async () => {
  const service = await startService();
  try {
    const { key } = await createTenantWithKey(service);
    // A body that arrives slowly keeps the request in flight while SIGTERM arrives.
    let push!: (chunk: Uint8Array) => void;
    let end!: () => void;
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        push = (chunk) => controller.enqueue(chunk);
        end = () => controller.close();
      },
    });
    const pending = fetch(`${service.url}/v1/storea/verify`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body,
    });
    push(new TextEncoder().encode('{"transactionId":'));
    await new Promise((r) => setTimeout(r, 300));
    const stopped = service.stop("SIGTERM");
    await service.waitForLog((l) => l.msg === "shutdown");
    // Draining: not ready any more, so a load balancer stops sending requests here.
    const ready = await fetch(`${service.url}/ready`, { headers: { connection: "close" } });
    assert.equal(ready.status, 503);
    assert.deepEqual(await ready.json(), {
      status: "degraded",
      version: "dev",
      checks: { db: "ok", encryption: "ok" },
      draining: true,
    });
    push(new TextEncoder().encode('"1"}'));
    end();
    const response = await pending;
    const text = await response.text();
    assert.equal(response.status, 400, text);
    assert.equal(JSON.parse(text).error, "CREDENTIALS_MISSING", text);
    assert.equal(await stopped, 0);
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("ready: 200 with both checks ok; a different key reports the encryption check failed", async () => {
  const service = await startService();
  try {
    const ready = await fetch(`${service.url}/ready`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), {
      status: "ok",
      version: "dev",
      checks: { db: "ok", encryption: "ok" },
    });
    assert.equal(await service.stop(), 0);

    // Same database, another key that decodes fine: the canary does not open.
    const wrongKey = await startService({ db: service.db, env: { ENCRYPTION_KEY: OTHER_KEY } });
    try {
      const response = await fetch(`${wrongKey.url}/ready`);
      assert.equal(response.status, 503);
      const body = await response.json();
      assert.equal(body.status, "degraded");
      assert.equal(body.version, "dev");
      assert.equal(body.checks.db, "ok");
      assert.match(body.checks.encryption, /^fail/);
      const health = await fetch(`${wrongKey.url}/health`);
      assert.equal(health.status, 200);
      await health.body?.cancel();
    } finally {
      await wrongKey.stop();
    }
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("boot: invalid configuration logs startup_failed (fatal) and exits 1", async () => {
  const db = await freshDatabase();
  try {
    const cases: [Record<string, string>, string, string?][] = [
      [{ PORT: "http" }, "PORT"],
      [{ PORT: "70000" }, "PORT"],
      [{ NODE_ENV: "staging" }, "NODE_ENV"],
      [{ LOG_LEVEL: "loud" }, "LOG_LEVEL"],
      [{ SERVICE_VERSION: "1.2" }, "SERVICE_VERSION"],
      [{ DATABASE_POOL_SIZE: "0" }, "DATABASE_POOL_SIZE"],
      [{ RATE_LIMIT_PER_SECOND: "-1" }, "RATE_LIMIT_PER_SECOND"],
      [{ RATE_LIMIT_BURST: "many" }, "RATE_LIMIT_BURST"],
      [{ VALIDATION_AUDIT_ENABLED: "maybe" }, "VALIDATION_AUDIT_ENABLED"],
      [{ DELIVERY_RETRY_SCHEDULE: "30s,soon" }, "DELIVERY_RETRY_SCHEDULE"],
      [{ DELIVERY_TIMEOUT: "10" }, "DELIVERY_TIMEOUT"],
      [{ UPSTREAM_TIMEOUT: "soon" }, "UPSTREAM_TIMEOUT"],
      [{ STOREB_API_URL: "ftp://x" }, "STOREB_API_URL"],
      [{ CALLBACK_ALLOW_INSECURE: "perhaps" }, "CALLBACK_ALLOW_INSECURE"],
      [{ CRYPTO_ENGINE: "fastest" }, "CRYPTO_ENGINE"],
      [{ ENCRYPTION_KEY: "c2hvcnQ=" }, "ENCRYPTION_KEY", "c2hvcnQ="],
      [{ ENCRYPTION_KEY: "not base64!!" }, "ENCRYPTION_KEY", "not base64!!"],
      [{ NODE_ENV: "production", ENCRYPTION_KEY: "" }, "ENCRYPTION_KEY"],
      [{ DATABASE_URL: "mysql://u:hunter2@h/db" }, "DATABASE_URL", "hunter2"],
    ];
    for (const [env, variable, secret] of cases) {
      const service = await startService({ db, env, waitUntilListening: false });
      const status = await service.exited;
      assert.equal(status.code, 1, JSON.stringify(env));
      const fatal = service.logs.find((l) => l.msg === "startup_failed");
      assert.ok(fatal, `startup_failed for ${JSON.stringify(env)}`);
      assert.equal(fatal.level, "fatal");
      assert.match(fatal.reason, new RegExp(variable));
      if (secret) assert.ok(!service.rawStdout().includes(secret), "secret value logged");
      assert.ok(!service.logs.some((l) => l.msg === "listening"));
    }
  } finally {
    await db.drop();
  }
});

Deno.test("boot: an unreachable database fails the boot after a bounded wait", async () => {
  const db = await freshDatabase();
  try {
    const started = Date.now();
    const service = await startService({
      db,
      env: {
        DATABASE_URL: "postgres://relay:s3cret-pass@127.0.0.1:1/none",
        DATABASE_CONNECT_TIMEOUT: "1s",
      },
      waitUntilListening: false,
    });
    const status = await service.exited;
    assert.equal(status.code, 1);
    assert.ok(Date.now() - started < 15_000);
    const fatal = service.logs.find((l) => l.msg === "startup_failed");
    assert.equal(fatal?.level, "fatal");
    assert.equal(fatal?.code, "DATABASE_UNAVAILABLE");
    assert.ok(!service.rawStdout().includes("s3cret-pass"));
  } finally {
    await db.drop();
  }
});

Deno.test("boot: the validation audit warning", async () => {
  const service = await startService({ env: { VALIDATION_AUDIT_ENABLED: "true" } });
  try {
    const warning = await service.waitForLog((l) =>
      l.msg === "validation_audit_enabled_no_retention"
    );
    assert.equal(warning.level, "warn");
    assert.equal(await service.stop(), 0);
    const retained = await startService({
      db: service.db,
      env: { VALIDATION_AUDIT_ENABLED: "true", VALIDATION_AUDIT_RETENTION_DAYS: "30" },
    });
    await retained.stop();
    assert.ok(!retained.logs.some((l) => l.msg === "validation_audit_enabled_no_retention"));
    const off = await startService({ db: service.db });
    await off.stop();
    assert.ok(!off.logs.some((l) => l.msg === "validation_audit_enabled_no_retention"));
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test("boot: outside production a missing key is generated once into DATA_DIR", async () => {
  const service = await startService({ env: { ENCRYPTION_KEY: "" } });
  try {
    const warning = service.logs.find((l) => l.msg === "encryption_key_generated");
    assert.equal(warning?.level, "warn");
    const path = `${service.db.dataDir}/encryption.key`;
    const info = await Deno.stat(path);
    assert.equal(info.mode! & 0o777, 0o600);
    const first = await Deno.readTextFile(path);
    assert.equal(await service.stop(), 0);
    const again = await startService({ db: service.db, env: { ENCRYPTION_KEY: "" } });
    await again.stop();
    assert.equal(await Deno.readTextFile(path), first);
    assert.ok(!again.logs.some((l) => l.msg === "encryption_key_generated"));
    assert.ok(!service.rawStdout().includes(first.trim()), "the key itself is never logged");
  } finally {
    await stopAndDrop(service);
  }
});

Deno.test({
  name: "database down: /health 200, /ready 503 db fail, verify 500 without a stack; recovers",
  ignore: ENGINE !== "postgresql",
  async fn() {
    const db = await freshDatabase();
    const target = new URL(db.env.DATABASE_URL);
    const proxy = await startProxy(Number(target.port || 5432));
    const viaProxy = new URL(db.env.DATABASE_URL);
    viaProxy.port = String(proxy.port);
    const service = await startService({
      db,
      env: {
        DATABASE_URL: viaProxy.toString(),
        NODE_ENV: "production",
        ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
      },
    });
    try {
      const { key } = await createTenantWithKey(service);
      proxy.down();
      // Let the key's cache entry lapse so the request must ask the database.
      await new Promise((r) => setTimeout(r, 1000));
      const health = await fetch(`${service.url}/health`);
      assert.equal(health.status, 200);
      await health.body?.cancel();
      const ready = await fetch(`${service.url}/ready`);
      assert.equal(ready.status, 503);
      const body = await ready.json();
      assert.equal(body.status, "degraded");
      assert.match(body.checks.db, /^fail/);
      assert.equal(body.checks.encryption, "ok");
      const verify = await fetch(`${service.url}/v1/storea/verify`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: '{"transactionId":"1"}',
      });
      assert.equal(verify.status, 500);
      assert.equal((await verify.json()).error, "INTERNAL_ERROR");
      const failure = await service.waitForLog((l) => l.msg === "request_failed");
      assert.equal(failure.code, "INTERNAL_ERROR");
      assert.equal(typeof failure.errorClass, "string");
      assert.equal(failure.stack, undefined, "no stack in production");

      proxy.up();
      const deadline = Date.now() + 15_000;
      let status = 0;
      while (Date.now() < deadline && status !== 200) {
        const again = await fetch(`${service.url}/ready`);
        status = again.status;
        await again.body?.cancel();
        if (status !== 200) await new Promise((r) => setTimeout(r, 250));
      }
      assert.equal(status, 200, "ready again without a restart");
    } finally {
      await service.stop();
      proxy.close();
      await db.drop();
    }
  },
});

/** A TCP proxy to PostgreSQL that the test can take down and bring back. */
async function startProxy(targetPort: number) {
  let accepting = true;
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    if (!accepting) return client.destroy();
    const upstream = net.connect(targetPort, "127.0.0.1");
    open.add(client);
    open.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const close = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on("error", close);
    upstream.on("error", close);
    client.on("close", close);
    upstream.on("close", close);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    get port() {
      return (server.address() as net.AddressInfo).port;
    },
    down() {
      accepting = false;
      for (const socket of open) socket.destroy();
    },
    up() {
      accepting = true;
    },
    close() {
      for (const socket of open) socket.destroy();
      server.close();
    },
  };
}

Deno.test("boot: the ES256 engine is OpenSSL when FFI is allowed, WebCrypto or a failure when not", async () => {
  const db = await freshDatabase();
  try {
    const withFfi = await startService({ db });
    assert.equal(withFfi.logs.find((l) => l.msg === "listening")?.cryptoEngine, "openssl");
    await withFfi.stop();

    const withoutFfi = servicePermissions(db.env).filter((flag) => !flag.startsWith("--allow-ffi"));
    const fallback = await startService({ db, permissions: withoutFfi });
    assert.equal(fallback.logs.find((l) => l.msg === "listening")?.cryptoEngine, "webcrypto");
    await fallback.stop();

    const forced = await startService({ db, env: { CRYPTO_ENGINE: "webcrypto" } });
    assert.equal(forced.logs.find((l) => l.msg === "listening")?.cryptoEngine, "webcrypto");
    await forced.stop();

    const refused = await startService({
      db,
      env: { CRYPTO_ENGINE: "openssl" },
      permissions: withoutFfi,
      waitUntilListening: false,
    });
    assert.equal((await refused.exited).code, 1);
    const fatal = refused.logs.find((l) => l.msg === "startup_failed");
    assert.equal(fatal?.level, "fatal");
    assert.match(fatal?.reason, /--allow-ffi/);
  } finally {
    await db.drop();
  }
});
