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

Deno.test("storeb simulator: acknowledge and consume change the stored purchase", async (t) => {
  const play = await startStorebSimulator();
  try {
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const { body } = await requestToken(
      play,
      await assertion(account.privateKeyPem, {
        iss: account.clientEmail,
        aud: play.tokenUrl,
        scope: SCOPE,
      }),
    );
    const accessToken = body.access_token as string;
    const app = `${play.apiUrl}/androidpublisher/v3/applications/com.example.app/purchases`;
    const post = (path: string, init: { body?: string; bearer?: string | null } = {}) =>
      fetch(`${app}${path}`, {
        method: "POST",
        headers: init.bearer === null
          ? {}
          : { authorization: `Bearer ${init.bearer ?? accessToken}` },
        body: init.body,
      });
    const subscriptionAck = (token: string) =>
      `/subscriptions/premium_monthly/tokens/${encodeURIComponent(token)}:acknowledge`;
    const productWrite = (token: string, action: "acknowledge" | "consume") =>
      `/products/coins_100/tokens/${encodeURIComponent(token)}:${action}`;
    const addSubscription = (token: string, overrides = {}) =>
      play.addSubscription({
        packageName: "com.example.app",
        purchaseToken: token,
        purchase: sampleSubscriptionPurchase({
          acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING",
          ...overrides,
        }),
      });
    const addProduct = (token: string, overrides = {}) =>
      play.addProduct({
        packageName: "com.example.app",
        productId: "coins_100",
        purchaseToken: token,
        purchase: sampleProductPurchase({ acknowledgementState: 0, ...overrides }),
      });

    await t.step("a subscription is acknowledged; again is 200 and changes nothing", async () => {
      addSubscription("s:1/é");
      const first = await post(subscriptionAck("s:1/é"), { body: "{}" });
      assert.equal(first.status, 200);
      assert.equal(await first.text(), "");
      assert.equal(
        play.subscription("com.example.app", "s:1/é")?.acknowledgementState,
        "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED",
      );
      const read = await get(subscriptionUrl(play, "com.example.app", "s:1/é"), accessToken);
      assert.equal((await read.json()).acknowledgementState, "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED");
      const again = await post(subscriptionAck("s:1/é"));
      assert.equal(again.status, 200);
      await again.body?.cancel();
    });

    await t.step("a product is acknowledged; consuming sets both states", async () => {
      addProduct("p1");
      assert.equal((await post(productWrite("p1", "acknowledge"), { body: "{}" })).status, 200);
      assert.equal(play.product("com.example.app", "coins_100", "p1")?.acknowledgementState, 1);
      assert.equal(play.product("com.example.app", "coins_100", "p1")?.consumptionState, 0);
      addProduct("p2");
      assert.equal((await post(productWrite("p2", "consume"))).status, 200);
      const consumed = play.product("com.example.app", "coins_100", "p2");
      assert.equal(consumed?.consumptionState, 1);
      assert.equal(consumed?.acknowledgementState, 1, "consuming acknowledges");
    });

    await t.step("pending purchases are refused with FAILED_PRECONDITION", async () => {
      addSubscription("s-pending", { subscriptionState: "SUBSCRIPTION_STATE_PENDING" });
      addProduct("p-pending", { purchaseState: 2 });
      for (
        const path of [
          subscriptionAck("s-pending"),
          productWrite("p-pending", "acknowledge"),
          productWrite("p-pending", "consume"),
        ]
      ) {
        const response = await post(path);
        assert.equal(response.status, 400, path);
        assert.equal((await response.json()).error.status, "FAILED_PRECONDITION");
      }
      assert.equal(
        play.subscription("com.example.app", "s-pending")?.acknowledgementState,
        "ACKNOWLEDGEMENT_STATE_PENDING",
      );
      assert.equal(play.product("com.example.app", "coins_100", "p-pending")?.consumptionState, 0);
    });

    await t.step("unknown purchases, bad bodies and missing tokens are refused", async () => {
      const unknown = await post(productWrite("nope", "consume"));
      assert.equal(unknown.status, 404);
      await unknown.body?.cancel();
      addProduct("p3");
      const withBody = await post(productWrite("p3", "consume"), { body: "{}" });
      assert.equal(withBody.status, 400, "consume takes no body");
      await withBody.body?.cancel();
      const notJson = await post(productWrite("p3", "acknowledge"), { body: "nope" });
      assert.equal(notJson.status, 400);
      await notJson.body?.cancel();
      const anonymous = await post(productWrite("p3", "acknowledge"), { bearer: null });
      assert.equal(anonymous.status, 401);
      await anonymous.body?.cancel();
      const wrongMethod = await get(`${app}${productWrite("p3", "consume")}`, accessToken);
      assert.equal(wrongMethod.status, 404);
      await wrongMethod.body?.cancel();
      assert.equal(play.product("com.example.app", "coins_100", "p3")?.acknowledgementState, 0);
    });

    await t.step("scripts can target one operation, and do the write or not", async () => {
      addProduct("p4");
      play.script({ operation: "consume", status: 503 });
      assert.equal((await get(`${app}/products/coins_100/tokens/p4`, accessToken)).status, 200);
      const failed = await post(productWrite("p4", "consume"));
      assert.equal(failed.status, 503);
      await failed.body?.cancel();
      assert.equal(play.product("com.example.app", "coins_100", "p4")?.consumptionState, 0);
      play.script({ operation: "consume", reset: true, applyWrite: true });
      await assert.rejects(async () => await (await post(productWrite("p4", "consume"))).text());
      assert.equal(play.product("com.example.app", "coins_100", "p4")?.consumptionState, 1);
      addProduct("p5");
      play.script({ operation: "acknowledge", delayMs: 200, applyWrite: true });
      const slow = post(productWrite("p5", "acknowledge"));
      await new Promise((resolve) => setTimeout(resolve, 50));
      assert.equal(
        play.product("com.example.app", "coins_100", "p5")?.acknowledgementState,
        1,
        "done before the answer",
      );
      assert.equal((await slow).status, 200);
    });

    await t.step("calls are logged by operation and purchase token", () => {
      assert.equal(play.calls({ operation: "consume", purchaseToken: "p4" }).length, 2);
      assert.equal(play.calls({ operation: "get", purchaseToken: "p4" }).length, 1);
      assert.equal(play.calls({ purchaseToken: "s:1/é" }).length, 3);
      assert.equal(play.calls({ operation: "acknowledge", purchaseToken: "p5" }).length, 1);
      assert.equal(play.calls({ purchaseToken: "never-asked" }).length, 0);
      assert.equal(play.calls().length, play.apiRequests);
    });
  } finally {
    await play.close();
  }
});
