/**
 * What the stores' answers become, through the real verify endpoints: a store that says 429 with
 * no usable `Retry-After` (none, garbage, negative) still gives the client both `Retry-After` and
 * `details.retryAfterSeconds` (the default wait, 60 s), and prices are converted with ISO 4217's
 * exponents, not the digits `Intl` writes (docs/integration.md).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { createTenantWithKey, startService, stopAndDrop } from "../helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_ISSUER_ID,
  writeStoreaKeyFile,
} from "../helpers/fixtures.ts";
import { type JsonAnswer, postJson } from "../helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../../simulators/storea_pki.ts";
import { StoreaSigner } from "../../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  STOREA_API_ERRORS,
  storeaRateLimitedAnswer,
} from "../../simulators/storea_api.ts";
import { startStorebSimulator } from "../../simulators/storeb_play.ts";
import { createServiceAccount } from "../../simulators/service_account.ts";

const BUNDLE_ID = "com.example.app"; // the bundle and package of the fixtures' credentials
const DEFAULT_WAIT_SECONDS = 60;

/** The answer of a 429 must carry the wait twice, as the same whole number of seconds. */
function waitOf(answer: JsonAnswer): number {
  assert.equal(answer.status, 429, JSON.stringify(answer.json));
  assert.equal(answer.json.error, "RATE_LIMITED");
  const header = answer.headers.get("retry-after");
  assert.ok(header !== null, "Retry-After is sent");
  assert.match(header, /^\d+$/);
  assert.deepEqual(answer.json.details, { retryAfterSeconds: Number(header) });
  return Number(header);
}

Deno.test("store answers: 429 without a usable hint, and ISO 4217 prices", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-store-answers-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const storea = await startStoreaApiSimulator({ signer });
  const play = await startStorebSimulator();
  const keyFile = await writeStoreaKeyFile(dir);
  await storea.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: BUNDLE_ID,
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  const account = await createServiceAccount();
  await play.addServiceAccount(account);
  const accountFile = join(dir, "service-account.json");
  await Deno.writeTextFile(accountFile, account.json);
  const service = await startService({
    env: {
      ...storea.serviceEnv,
      ...play.serviceEnv,
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      UPSTREAM_TIMEOUT: "3s",
      RATE_LIMIT_BURST: "1000",
    },
  });
  try {
    const { tenantId, key } = await createTenantWithKey(service);
    for (
      const args of [
        storeaCredentialArgs(tenantId, keyFile),
        storebCredentialArgs(tenantId, accountFile),
      ]
    ) {
      const set = await service.cli(...args);
      assert.equal(set.code, 0, set.stderr);
    }
    const auth = { authorization: `Bearer ${key}` };
    const verifyA = (transactionId: string) =>
      postJson(`${service.url}/v1/storea/verify`, { transactionId }, auth);
    const verifyB = () =>
      postJson(`${service.url}/v1/storeb/verify`, {
        packageName: BUNDLE_ID,
        productId: "monthly",
        purchaseToken: `ptok-${crypto.randomUUID()}`,
        type: "subscription",
      }, auth);
    const unusable: [string, Record<string, string>][] = [
      ["no Retry-After", {}],
      ["a garbage Retry-After", { "Retry-After": "soon, maybe" }],
      ["a negative Retry-After", { "Retry-After": "-5000" }],
      ["an empty Retry-After", { "Retry-After": "" }],
    ];

    for (const [what, headers] of unusable) {
      await t.step(`store A 429 with ${what}: the default wait`, async () => {
        storea.script("production", {
          status: 429,
          headers,
          body: STOREA_API_ERRORS.rateLimitExceeded,
        });
        assert.equal(waitOf(await verifyA("2000000000000001")), DEFAULT_WAIT_SECONDS);
      });
      await t.step(`store B 429 with ${what}: the default wait`, async () => {
        play.script({ status: 429, headers });
        assert.equal(waitOf(await verifyB()), DEFAULT_WAIT_SECONDS);
      });
    }

    await t.step("a usable hint is still the store's own", async () => {
      storea.script("production", storeaRateLimitedAnswer({ retryAt: Date.now() + 30_000 }));
      const a = waitOf(await verifyA("2000000000000002"));
      assert.ok(a >= 28 && a <= 30, `store A: ${a}`);
      play.script({ status: 429, headers: { "Retry-After": "17" } });
      assert.equal(waitOf(await verifyB()), 17);
    });

    await t.step("prices use the ISO 4217 exponent of their currency", async () => {
      // 12.345 units in Apple's milli-units, in the currency's smallest unit.
      const expected: [string, number][] = [
        ["IQD", 12_345],
        ["RSD", 1235],
        ["LBP", 1235],
        ["ALL", 1235],
        ["MMK", 1235],
        ["LAK", 1235],
        ["YER", 1235],
        ["SYP", 1235],
        ["IRR", 1235],
        ["AFN", 1235],
        ["USD", 1235],
        ["JPY", 12],
        ["KWD", 12_345],
        ["CLF", 123_450],
        ["XYZ", 1235],
      ];
      let id = 3000000000000000;
      for (const [currency, price] of expected) {
        const transactionId = String(id++);
        await storea.addTransaction(
          "production",
          signer.sampleTransaction({ transactionId, currency, price: 12_345 }),
        );
        const answer = await verifyA(transactionId);
        assert.equal(answer.status, 200, JSON.stringify(answer.json));
        assert.equal(answer.json.transaction.currency, currency);
        assert.equal(answer.json.transaction.price, price, currency);
        assert.equal(answer.json.transaction.rawDecodedPayload.price, 12_345);
      }
    });
  } finally {
    await stopAndDrop(service);
    await storea.close();
    await play.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
