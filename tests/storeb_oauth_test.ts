/** Store B access tokens against the simulator's token endpoint. */
import assert from "node:assert/strict";
import { decodeJwt, decodeProtectedHeader } from "jose";
import { ServiceError } from "../src/errors.ts";
import {
  AccessTokenSource,
  parseServiceAccount,
  type ServiceAccount,
  ServiceAccountError,
} from "../src/storeb/oauth.ts";
import {
  createServiceAccount,
  type GeneratedServiceAccount,
} from "../simulators/service_account.ts";
import { startStorebSimulator, type StorebSimulator } from "../simulators/storeb_play.ts";

async function registeredAccount(
  play: StorebSimulator,
): Promise<{ generated: GeneratedServiceAccount; account: ServiceAccount }> {
  const generated = await createServiceAccount();
  await play.addServiceAccount(generated);
  return { generated, account: parseServiceAccount(generated.json) };
}

function googleApiError(error: unknown, status: number | null, upstreamCode: string | null) {
  assert.ok(error instanceof ServiceError, String(error));
  assert.equal(error.code, "GOOGLE_API_ERROR");
  assert.equal(error.status, 502);
  assert.deepEqual(error.details, { status, upstreamCode });
  return true;
}

Deno.test("oauth: one token request, shared by concurrent callers, then cached", async () => {
  const play = await startStorebSimulator();
  try {
    const { account } = await registeredAccount(play);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl });
    // A slow endpoint: every caller misses the cache while the first request runs.
    play.script({ endpoint: "token", delayMs: 200 });
    const concurrent = await Promise.all(
      Array.from({ length: 8 }, () => tokens.accessToken(account)),
    );
    assert.equal(play.tokenRequests, 1);
    assert.equal(new Set(concurrent).size, 1);
    for (let i = 0; i < 5; i++) assert.equal(await tokens.accessToken(account), concurrent[0]);
    assert.equal(play.tokenRequests, 1, "cached");

    const other = await registeredAccount(play);
    assert.notEqual(await tokens.accessToken(other.account), concurrent[0]);
    assert.equal(play.tokenRequests, 2, "one token per service account");
  } finally {
    await play.close();
  }
});

Deno.test("oauth: the assertion is the one Google expects", async () => {
  const { generated, account } = await (async () => {
    const g = await createServiceAccount();
    return { generated: g, account: parseServiceAccount(g.json) };
  })();
  const seen: URLSearchParams[] = [];
  const types: (string | null)[] = [];
  // A stand-in token endpoint that records what it receives.
  const endpoint = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (request) => {
      types.push(request.headers.get("content-type"));
      seen.push(new URLSearchParams(await request.text()));
      return Response.json({ access_token: "recorded", expires_in: 3599, token_type: "Bearer" });
    },
  );
  try {
    const tokenUrl = `http://127.0.0.1:${endpoint.addr.port}/some/token`;
    const tokens = new AccessTokenSource({ tokenUrl });
    assert.equal(await tokens.accessToken(account), "recorded");
    assert.equal(types[0], "application/x-www-form-urlencoded");
    assert.equal(seen[0].get("grant_type"), "urn:ietf:params:oauth:grant-type:jwt-bearer");
    const jwt = seen[0].get("assertion")!;
    const header = decodeProtectedHeader(jwt);
    const claims = decodeJwt(jwt);
    assert.deepEqual(header, { alg: "RS256", typ: "JWT", kid: generated.privateKeyId });
    assert.equal(claims.iss, generated.clientEmail);
    assert.equal(claims.aud, tokenUrl, "aud is the configured token URL");
    assert.equal(claims.scope, "https://www.googleapis.com/auth/androidpublisher");
    assert.equal((claims.exp as number) - (claims.iat as number), 3600);
    assert.ok(Math.abs((claims.iat as number) - Date.now() / 1000) < 5);
  } finally {
    await endpoint.shutdown();
  }
});

Deno.test("oauth: invalidate drops only the refused token, so one refresh serves everyone", async () => {
  const play = await startStorebSimulator();
  try {
    const { account } = await registeredAccount(play);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl });
    const first = await tokens.accessToken(account);
    // Three calls were refused with the same token at once.
    tokens.invalidate(account, first);
    const second = await tokens.accessToken(account);
    tokens.invalidate(account, first);
    tokens.invalidate(account, first);
    assert.equal(await tokens.accessToken(account), second);
    assert.notEqual(second, first);
    assert.equal(play.tokenRequests, 2);
  } finally {
    await play.close();
  }
});

Deno.test("oauth: tokens are replaced 5 minutes before they expire", async () => {
  const play = await startStorebSimulator({ accessTokenLifetimeSeconds: 300 });
  try {
    const { account } = await registeredAccount(play);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl });
    // 300 s left: inside the margin, so each is used once and never cached.
    const a = await tokens.accessToken(account);
    const b = await tokens.accessToken(account);
    assert.notEqual(a, b);
    assert.equal(play.tokenRequests, 2);
    // 301 s left: cached for one second.
    play.accessTokenLifetimeSeconds = 301;
    const c = await tokens.accessToken(account);
    assert.equal(await tokens.accessToken(account), c);
    assert.equal(play.tokenRequests, 3);
    await new Promise((r) => setTimeout(r, 1100));
    assert.notEqual(await tokens.accessToken(account), c);
    assert.equal(play.tokenRequests, 4);
  } finally {
    await play.close();
  }
});

Deno.test("oauth: a rotated key gets its own token", async () => {
  const play = await startStorebSimulator();
  try {
    const before = await createServiceAccount({ clientEmail: "relay@p.iam.gserviceaccount.com" });
    const after = await createServiceAccount({ clientEmail: "relay@p.iam.gserviceaccount.com" });
    await play.addServiceAccount(before);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl });
    await tokens.accessToken(parseServiceAccount(before.json));
    await play.addServiceAccount(after); // the simulator now knows only the new key
    await tokens.accessToken(parseServiceAccount(after.json));
    assert.equal(play.tokenRequests, 2, "the old key's token is not reused");
  } finally {
    await play.close();
  }
});

Deno.test("oauth: token endpoint failures are 502 GOOGLE_API_ERROR with the OAuth error", async () => {
  const play = await startStorebSimulator();
  try {
    const { account } = await registeredAccount(play);
    const unknown = parseServiceAccount((await createServiceAccount()).json);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl, timeoutMs: 300 });
    await assert.rejects(
      tokens.accessToken(unknown),
      (e) => googleApiError(e, 400, "invalid_grant"),
    );
    play.script({ endpoint: "token", status: 500, rawBody: "<html>oops</html>" });
    await assert.rejects(tokens.accessToken(account), (e) => googleApiError(e, 500, null));
    play.script({ endpoint: "token", status: 200, body: { token_type: "Bearer" } });
    await assert.rejects(tokens.accessToken(account), (e) => googleApiError(e, 200, null));
    play.script({ endpoint: "token", reset: true });
    await assert.rejects(tokens.accessToken(account), (e) => googleApiError(e, null, null));
    play.script({ endpoint: "token", delayMs: 3_000 });
    const started = performance.now();
    await assert.rejects(tokens.accessToken(account), (e) => googleApiError(e, null, null));
    assert.ok(performance.now() - started < 2_000, "the token request has its own deadline");
    // A failure is not cached.
    assert.match(await tokens.accessToken(account), /^ya29\./);
  } finally {
    await play.close();
  }
});

Deno.test("oauth: a caller's signal stops its wait, not the shared request", async () => {
  const play = await startStorebSimulator();
  try {
    const { account } = await registeredAccount(play);
    const tokens = new AccessTokenSource({ tokenUrl: play.tokenUrl });
    play.script({ endpoint: "token", delayMs: 300 });
    const patient = tokens.accessToken(account);
    const hasty = tokens.accessToken(account, { signal: AbortSignal.timeout(50) });
    await assert.rejects(hasty, (e) => e instanceof DOMException && e.name === "TimeoutError");
    assert.match(await patient, /^ya29\./);
    assert.equal(play.tokenRequests, 1);
  } finally {
    await play.close();
  }
});

Deno.test("oauth: unusable service-account files never quote their key", async () => {
  const { privateKeyPem } = await createServiceAccount();
  const body = privateKeyPem.split("\n")[1];
  const broken = [
    "not json",
    JSON.stringify({ private_key: privateKeyPem }),
    JSON.stringify({ client_email: "a@b.c" }),
  ];
  for (const text of broken) {
    assert.throws(
      () => parseServiceAccount(text),
      (e) => e instanceof ServiceAccountError && !e.message.includes(body),
    );
  }
  const notRsa = parseServiceAccount(
    JSON.stringify({ client_email: "a@b.c", private_key: "-----BEGIN PRIVATE KEY-----\nAAAA" }),
  );
  const tokens = new AccessTokenSource({ tokenUrl: "http://127.0.0.1:9/token" });
  await assert.rejects(tokens.accessToken(notRsa), ServiceAccountError);
  const account = parseServiceAccount(
    JSON.stringify({ client_email: "a@b.c", private_key: privateKeyPem }),
  );
  assert.equal(account.privateKeyId, null);
  assert.ok(!account.cacheKey.includes(body));
});
