/**
 * What operators give the CLI and how: a delivery named by the event id tenants quote
 * (`deliveries show` and `retry`), and key files on standard input (`--private-key-file -`,
 * `--service-account-file -`). Real processes, a real relayed notification, this run's engine.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type CliResult,
  databaseOf,
  freshDatabase,
  runCli,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  writeServiceAccountFile,
  writeStoreaKeyFile,
} from "./helpers/fixtures.ts";
import { deliveryReaches, postJson } from "./helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

function ok(result: CliResult, what: string): Json {
  assert.equal(result.code, 0, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  return result.json;
}

function fails(result: CliResult, code: number, error: string, what: string): Json {
  assert.equal(result.code, code, `${what}: exit ${result.code}; stderr: ${result.stderr}`);
  assert.equal(result.json?.error, error, `${what}: ${result.stderr}`);
  return result.json;
}

Deno.test("cli inputs: deliveries show and retry take the event id a tenant quotes", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-cli-evt-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1h",
      DELIVERY_TIMEOUT: "1s",
    },
  });
  const sql = databaseOf(service);
  try {
    const cli = (...args: string[]) => service.cli(...args);
    const tenant = ok(
      await cli("tenant", "create", "--name", "Relay", "--callback-url", receiver.url),
      "tenant create",
    );
    receiver.setSecrets([tenant.webhookSecret]);
    ok(await cli(...storeaCredentialArgs(tenant.id, await writeStoreaKeyFile(dir))), "storea");
    const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenant.id}`, {
      signedPayload: await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      ),
    });
    assert.equal(answer.status, 200, JSON.stringify(answer.json));
    const eventId: string = answer.json.eventId;
    assert.match(eventId, /^evt_/);
    const row = await deliveryReaches(sql, eventId, "delivered");

    const byEvent = ok(await cli("deliveries", "show", eventId), "show by event id");
    const byId = ok(await cli("deliveries", "show", row.id), "show by delivery id");
    assert.equal(byEvent.id, row.id);
    assert.equal(byEvent.eventId, eventId);
    assert.deepEqual(byEvent, byId, "the same delivery either way");
    assert.equal(byEvent.attemptLog.length, 1);

    const before = receiver.deliveries.length;
    assert.deepEqual(ok(await cli("deliveries", "retry", eventId), "retry").queued, [row.id]);
    const again = await receiver.waitFor(before + 1);
    assert.equal(JSON.parse(again.at(-1)!.body).eventId, eventId, "the event is sent again");

    const unknownEvent = "evt_01ARZ3NDEKTSV4RRFFQ69G5FAV";
    const missing = fails(
      await cli("deliveries", "show", unknownEvent),
      1,
      "DELIVERY_NOT_FOUND",
      "unknown event",
    );
    assert.ok(missing.message.includes(unknownEvent));
    fails(await cli("deliveries", "retry", unknownEvent), 1, "DELIVERY_NOT_FOUND", "retry unknown");
  } finally {
    await sql.end();
    await stopAndDrop(service);
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cli inputs: store key files on standard input with -", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-cli-stdin-" });
  const db = await freshDatabase({ migrated: true });
  try {
    const cli = (args: string[], stdin?: string) =>
      runCli(args, db.env, stdin === undefined ? {} : { stdin });
    const tenant = ok(await cli(["tenant", "create", "--name", "Stdin"]), "tenant create");

    const keyPem = await Deno.readTextFile(await writeStoreaKeyFile(dir));
    const storea = ok(await cli(storeaCredentialArgs(tenant.id, "-"), keyPem), "storea from -");
    assert.equal(storea.storea.keyId, "ABC123DEFG");
    fails(
      await cli(storeaCredentialArgs(tenant.id, "-"), "not a key\n"),
      1,
      "INVALID_PRIVATE_KEY",
      "what standard input holds is checked",
    );

    const account = await writeServiceAccountFile(dir);
    const accountJson = await Deno.readTextFile(account.path);
    const storeb = ok(
      await cli(storebCredentialArgs(tenant.id, "-"), accountJson),
      "storeb from -",
    );
    assert.equal(storeb.storeb.clientEmail, account.clientEmail);
    fails(
      await cli(storebCredentialArgs(tenant.id, "-"), "{}"),
      1,
      "INVALID_SERVICE_ACCOUNT",
      "a service account from standard input is checked",
    );

    const shown = ok(await cli(["tenant", "show", tenant.id]), "tenant show");
    assert.equal(shown.storea.keyId, "ABC123DEFG");
    assert.equal(shown.storeb.clientEmail, account.clientEmail);
  } finally {
    await db.drop();
    await Deno.remove(dir, { recursive: true });
  }
});
