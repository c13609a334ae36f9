/**
 * Attacks on the signer of `deno task dev`, which signs store notifications that its service
 * trusts. The attacker is another local user or a web page's script: it can reach loopback ports
 * but cannot read DATA_DIR, where the signer's token is. It must get no signature without the
 * token, and none for a type the catalog does not name or a body of any size even with it.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { freshDatabase, TEST_ENCRYPTION_KEY } from "../helpers/service.ts";
import { startDevLoop } from "../helpers/dev_loop.ts";

const STOREA_REQUEST = {
  store: "storea",
  notificationType: "DID_RENEW",
  subtype: null,
  bundleId: "com.example.app",
  appId: null,
};

Deno.test("dev signer: nothing is signed without its token, or for what the catalog does not name", async () => {
  const database = await freshDatabase();
  const dev = await startDevLoop({
    ...database.env,
    ENCRYPTION_KEY: TEST_ENCRYPTION_KEY,
    NODE_ENV: "test",
    PORT: "0",
  });
  try {
    const file = JSON.parse(
      await Deno.readTextFile(join(database.dataDir, "dev", "signer.json")),
    );
    const dir = await Deno.stat(join(database.dataDir, "dev"));
    assert.equal(dir.mode! & 0o077, 0, "DATA_DIR/dev is its owner's only");
    const send = async (init: RequestInit & { path?: string }) => {
      const url = init.path === undefined ? file.url : new URL(init.path, file.url).href;
      const response = await fetch(url, { method: "POST", ...init });
      const text = await response.text();
      return { status: response.status, text };
    };
    const json = { "content-type": "application/json" };
    const body = JSON.stringify(STOREA_REQUEST);

    // Without the token, or with a guess, or with the token in another scheme.
    for (
      const authorization of [
        undefined,
        "Bearer ",
        `Bearer ${"A".repeat(file.token.length)}`,
        `Bearer ${file.token.slice(0, -1)}`,
        `Basic ${file.token}`,
        `bearer ${file.token}x`,
      ]
    ) {
      const headers: Record<string, string> = { ...json };
      if (authorization !== undefined) headers.authorization = authorization;
      const answer = await send({ headers, body });
      assert.equal(answer.status, 401, `${authorization}: ${answer.text.slice(0, 200)}`);
      assert.doesNotMatch(answer.text, /signedPayload|eyJ/);
    }

    // With the token: only POST /sign, only named types, only a small body with its length.
    const auth = { ...json, authorization: `Bearer ${file.token}` };
    const refusals: [RequestInit & { path?: string }, number][] = [
      [{ method: "GET", headers: auth }, 405],
      [{ path: "/other", headers: auth, body }, 404],
      [
        { headers: auth, body: JSON.stringify({ ...STOREA_REQUEST, notificationType: "EVIL" }) },
        400,
      ],
      [{ headers: auth, body: JSON.stringify({ ...STOREA_REQUEST, subtype: "x\ny" }) }, 400],
      [
        { headers: auth, body: JSON.stringify({ ...STOREA_REQUEST, bundleId: "b".repeat(5000) }) },
        400,
      ],
      [{
        headers: auth,
        body: JSON.stringify({
          store: "storeb",
          notification: { kind: "subscription", notificationType: 99 },
          packageName: "com.example.app",
          pushAudience: "aud",
          pushServiceAccount: "a@b.c",
        }),
      }, 400],
      [{ headers: auth, body: "{not json" }, 400],
      [
        { headers: auth, body: JSON.stringify({ ...STOREA_REQUEST, pad: "x".repeat(20_000) }) },
        413,
      ],
    ];
    for (const [init, status] of refusals) {
      const answer = await send(init);
      assert.equal(
        answer.status,
        status,
        `${init.method ?? "POST"} ${init.path ?? ""}: ${answer.text.slice(0, 200)}`,
      );
      assert.doesNotMatch(answer.text, /signedPayload|eyJ/);
    }
    // A body without Content-Length (streamed) is refused unread.
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(body));
        controller.close();
      },
    });
    const streamed = await fetch(file.url, { method: "POST", headers: auth, body: stream });
    assert.equal(streamed.status, 411, await streamed.text());

    // And the owner of the token gets a signature, so the refusals above are the signer's.
    const good = await send({ headers: auth, body });
    assert.equal(good.status, 200, good.text);
    assert.match(JSON.parse(good.text).body, /signedPayload/);
  } finally {
    assert.equal(await dev.stop(), 0, dev.output());
    await database.drop();
  }
});
