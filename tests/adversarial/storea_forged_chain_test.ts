/**
 * An attacker who knows a tenant id mints leaves of their own that name Apple's real intermediate
 * as their issuer and carry Apple's marker, and posts JWS signed with them under Apple's real
 * intermediate and root. Each JWS verifies with its leaf, so each would cost a certificate check;
 * past a small budget of chains never seen, they are refused 429 unchecked, and a genuine
 * notification is still answered 200 during the flood (docs/security.md, "Forged certificate
 * chains"). `deno task bench` measures what the refusals cost against garbage signatures.
 */
import assert from "node:assert/strict";
import { ENGINE, startService, stopAndDrop } from "../helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "../helpers/fixtures.ts";
import { assertReceipt, cliOk, createTenantWithCallback, postJson } from "../helpers/relay.ts";
import { forgeStoreaLeaf } from "../../simulators/storea_pki.ts";
import { UNSEEN_CHAIN_BUDGET } from "../../src/storea/jws.ts";

const VECTORS = new URL("../fixtures/storea/real-sandbox/", import.meta.url);
const FORGERIES = 30;

function decodeHeader(jws: string): { alg: string; x5c: string[] } {
  const bytes = Uint8Array.fromBase64(jws.split(".")[0], { alphabet: "base64url" });
  return JSON.parse(new TextDecoder().decode(bytes));
}

/** A JWS of `payload` under a new leaf forged against `x5c`'s intermediate, with `x5c`'s root. */
async function forgedJws(x5c: string[], payload: string): Promise<string> {
  const leaf = await forgeStoreaLeaf(Uint8Array.fromBase64(x5c[1]));
  const header = new TextEncoder().encode(
    JSON.stringify({ alg: "ES256", x5c: [leaf.x5c, x5c[1], x5c[2]] }),
  ).toBase64({ alphabet: "base64url", omitPadding: true });
  const signature = await crypto.subtle.sign(
    { name: "ECDSA", hash: "SHA-256" },
    leaf.privateKey,
    new TextEncoder().encode(`${header}.${payload}`),
  );
  const encoded = new Uint8Array(signature).toBase64({ alphabet: "base64url", omitPadding: true });
  return `${header}.${payload}.${encoded}`;
}

Deno.test(`forged chains: past the budget they are refused unchecked (${ENGINE})`, async () => {
  const index = JSON.parse(await Deno.readTextFile(new URL("index.json", VECTORS)));
  const real = async (i: number) =>
    (await Deno.readTextFile(new URL(index[i].file, VECTORS))).trim();
  // The vectors were signed in 2025: an age limit that reaches them.
  const service = await startService({ env: { STOREA_NOTIFICATION_MAX_AGE: "36500d" } });
  const dir = await Deno.makeTempDir();
  try {
    const { tenantId } = await createTenantWithCallback(service, null);
    const args = storeaCredentialArgs(tenantId, await writeStoreaKeyFile(dir));
    args[args.indexOf("--bundle-id") + 1] = index[0].bundleId;
    await cliOk(service, ...args);
    const url = `${service.url}/v1/webhooks/storea/${tenantId}`;

    // A genuine notification first: Apple's chain is verified, and kept.
    const first = await real(0);
    assertReceipt(await postJson(url, { signedPayload: first }), {
      externalId: index[0].notificationUUID,
      isNew: true,
      enqueuedDelivery: false,
    });

    const [, payload] = first.split(".");
    const x5c = decodeHeader(first).x5c;
    const forgeries = [];
    for (let i = 0; i < FORGERIES; i++) forgeries.push(await forgedJws(x5c, payload));
    const statuses: number[] = [];
    for (const [i, signedPayload] of forgeries.entries()) {
      const answer = await postJson(url, { signedPayload });
      statuses.push(answer.status);
      assert.equal(answer.json.valid, false);
      if (answer.status === 401) {
        assert.equal(answer.json.error, "SIGNATURE_INVALID");
        assert.match(answer.json.message, /leaf is not signed by the intermediate/);
      } else {
        assert.equal(answer.status, 429, `forgery ${i}: ${JSON.stringify(answer.json)}`);
        assert.equal(answer.json.error, "RATE_LIMITED");
        assert.match(answer.json.message, /certificate chains this service has not verified/);
        const wait = answer.json.details.retryAfterSeconds;
        assert.ok(Number.isInteger(wait) && wait >= 1, `retryAfterSeconds ${wait}`);
        assert.equal(answer.headers.get("retry-after"), String(wait));
      }
      // In the middle of the flood, a genuine notification goes through at once.
      if (i === FORGERIES / 2) {
        assertReceipt(await postJson(url, { signedPayload: await real(1) }), {
          externalId: index[1].notificationUUID,
          isNew: true,
          enqueuedDelivery: false,
        });
      }
    }
    // The budget's tokens (less the one Apple's genuine chain took when first seen, plus what
    // refilled while the flood ran) were checked; the rest not.
    const checked = statuses.filter((status) => status === 401).length;
    assert.ok(checked >= UNSEEN_CHAIN_BUDGET.burst - 1, `${checked} checked`);
    assert.ok(statuses.filter((status) => status === 429).length >= FORGERIES / 3, `${statuses}`);
    // The refusals are said in the log, not once each.
    const lines = service.logs.filter((line) => line.msg === "storea_unseen_chains_refused");
    assert.ok(lines.length >= 1 && lines.length <= 2, `${lines.length} lines`);
    assert.equal(lines[0].level, "warn");
    // A refused forgery is known by its chain: refused for what it is, budget or not.
    const again = await postJson(url, { signedPayload: forgeries[0] });
    assert.equal(again.status, 401);
    // And the genuine chain is still accepted, as a duplicate.
    assertReceipt(await postJson(url, { signedPayload: first }), {
      externalId: index[0].notificationUUID,
      isNew: false,
      enqueuedDelivery: false,
    });
  } finally {
    await stopAndDrop(service);
    await Deno.remove(dir, { recursive: true });
  }
});
