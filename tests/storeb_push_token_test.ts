/**
 * Store B push tokens, verified against the fake Google OIDC issuer over loopback HTTP: the
 * error code of every kind of refusal, and the JWKS cache's fetch counts.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Buffer } from "node:buffer";
import { exportJWK, type JWK, SignJWT } from "jose";
import { ServiceError } from "../src/errors.ts";
import {
  bearerToken,
  MAX_JWKS_BYTES,
  MAX_JWKS_KEYS,
  type PushTokenExpectation,
  PushTokenVerifier,
  type PushTokenVerifierOptions,
} from "../src/storeb/push_token.ts";
import {
  oneTimeProductNotification,
  pushEnvelope,
  type PushTokenClaimsInput,
  type PushTokenIssuer,
  startPushTokenIssuer,
  subscriptionNotification,
  testNotification,
  voidedPurchaseNotification,
} from "../simulators/storeb_push.ts";

const AUDIENCE = "https://relay.example.com/v1/webhooks/storeb/tenant_01";
const EMAIL = "pubsub-push@example-project.iam.gserviceaccount.com";
const EXPECTED: PushTokenExpectation = { audience: AUDIENCE, serviceAccountEmail: EMAIL };
const ISSUERS = ["https://accounts.google.com", "accounts.google.com"];

/** A verifier of `issuer`'s tokens whose clock a test moves with `advance`. */
function verifierOf(
  issuer: PushTokenIssuer,
  options: Partial<PushTokenVerifierOptions> = {},
) {
  let clock = Date.now();
  const verifier = new PushTokenVerifier({
    certsUrl: issuer.certsUrl,
    issuers: ISSUERS,
    now: () => clock,
    ...options,
  });
  return {
    verifier,
    advance(ms: number) {
      clock += ms;
    },
  };
}

function mint(issuer: PushTokenIssuer, claims: Partial<PushTokenClaimsInput> = {}) {
  return issuer.mint({ audience: AUDIENCE, email: EMAIL, ...claims });
}

/** Asserts that `promise` rejects with a ServiceError of `code` that does not quote `token`. */
async function rejectsWith(
  promise: Promise<unknown>,
  code: "UNAUTHENTICATED" | "SIGNATURE_INVALID",
  token?: string,
): Promise<void> {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof ServiceError, `expected a ServiceError, got ${error}`);
    assert.equal(error.code, code, error.message);
    assert.equal(error.status, 401);
    if (token) assert.ok(!error.message.includes(token));
    return true;
  });
}

/** Asserts that `promise` rejects with an error that is not a ServiceError (a 500). */
async function rejectsPlain(promise: Promise<unknown>): Promise<void> {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof Error);
    assert.ok(!(error instanceof ServiceError), `expected a plain Error, got ${error}`);
    return true;
  });
}

/** A loopback URL on which nothing listens. */
async function closedUrl(): Promise<string> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}/oauth2/v3/certs`;
}

Deno.test("bearerToken: takes Bearer <token>, refuses anything else", () => {
  assert.equal(bearerToken("Bearer abc.def.ghi"), "abc.def.ghi");
  assert.equal(bearerToken("bearer abc.def.ghi"), "abc.def.ghi");
  for (const header of [null, "", "Bearer", "Bearer ", "Basic x", "Bearer a b", "abc.def.ghi"]) {
    assert.throws(() => bearerToken(header), (error) => {
      assert.ok(error instanceof ServiceError);
      assert.equal(error.code, "UNAUTHENTICATED");
      return true;
    });
  }
});

Deno.test("push token: each check answers its code", async (t) => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier } = verifierOf(issuer);
    const verify = async (claims: Partial<PushTokenClaimsInput>, expected = EXPECTED) => {
      const token = await mint(issuer, claims);
      return { token, result: verifier.verify(`Bearer ${token}`, expected) };
    };

    await t.step("a valid token passes and gives its claims", async () => {
      const claims = await (await verify({})).result;
      assert.equal(claims.iss, "https://accounts.google.com");
      assert.equal(claims.aud, AUDIENCE);
      assert.equal(claims.email, EMAIL);
      assert.match(claims.sub ?? "", /^1\d{20}$/);
      assert.equal(claims.exp - claims.iat!, 3600);
    });

    await t.step("the other accepted issuer passes", async () => {
      await (await verify({ issuer: "accounts.google.com" })).result;
    });

    await t.step("UNAUTHENTICATED: header missing or not Bearer", async () => {
      await rejectsWith(verifier.verify(null, EXPECTED), "UNAUTHENTICATED");
      await rejectsWith(verifier.verify("", EXPECTED), "UNAUTHENTICATED");
      await rejectsWith(verifier.verify("Basic x", EXPECTED), "UNAUTHENTICATED");
      const token = await mint(issuer);
      await rejectsWith(verifier.verify(`Basic ${token}`, EXPECTED), "UNAUTHENTICATED", token);
    });

    await t.step("UNAUTHENTICATED: garbage tokens", async () => {
      for (const token of ["garbage", "not.a.jwt", "a.b.c.d.e", "eyJhbGciOiJSUzI1NiJ9.e30"]) {
        await rejectsWith(
          verifier.verify(`Bearer ${token}`, EXPECTED),
          "UNAUTHENTICATED",
          token,
        );
      }
    });

    await t.step("UNAUTHENTICATED: expired, beyond the tolerance", async () => {
      const { token, result } = await verify({ expiresInSeconds: -60 });
      await rejectsWith(result, "UNAUTHENTICATED", token);
    });

    await t.step("expired within the 30 s tolerance still passes", async () => {
      await (await verify({ expiresInSeconds: -10 })).result;
    });

    await t.step("UNAUTHENTICATED: not yet valid", async () => {
      const issuedAt = Math.floor(Date.now() / 1000) + 600;
      await rejectsWith((await verify({ issuedAt })).result, "UNAUTHENTICATED");
    });

    await t.step("UNAUTHENTICATED: wrong or missing iss", async () => {
      await rejectsWith(
        (await verify({ issuer: "https://evil.example.com" })).result,
        "UNAUTHENTICATED",
      );
      await rejectsWith((await verify({ omit: ["iss"] })).result, "UNAUTHENTICATED");
    });

    await t.step("UNAUTHENTICATED: email_verified false or missing", async () => {
      await rejectsWith((await verify({ emailVerified: false })).result, "UNAUTHENTICATED");
      await rejectsWith((await verify({ omit: ["email_verified"] })).result, "UNAUTHENTICATED");
    });

    await t.step('UNAUTHENTICATED: email_verified a string, even "true"', async () => {
      // Exactly the boolean true passes: a truthy or "true"-spelled value is not Google's claim.
      for (const emailVerified of ["true", "TRUE", "1", "yes", "false"]) {
        await rejectsWith((await verify({ emailVerified })).result, "UNAUTHENTICATED");
      }
    });

    await t.step("UNAUTHENTICATED: exp missing", async () => {
      await rejectsWith((await verify({ omit: ["exp"] })).result, "UNAUTHENTICATED");
    });

    await t.step("UNAUTHENTICATED: alg other than RS256", async () => {
      const token = await new SignJWT({
        aud: AUDIENCE,
        email: EMAIL,
        email_verified: true,
        iss: "https://accounts.google.com",
      })
        .setProtectedHeader({ alg: "HS256", kid: "whatever" })
        .setIssuedAt()
        .setExpirationTime("1h")
        .sign(new Uint8Array(32));
      await rejectsWith(verifier.verify(`Bearer ${token}`, EXPECTED), "UNAUTHENTICATED", token);
    });

    await t.step("SIGNATURE_INVALID: signed with another key under a published kid", async () => {
      const { token, result } = await verify({ wrongKey: true });
      await rejectsWith(result, "SIGNATURE_INVALID", token);
    });

    await t.step("SIGNATURE_INVALID: badly signed and expired", async () => {
      await rejectsWith(
        (await verify({ wrongKey: true, expiresInSeconds: -3600 })).result,
        "SIGNATURE_INVALID",
      );
    });

    await t.step("SIGNATURE_INVALID: unknown kid", async () => {
      await rejectsWith((await verify({ unknownKey: true })).result, "SIGNATURE_INVALID");
    });

    await t.step("SIGNATURE_INVALID: wrong or missing aud", async () => {
      await rejectsWith(
        (await verify({ audience: "https://relay.example.com/v1/webhooks/storeb/other" })).result,
        "SIGNATURE_INVALID",
      );
      await rejectsWith((await verify({ omit: ["aud"] })).result, "SIGNATURE_INVALID");
    });

    await t.step("SIGNATURE_INVALID: wrong email", async () => {
      await rejectsWith(
        (await verify({ email: "someone-else@other-project.iam.gserviceaccount.com" })).result,
        "SIGNATURE_INVALID",
      );
    });

    await t.step("email is compared case-insensitively", async () => {
      const claims = await (await verify({}, {
        audience: AUDIENCE,
        serviceAccountEmail: EMAIL.toUpperCase(),
      })).result;
      assert.equal(claims.email, EMAIL);
    });

    await t.step("a stranger's account, the tenant's audience: SIGNATURE_INVALID", async () => {
      // What a stranger's push subscription gets from Google: a good signature, our audience.
      const stranger = "pusher@strangers-project.iam.gserviceaccount.com";
      await rejectsWith((await verify({ email: stranger })).result, "SIGNATURE_INVALID");
      // email_verified is judged first: not true is UNAUTHENTICATED, whoever the account.
      await rejectsWith(
        (await verify({ email: stranger, emailVerified: false })).result,
        "UNAUTHENTICATED",
      );
      await rejectsWith((await verify({ omit: ["email"] })).result, "UNAUTHENTICATED");
    });

    await t.step("the whole run fetched the JWKS once", () => {
      // Every unknown-kid token above came within the cooldown of the first fetch.
      assert.equal(issuer.certsRequests, 1);
    });
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: cached across verifications", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier, advance } = verifierOf(issuer);
    const token = await mint(issuer);
    for (let i = 0; i < 20; i++) {
      await verifier.verify(`Bearer ${token}`, EXPECTED);
      advance(60_000);
    }
    assert.equal(issuer.certsRequests, 1);
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: concurrent first verifications share one fetch", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier } = verifierOf(issuer);
    const token = await mint(issuer);
    const all = await Promise.all(
      Array.from({ length: 10 }, () => verifier.verify(`Bearer ${token}`, EXPECTED)),
    );
    assert.equal(all.length, 10);
    assert.equal(issuer.certsRequests, 1);
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: a rotated key is fetched once, past the cooldown", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier, advance } = verifierOf(issuer);
    const before = await mint(issuer);
    await verifier.verify(`Bearer ${before}`, EXPECTED);
    assert.equal(issuer.certsRequests, 1);

    await issuer.rotateKeys();
    advance(31_000);
    const after = await mint(issuer);
    await verifier.verify(`Bearer ${after}`, EXPECTED);
    assert.equal(issuer.certsRequests, 2);
    await verifier.verify(`Bearer ${after}`, EXPECTED);
    assert.equal(issuer.certsRequests, 2);

    // The JWKS no longer publishes the old key, and the cooldown holds off another fetch.
    await rejectsWith(verifier.verify(`Bearer ${before}`, EXPECTED), "SIGNATURE_INVALID");
    assert.equal(issuer.certsRequests, 2);
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: a storm of unknown kids fetches at most once per cooldown", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier, advance } = verifierOf(issuer);
    await verifier.verify(`Bearer ${await mint(issuer)}`, EXPECTED);
    const unknown = await mint(issuer, { unknownKey: true });
    const storm = () =>
      Promise.all(
        Array.from(
          { length: 20 },
          () => rejectsWith(verifier.verify(`Bearer ${unknown}`, EXPECTED), "SIGNATURE_INVALID"),
        ),
      );

    // Within the cooldown of the first fetch: none.
    await storm();
    assert.equal(issuer.certsRequests, 1);

    // Past it: one fetch shared by the whole storm, then none again.
    advance(31_000);
    await storm();
    assert.equal(issuer.certsRequests, 2);
    for (let i = 0; i < 10; i++) {
      await rejectsWith(verifier.verify(`Bearer ${unknown}`, EXPECTED), "SIGNATURE_INVALID");
    }
    assert.equal(issuer.certsRequests, 2);
    // The published key was not evicted: it still verifies, without a fetch.
    await verifier.verify(`Bearer ${await mint(issuer)}`, EXPECTED);
    assert.equal(issuer.certsRequests, 2);
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: Cache-Control max-age decides when keys are fetched again", async (t) => {
  const issuer = await startPushTokenIssuer({
    cacheControl: "public, max-age=120, must-revalidate",
  });
  try {
    const token = await mint(issuer, { expiresInSeconds: 3 * 86_400 });
    const header = `Bearer ${token}`;

    await t.step("max-age=120: kept 120 s", async () => {
      const { verifier, advance } = verifierOf(issuer);
      const start = issuer.certsRequests;
      await verifier.verify(header, EXPECTED);
      advance(119_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 1);
      advance(2_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 2);
    });

    await t.step("max-age=5 is raised to 60 s", async () => {
      issuer.setCacheControl("max-age=5");
      const { verifier, advance } = verifierOf(issuer);
      const start = issuer.certsRequests;
      await verifier.verify(header, EXPECTED);
      advance(59_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 1);
      advance(2_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 2);
    });

    await t.step("no Cache-Control: kept one hour", async () => {
      issuer.setCacheControl("");
      const { verifier, advance } = verifierOf(issuer);
      const start = issuer.certsRequests;
      await verifier.verify(header, EXPECTED);
      advance(3_599_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 1);
      advance(2_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 2);
    });

    await t.step("max-age of two days is cut to 24 h", async () => {
      issuer.setCacheControl("public, max-age=172800");
      const { verifier, advance } = verifierOf(issuer);
      const start = issuer.certsRequests;
      await verifier.verify(header, EXPECTED);
      advance(86_399_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 1);
      advance(2_000);
      await verifier.verify(header, EXPECTED);
      assert.equal(issuer.certsRequests - start, 2);
    });
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: unreachable or failing with nothing cached is a plain Error", async (t) => {
  const issuer = await startPushTokenIssuer();
  try {
    const token = await mint(issuer);

    await t.step("nothing listens", async () => {
      const { verifier } = verifierOf(issuer, { certsUrl: await closedUrl() });
      await rejectsPlain(verifier.verify(`Bearer ${token}`, EXPECTED));
    });

    await t.step("503: tried again once the cooldown has passed, not before", async () => {
      const { verifier, advance } = verifierOf(issuer);
      issuer.failJwks(1);
      await rejectsPlain(verifier.verify(`Bearer ${token}`, EXPECTED));
      assert.equal(issuer.certsRequests, 1);
      // With nothing cached every token's kid is unknown: a stream of them, even valid ones,
      // must not make a fetch each while the JWKS fails.
      for (let i = 0; i < 10; i++) {
        await rejectsPlain(verifier.verify(`Bearer ${token}`, EXPECTED));
      }
      assert.equal(issuer.certsRequests, 1);
      advance(31_000);
      await verifier.verify(`Bearer ${token}`, EXPECTED);
      assert.equal(issuer.certsRequests, 2);
    });

    await t.step("a malformed header is refused before any fetch", async () => {
      const { verifier } = verifierOf(issuer, { certsUrl: await closedUrl() });
      await rejectsWith(verifier.verify("Basic x", EXPECTED), "UNAUTHENTICATED");
      await rejectsWith(verifier.verify("Bearer garbage", EXPECTED), "UNAUTHENTICATED");
    });
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: a warm cache outlives a failing JWKS", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    const { verifier, advance } = verifierOf(issuer);
    const token = await mint(issuer, { expiresInSeconds: 86_400 });
    const header = `Bearer ${token}`;
    await verifier.verify(header, EXPECTED);
    issuer.failJwks(100);

    // Stale: one refetch is tried, fails, and the cached key still verifies.
    advance(3_601_000);
    await verifier.verify(header, EXPECTED);
    assert.equal(issuer.certsRequests, 2);
    // The cooldown keeps the next verifications from waiting on the failing JWKS.
    await verifier.verify(header, EXPECTED);
    await rejectsWith(
      verifier.verify(`Bearer ${await mint(issuer, { unknownKey: true })}`, EXPECTED),
      "SIGNATURE_INVALID",
    );
    assert.equal(issuer.certsRequests, 2);
    // Past the cooldown it tries again, and still verifies when that fails.
    advance(31_000);
    await verifier.verify(header, EXPECTED);
    assert.equal(issuer.certsRequests, 3);
  } finally {
    await issuer.close();
  }
});

Deno.test("push token JWKS: a warm cache outlives an unreachable JWKS", async () => {
  const issuer = await startPushTokenIssuer();
  const { verifier, advance } = verifierOf(issuer);
  const token = await mint(issuer, { expiresInSeconds: 86_400 });
  try {
    await verifier.verify(`Bearer ${token}`, EXPECTED);
  } finally {
    await issuer.close();
  }
  advance(3_601_000);
  const claims = await verifier.verify(`Bearer ${token}`, EXPECTED);
  assert.equal(claims.email, EMAIL);
});

/**
 * A JWKS endpoint whose answers a test writes: Google's keys as the issuer publishes them, or a
 * hostile answer built from them.
 */
async function startHostileJwks(issuer: PushTokenIssuer) {
  let answer: (res: http.ServerResponse, keys: JWK[]) => void = (res, keys) =>
    res.end(JSON.stringify({ keys }));
  const seen = { requests: 0, bytesWritten: 0, closedEarly: false };
  const server = http.createServer(async (_req, res) => {
    seen.requests++;
    const { keys } = await (await fetch(issuer.certsUrl)).json();
    res.on("close", () => {
      if (!res.writableFinished) seen.closedEarly = true;
    });
    answer(res, keys);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/oauth2/v3/certs`,
    seen,
    /** How later requests are answered. */
    answerWith(write: (res: http.ServerResponse, keys: JWK[]) => void) {
      answer = write;
    },
    close() {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Google's keys, then `count` more copies of the first under new kids. */
function manyKeys(keys: JWK[], count: number): JWK[] {
  return [...keys, ...Array.from({ length: count }, (_, i) => ({ ...keys[0], kid: `extra-${i}` }))];
}

/** A JWKS padded with a field of `bytes` characters. */
function padded(keys: JWK[], bytes: number): string {
  return JSON.stringify({ keys, padding: "x".repeat(bytes) });
}

Deno.test("push token JWKS: a hostile answer is refused whole, and the cached keys stay", async (t) => {
  const issuer = await startPushTokenIssuer();
  const jwks = await startHostileJwks(issuer);
  try {
    const token = await mint(issuer, { expiresInSeconds: 3 * 86_400 });
    const header = `Bearer ${token}`;
    const hostile: [string, (res: http.ServerResponse, keys: JWK[]) => void][] = [
      ["over 64 KB, declared", (res, keys) => {
        const body = padded(keys, MAX_JWKS_BYTES);
        res.writeHead(200, { "content-length": Buffer.byteLength(body) }).end(body);
      }],
      ["over 64 KB, chunked", (res, keys) => {
        res.write(padded(keys, MAX_JWKS_BYTES));
        res.end();
      }],
      ["more keys than the limit", (res, keys) => {
        res.end(JSON.stringify({ keys: manyKeys(keys, MAX_JWKS_KEYS) }));
      }],
    ];
    for (const [name, answer] of hostile) {
      await t.step(`${name}: refused with nothing cached`, async () => {
        jwks.answerWith(answer);
        const { verifier } = verifierOf(issuer, { certsUrl: jwks.url });
        await rejectsPlain(verifier.verify(header, EXPECTED));
      });
      await t.step(`${name}: refused on refresh, the cached keys still verify`, async () => {
        jwks.answerWith((res, keys) => res.end(JSON.stringify({ keys })));
        const { verifier, advance } = verifierOf(issuer, { certsUrl: jwks.url });
        await verifier.verify(header, EXPECTED);
        jwks.answerWith(answer);
        const before = jwks.seen.requests;
        // Stale, and then an unknown kid past the cooldown: both fetch the hostile answer.
        advance(3_601_000);
        await verifier.verify(header, EXPECTED);
        advance(31_000);
        await rejectsWith(
          verifier.verify(`Bearer ${await mint(issuer, { unknownKey: true })}`, EXPECTED),
          "SIGNATURE_INVALID",
        );
        assert.equal(jwks.seen.requests - before, 2, "both fetched");
        await verifier.verify(header, EXPECTED);
      });
    }

    await t.step("the limits leave room for what Google publishes", async () => {
      jwks.answerWith((res, keys) => res.end(padded(manyKeys(keys, MAX_JWKS_KEYS - 1), 20_000)));
      const { verifier } = verifierOf(issuer, { certsUrl: jwks.url });
      await verifier.verify(header, EXPECTED);
    });
  } finally {
    await jwks.close();
    await issuer.close();
  }
});

Deno.test("push token JWKS: an endless answer is read no further than the limit", async () => {
  const issuer = await startPushTokenIssuer();
  const jwks = await startHostileJwks(issuer);
  const cap = 256 * 1024 * 1024;
  try {
    jwks.answerWith((res, keys) => {
      // `{"keys":[...],"padding":"xxxx...` for as long as the client reads, up to 256 MB.
      const chunk = "x".repeat(64 * 1024);
      res.write(`{"keys":${JSON.stringify(keys)},"padding":"`);
      const pump = () => {
        while (jwks.seen.bytesWritten < cap && !res.destroyed) {
          jwks.seen.bytesWritten += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end('"}');
      };
      pump();
    });
    // A long fetch timeout: only the size limit can end this read early.
    const { verifier } = verifierOf(issuer, { certsUrl: jwks.url, fetchTimeoutMs: 600_000 });
    await rejectsPlain(verifier.verify(`Bearer ${await mint(issuer)}`, EXPECTED));
    await eventually(() => jwks.seen.closedEarly);
    // The socket buffers hold a few MB; reading the whole answer would have taken 256.
    assert.ok(
      jwks.seen.bytesWritten < 32 * 1024 * 1024,
      `the client read ${jwks.seen.bytesWritten} bytes of the answer`,
    );
  } finally {
    await jwks.close();
    await issuer.close();
  }
});

Deno.test("push token JWKS: keys of an unusual size are not trusted", async (t) => {
  const issuer = await startPushTokenIssuer();
  const jwks = await startHostileJwks(issuer);
  try {
    // jose will not make nor use a key under 2048 bits: WebCrypto makes and signs with it.
    const { privateKey, publicKey } = await crypto.subtle.generateKey(
      {
        name: "RSASSA-PKCS1-v1_5",
        modulusLength: 1024,
        publicExponent: new Uint8Array([1, 0, 1]),
        hash: "SHA-256",
      },
      true,
      ["sign", "verify"],
    );
    const weak = { ...await exportJWK(publicKey), kid: "weak-1024", alg: "RS256", use: "sig" };
    const weakToken = await signedWith(privateKey, weak.kid, {
      aud: AUDIENCE,
      email: EMAIL,
      email_verified: true,
      iss: "https://accounts.google.com",
      iat: Math.floor(Date.now() / 1000),
      exp: Math.floor(Date.now() / 1000) + 3600,
    });
    const good = `Bearer ${await mint(issuer)}`;

    await t.step("a 1024-bit key is skipped; the others are kept", async () => {
      jwks.answerWith((res, keys) => res.end(JSON.stringify({ keys: [...keys, weak] })));
      const { verifier } = verifierOf(issuer, { certsUrl: jwks.url });
      await rejectsWith(verifier.verify(`Bearer ${weakToken}`, EXPECTED), "SIGNATURE_INVALID");
      await verifier.verify(good, EXPECTED);
    });

    await t.step("a modulus over 4096 bits or a huge exponent is skipped", async () => {
      const huge = (bytes: number) => {
        const value = crypto.getRandomValues(new Uint8Array(bytes));
        value[0] |= 0x80;
        value[bytes - 1] |= 1;
        return value.toBase64({ alphabet: "base64url", omitPadding: true });
      };
      jwks.answerWith((res, keys) =>
        res.end(JSON.stringify({
          keys: [
            { ...keys[0], kid: "big-modulus", n: huge(1024) },
            { ...keys[0], kid: "big-exponent", e: huge(512) },
          ],
        }))
      );
      const { verifier } = verifierOf(issuer, { certsUrl: jwks.url });
      // No usable key at all: the answer is refused.
      await rejectsPlain(verifier.verify(good, EXPECTED));
    });
  } finally {
    await jwks.close();
    await issuer.close();
  }
});

/** A compact RS256 JWS of `payload`, signed with WebCrypto alone. */
async function signedWith(
  key: CryptoKey,
  kid: string,
  payload: Record<string, unknown>,
): Promise<string> {
  const part = (value: unknown) =>
    new TextEncoder().encode(JSON.stringify(value)).toBase64({
      alphabet: "base64url",
      omitPadding: true,
    });
  const input = `${part({ alg: "RS256", kid, typ: "JWT" })}.${part(payload)}`;
  const signature = await crypto.subtle.sign(
    "RSASSA-PKCS1-v1_5",
    key,
    new TextEncoder().encode(input),
  );
  return `${input}.${
    new Uint8Array(signature).toBase64({ alphabet: "base64url", omitPadding: true })
  }`;
}

/** Polls `check` until it is true, for at most 5 seconds. */
async function eventually(check: () => boolean): Promise<void> {
  for (let waited = 0; !check(); waited += 20) {
    if (waited > 5_000) assert.fail("the condition did not become true within 5 s");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

Deno.test("pushEnvelope: base64 JSON in message.data, Pub/Sub's fields", () => {
  const notification = subscriptionNotification("com.example.app", {
    notificationType: 4,
    purchaseToken: "tok-ü-1",
  });
  const envelope = pushEnvelope(notification);
  const decoded = new TextDecoder().decode(Uint8Array.fromBase64(envelope.message.data));
  assert.deepEqual(JSON.parse(decoded), notification);
  assert.match(envelope.message.messageId, /^[1-9]\d{15}$/);
  assert.equal(envelope.message.message_id, envelope.message.messageId);
  assert.ok(!Number.isNaN(Date.parse(envelope.message.publishTime)));
  assert.equal(envelope.message.publish_time, envelope.message.publishTime);
  assert.equal(envelope.subscription, "projects/demo-project/subscriptions/play-rtdn");
  assert.notEqual(pushEnvelope(notification).message.messageId, envelope.message.messageId);

  const fixed = pushEnvelope({ any: "thing" }, {
    messageId: "42",
    publishTime: "2024-05-01T10:00:00.123Z",
    subscription: "projects/p/subscriptions/s",
  });
  assert.deepEqual(fixed, {
    message: {
      data: btoa('{"any":"thing"}'),
      messageId: "42",
      message_id: "42",
      publishTime: "2024-05-01T10:00:00.123Z",
      publish_time: "2024-05-01T10:00:00.123Z",
    },
    subscription: "projects/p/subscriptions/s",
  });
});

Deno.test("developer notification builders: the RTDN shapes", () => {
  const common = (n: Record<string, unknown>) => {
    assert.equal(n.version, "1.0");
    assert.equal(n.packageName, "com.example.app");
    assert.match(n.eventTimeMillis as string, /^\d{13}$/);
    const { version: _v, packageName: _p, eventTimeMillis: _e, ...rest } = n;
    assert.equal(Object.keys(rest).length, 1, "exactly one notification object");
    return rest;
  };

  assert.deepEqual(
    common(subscriptionNotification("com.example.app", {
      notificationType: 2,
      purchaseToken: "tok",
      subscriptionId: "premium_monthly",
    })),
    {
      subscriptionNotification: {
        version: "1.0",
        notificationType: 2,
        purchaseToken: "tok",
        subscriptionId: "premium_monthly",
      },
    },
  );
  assert.deepEqual(
    common(subscriptionNotification("com.example.app", {
      notificationType: 13,
      purchaseToken: "tok",
    })),
    { subscriptionNotification: { version: "1.0", notificationType: 13, purchaseToken: "tok" } },
  );
  assert.deepEqual(
    common(oneTimeProductNotification("com.example.app", {
      notificationType: 1,
      purchaseToken: "tok",
      sku: "coins_100",
    })),
    {
      oneTimeProductNotification: {
        version: "1.0",
        notificationType: 1,
        purchaseToken: "tok",
        sku: "coins_100",
      },
    },
  );
  assert.deepEqual(
    common(voidedPurchaseNotification("com.example.app", {
      purchaseToken: "tok",
      orderId: "GPA.3372-4150-9088-12345",
      productType: 1,
      refundType: 1,
    })),
    {
      voidedPurchaseNotification: {
        purchaseToken: "tok",
        orderId: "GPA.3372-4150-9088-12345",
        productType: 1,
        refundType: 1,
      },
    },
  );
  assert.deepEqual(common(testNotification("com.example.app")), {
    testNotification: { version: "1.0" },
  });
});

Deno.test("push token issuer: JWKS and tokens look like Google's", async () => {
  const issuer = await startPushTokenIssuer();
  try {
    assert.match(issuer.certsUrl, /^http:\/\/127\.0\.0\.1:\d+\/oauth2\/v3\/certs$/);
    assert.equal(issuer.issuer, "https://accounts.google.com");
    const response = await fetch(issuer.certsUrl);
    assert.equal(response.headers.get("cache-control"), "public, max-age=3600");
    const { keys } = await response.json();
    assert.equal(keys.length, 1);
    assert.equal(keys[0].kty, "RSA");
    assert.equal(keys[0].alg, "RS256");
    assert.equal(keys[0].use, "sig");
    assert.match(keys[0].kid, /^[0-9a-f]{40}$/);
    assert.equal(keys[0].d, undefined, "no private part is published");

    const token = await mint(issuer);
    const [header, payload] = token.split(".").slice(0, 2).map((part) =>
      JSON.parse(new TextDecoder().decode(Uint8Array.fromBase64(part, { alphabet: "base64url" })))
    );
    assert.deepEqual(header, { alg: "RS256", kid: keys[0].kid, typ: "JWT" });
    assert.deepEqual(Object.keys(payload).sort(), [
      "aud",
      "azp",
      "email",
      "email_verified",
      "exp",
      "iat",
      "iss",
      "sub",
    ]);
    assert.equal(payload.azp, payload.sub);

    await issuer.rotateKeys();
    const rotated = await (await fetch(issuer.certsUrl)).json();
    assert.equal(rotated.keys.length, 1);
    assert.notEqual(rotated.keys[0].kid, keys[0].kid);

    issuer.failJwks(1);
    const failed = await fetch(issuer.certsUrl);
    await failed.body?.cancel();
    assert.equal(failed.status, 503);
    assert.equal(issuer.certsRequests, 3);
  } finally {
    await issuer.close();
  }
});
