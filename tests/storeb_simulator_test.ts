/** The store B simulator is only as useful as it is strict: it refuses what Google refuses. */
import assert from "node:assert/strict";
import { importPKCS8, SignJWT } from "jose";
import { createServiceAccount } from "../simulators/service_account.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
  type StorebSimulator,
} from "../simulators/storeb_play.ts";

const SCOPE = "https://www.googleapis.com/auth/androidpublisher";
const GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer";

interface AssertionFields {
  iss: string;
  aud: string;
  scope?: string;
  iat?: number;
  exp?: number;
  kid?: string;
}

async function assertion(privateKeyPem: string, fields: AssertionFields): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  const iat = fields.iat ?? now;
  return await new SignJWT(fields.scope === undefined ? {} : { scope: fields.scope })
    .setProtectedHeader({ alg: "RS256", typ: "JWT", ...(fields.kid ? { kid: fields.kid } : {}) })
    .setIssuer(fields.iss)
    .setAudience(fields.aud)
    .setIssuedAt(iat)
    .setExpirationTime(fields.exp ?? iat + 3600)
    .sign(await importPKCS8(privateKeyPem, "RS256"));
}

async function requestToken(
  play: StorebSimulator,
  jwt: string,
  grantType = GRANT,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(play.tokenUrl, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ grant_type: grantType, assertion: jwt }),
  });
  return { status: response.status, body: await response.json() };
}

function subscriptionUrl(play: StorebSimulator, packageName: string, token: string): string {
  return `${play.apiUrl}/androidpublisher/v3/applications/${
    encodeURIComponent(packageName)
  }/purchases/subscriptionsv2/tokens/${encodeURIComponent(token)}`;
}

async function get(url: string, accessToken?: string): Promise<Response> {
  return await fetch(url, {
    headers: accessToken ? { authorization: `Bearer ${accessToken}` } : {},
  });
}

Deno.test("storeb simulator: the token endpoint checks assertions as Google does", async (t) => {
  const play = await startStorebSimulator();
  try {
    const account = await createServiceAccount();
    const stranger = await createServiceAccount({ clientEmail: account.clientEmail });
    await play.addServiceAccount(account);
    const good = { iss: account.clientEmail, aud: play.tokenUrl, scope: SCOPE };

    await t.step("a well-formed assertion gets a bearer token", async () => {
      const { status, body } = await requestToken(
        play,
        await assertion(account.privateKeyPem, { ...good, kid: account.privateKeyId }),
      );
      assert.equal(status, 200);
      assert.equal(body.token_type, "Bearer");
      assert.equal(body.expires_in, 3599);
      assert.equal(typeof body.access_token, "string");
      assert.deepEqual(play.issuedAccessTokens, [body.access_token]);
    });

    const refusals: [string, () => Promise<string>, string, string][] = [
      [
        "signed with another key",
        () => assertion(stranger.privateKeyPem, good),
        "invalid_grant",
        "Signature",
      ],
      [
        "another audience",
        () =>
          assertion(account.privateKeyPem, { ...good, aud: "https://oauth2.googleapis.com/token" }),
        "invalid_grant",
        "audience",
      ],
      [
        "an unknown issuer",
        () => assertion(account.privateKeyPem, { ...good, iss: "nobody@example.com" }),
        "invalid_grant",
        "account not found",
      ],
      [
        "another key id",
        () => assertion(account.privateKeyPem, { ...good, kid: "0000" }),
        "invalid_grant",
        "Signature",
      ],
      [
        "no androidpublisher scope",
        () =>
          assertion(account.privateKeyPem, {
            ...good,
            scope: "https://www.googleapis.com/auth/cloud-platform",
          }),
        "invalid_scope",
        "scope",
      ],
      [
        "a lifetime over an hour",
        () => {
          const iat = Math.floor(Date.now() / 1000);
          return assertion(account.privateKeyPem, { ...good, iat, exp: iat + 3601 });
        },
        "invalid_grant",
        "short-lived",
      ],
      [
        "an expired assertion",
        () => {
          const iat = Math.floor(Date.now() / 1000) - 4000;
          return assertion(account.privateKeyPem, { ...good, iat, exp: iat + 3600 });
        },
        "invalid_grant",
        "short-lived",
      ],
      ["not a JWT", () => Promise.resolve("not-a-jwt"), "invalid_grant", "malformed"],
    ];
    for (const [name, make, error, description] of refusals) {
      await t.step(`refused: ${name}`, async () => {
        const { status, body } = await requestToken(play, await make());
        assert.equal(status, 400);
        assert.equal(body.error, error);
        assert.match(String(body.error_description), new RegExp(description));
      });
    }

    await t.step("refused: another grant type", async () => {
      const { status, body } = await requestToken(
        play,
        await assertion(account.privateKeyPem, good),
        "client_credentials",
      );
      assert.equal(status, 400);
      assert.equal(body.error, "unsupported_grant_type");
    });

    await t.step("an account can be registered by its private key", async () => {
      const other = await createServiceAccount();
      await play.addServiceAccount({
        clientEmail: other.clientEmail,
        privateKeyPem: other.privateKeyPem,
      });
      const { status } = await requestToken(
        play,
        await assertion(other.privateKeyPem, { ...good, iss: other.clientEmail }),
      );
      assert.equal(status, 200);
    });
    assert.equal(play.issuedAccessTokens.length, 2, "no refused assertion got a token");
  } finally {
    await play.close();
  }
});

Deno.test("storeb simulator: the API wants its own live tokens and answers what it holds", async (t) => {
  const play = await startStorebSimulator();
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const token = "tok/with?odd#chars é";
    const purchase = sampleSubscriptionPurchase();
    play.addSubscription({ packageName: "com.example.app", purchaseToken: token, purchase });
    const product = sampleProductPurchase();
    play.addProduct({
      packageName: "com.example.app",
      productId: "coins_100",
      purchaseToken: "p1",
      purchase: product,
    });
    const { body } = await requestToken(
      play,
      await assertion(account.privateKeyPem, {
        iss: account.clientEmail,
        aud: play.tokenUrl,
        scope: SCOPE,
      }),
    );
    const accessToken = body.access_token as string;
    const url = subscriptionUrl(play, "com.example.app", token);

    await t.step("no token, or one it did not issue: 401 UNAUTHENTICATED", async () => {
      for (const bearer of [undefined, "ya29.forged"]) {
        const response = await get(url, bearer);
        assert.equal(response.status, 401);
        assert.equal((await response.json()).error.status, "UNAUTHENTICATED");
      }
    });

    await t.step("registered purchases are answered; others are 404 NOT_FOUND", async () => {
      const found = await get(url, accessToken);
      assert.equal(found.status, 200);
      assert.deepEqual(await found.json(), purchase);
      const productUrl =
        `${play.apiUrl}/androidpublisher/v3/applications/com.example.app/purchases/products/coins_100/tokens/p1`;
      assert.deepEqual(await (await get(productUrl, accessToken)).json(), product);
      const missing = await get(subscriptionUrl(play, "com.example.app", "nope"), accessToken);
      assert.equal(missing.status, 404);
      assert.deepEqual((await missing.json()).error.code, 404);
      assert.equal(
        (await get(productUrl.replace("coins_100", "coins_200"), accessToken)).status,
        404,
      );
    });

    await t.step("scripts answer the next calls, then it answers normally", async () => {
      play.script({ status: 503, times: 2 });
      play.script({ status: 429, headers: { "retry-after": "7" }, purchaseToken: "other" });
      for (let i = 0; i < 2; i++) {
        const response = await get(url, accessToken);
        assert.equal(response.status, 503);
        assert.equal((await response.json()).error.status, "UNAVAILABLE");
      }
      assert.equal((await get(url, accessToken)).status, 200, "the 429 is for another token");
      const limited = await get(subscriptionUrl(play, "com.example.app", "other"), accessToken);
      assert.equal(limited.status, 429);
      assert.equal(limited.headers.get("retry-after"), "7");
      await limited.body?.cancel();
    });

    await t.step("a scripted reset is a network error for the caller", async () => {
      play.script({ reset: true });
      await assert.rejects(async () => await (await get(url, accessToken)).text(), TypeError);
      assert.equal((await get(url, accessToken)).status, 200);
    });

    await t.step("a scripted delay slows the answer down", async () => {
      play.script({ delayMs: 300 });
      const started = performance.now();
      assert.equal((await get(url, accessToken)).status, 200);
      assert.ok(performance.now() - started >= 290);
    });

    await t.step("revoked tokens are refused", async () => {
      play.revokeAccessTokens();
      const response = await get(url, accessToken);
      assert.equal(response.status, 401);
      await response.body?.cancel();
    });

    await t.step("every call is counted", () => {
      assert.equal(play.tokenRequests, 1);
      assert.equal(play.apiRequests, 14);
    });
  } finally {
    await play.close();
  }
});

Deno.test("storeb simulator: access tokens expire after their lifetime", async () => {
  const play = await startStorebSimulator({ accessTokenLifetimeSeconds: 1 });
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    play.addSubscription({
      packageName: "com.example.app",
      purchaseToken: "t",
      purchase: sampleSubscriptionPurchase(),
    });
    const { body } = await requestToken(
      play,
      await assertion(account.privateKeyPem, {
        iss: account.clientEmail,
        aud: play.tokenUrl,
        scope: SCOPE,
      }),
    );
    assert.equal(body.expires_in, 1);
    const url = subscriptionUrl(play, "com.example.app", "t");
    assert.equal((await get(url, body.access_token as string)).status, 200);
    await new Promise((r) => setTimeout(r, 1100));
    const expired = await get(url, body.access_token as string);
    assert.equal(expired.status, 401);
    await expired.body?.cancel();
  } finally {
    await play.close();
  }
});
