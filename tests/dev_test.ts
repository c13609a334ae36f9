/**
 * `deno task dev` as a developer runs it: it starts, prints a tenant and an API key, and every
 * call it prints answers 200 with `valid: true` as the docs say: the verify of a purchase of each
 * store, then the store gateway's examples (acknowledge in the verify, acknowledge, consume;
 * subscription statuses, history, consumption information), which act on purchases the
 * simulators hold for them; its `storea test-notification` line follows a test notification from
 * the App Store simulator through the service to a callback; a restart keeps the tenant and the
 * key; it refuses NODE_ENV=production. On the embedded engine from an empty DATA_DIR, as on a
 * fresh clone; with TEST_DATABASE_URL, on a fresh PostgreSQL database.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { ENGINE, freshDatabase } from "./helpers/service.ts";
import { fetchLikeCurl, runPrinted, shellWords, startDevLoop } from "./helpers/dev_loop.ts";

/** The path each printed curl line calls, in the order the banner prints them. */
const PRINTED_CALLS = [
  "/v1/storea/verify",
  "/v1/storeb/verify",
  "/v1/storeb/verify",
  "/v1/storeb/acknowledge",
  "/v1/storeb/consume",
  "/v1/storea/subscriptions",
  "/v1/storea/history",
  "/v1/storea/consumption",
];

// deno-lint-ignore no-explicit-any
async function call(line: string): Promise<any> {
  const response = await fetchLikeCurl(line);
  const body = await response.json();
  assert.equal(response.status, 200, `${line}\n${JSON.stringify(body)}`);
  assert.equal(body.valid, true, `${line}\n${JSON.stringify(body)}`);
  return body;
}

/**
 * Runs every printed call as pasted, in order, on simulators just started: each does what the
 * banner says it shows, and the actions are safe to repeat.
 */
async function runPrintedCalls(curlLines: string[]): Promise<void> {
  assert.deepEqual(
    curlLines.map((line) => new URL(shellWords(line)[2]).pathname),
    PRINTED_CALLS,
    curlLines.join("\n"),
  );
  const [storeaVerify, storebVerify, verifyAndAcknowledge, acknowledge, consume, ...storea] =
    curlLines;
  const [subscriptions, history, consumption] = storea;
  const transactionId = JSON.parse(shellWords(storeaVerify).at(-1)!).transactionId;

  const verified = await call(storeaVerify);
  assert.equal(verified.transaction.transactionId, transactionId);
  // A purchase just made waits for its acknowledgement, as Google leaves it.
  assert.equal((await call(storebVerify)).purchase.acknowledgementState, 0);
  const acknowledgedInVerify = await call(verifyAndAcknowledge);
  assert.equal(acknowledgedInVerify.acknowledged, true);
  assert.equal(acknowledgedInVerify.purchase.acknowledgementState, 1);
  assert.equal((await call(acknowledge)).alreadyAcknowledged, false);
  assert.equal((await call(acknowledge)).alreadyAcknowledged, true);
  assert.equal((await call(consume)).alreadyConsumed, false);
  assert.equal((await call(consume)).alreadyConsumed, true);

  // The store A subscription: bought two months ago, renewed twice, active now.
  const statuses = (await call(subscriptions)).subscriptions;
  assert.equal(statuses.length, 1, JSON.stringify(statuses));
  assert.equal(statuses[0].statusName, "active");
  assert.equal(statuses[0].originalTransactionId, transactionId);
  assert.equal(statuses[0].transaction.transactionReason, "RENEWAL");
  const transactions = (await call(history)).transactions;
  assert.deepEqual(
    transactions.map((t: { transactionReason: string }) => t.transactionReason),
    ["RENEWAL", "RENEWAL", "PURCHASE"],
  );
  assert.equal(transactions.at(-1).transactionId, transactionId);
  assert.equal(transactions[0].transactionId, statuses[0].transaction.transactionId);
  assert.equal((await call(consumption)).sent, true);
}

Deno.test("deno task dev: a key, every printed call works, a restart keeps them", async () => {
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
      await runPrintedCalls(banner.curlLines);
      await followTestNotification(
        first.output(),
        banner.setCallbackLine,
        banner.webhookSecret,
        env,
      );
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
      await runPrintedCalls(second.banner.curlLines);
    } finally {
      assert.equal(await second.stop(), 0, second.output());
    }
  } finally {
    await database.drop();
  }
});

/**
 * Points the tenant at a callback receiver with the printed set-callback line, then runs the
 * printed `storea test-notification` line: the App Store simulator posts a TEST notification to
 * the service's receiver for the tenant, which stores it and delivers it to the receiver.
 */
async function followTestNotification(
  output: string,
  setCallbackLine: string,
  webhookSecret: string,
  env: Record<string, string>,
): Promise<void> {
  const printed = output.split("\n").map((line) => line.trim())
    .find((line) => line.includes(" storea test-notification "));
  assert.ok(printed, output);
  const receiver = await startCallbackReceiver({
    secrets: [webhookSecret],
    rejectInvalidSignatures: true,
  });
  try {
    const setCallback = await runPrinted(
      setCallbackLine.replace("http://localhost:3000/webhooks", receiver.url),
      env,
    );
    assert.equal(setCallback.code, 0, setCallback.stderr);
    const chain = await runPrinted(printed, env);
    assert.equal(chain.code, 0, `${chain.stdout}\n${chain.stderr}`);
    assert.equal(chain.json.received, true, chain.stdout);
    assert.deepEqual(
      chain.json.sendAttempts.map((a: { sendAttemptResult: string }) => a.sendAttemptResult),
      ["SUCCESS"],
    );
    assert.deepEqual(chain.json.delivery, { status: "delivered", responseCode: 200 });
    const [delivery] = await receiver.waitFor(1, 15_000);
    assert.ok(delivery.signatureValid, delivery.body);
    // deno-lint-ignore no-explicit-any
    const body = delivery.json as any;
    assert.deepEqual([body.event, body.platformEvent, body.eventId], [
      "test",
      "storea.test",
      chain.json.eventId,
    ]);
  } finally {
    await receiver.close();
  }
}

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
