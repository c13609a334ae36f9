/**
 * Store B push, attacked from a stranger's Google project. Google signs a push token for any
 * project's push subscription, with whatever audience that project chooses; the audience we
 * recommend is the endpoint URL, which is public. So a stranger can point a push subscription at
 * `/v1/webhooks/storeb/<tenantId>`, choose the tenant's audience, and publish a forged refund for
 * the tenant's (public) package name: the token is correctly signed, and only its `email` (the
 * stranger's service account) gives it away.
 *
 * Real HTTP against a real service process, real tokens from the simulated Google issuer, on this
 * run's engine. The legacy tenants are stored the way versions before the push service account was
 * required stored them: store B credentials whose push service account is NULL.
 */
import assert from "node:assert/strict";
import type postgres from "postgres";
import {
  databaseOf,
  type LogLine,
  type RunningService,
  startService,
  stopAndDrop,
} from "../helpers/service.ts";
import { storebCredentialArgs, writeServiceAccountFile } from "../helpers/fixtures.ts";
import {
  assertError,
  assertReceipt,
  cliOk,
  createTenantWithCallback,
  deliveryReaches,
  eventually,
  type JsonAnswer,
  postJson,
} from "../helpers/relay.ts";
import {
  pushEnvelope,
  startPushTokenIssuer,
  subscriptionNotification,
  voidedPurchaseNotification,
} from "../../simulators/storeb_push.ts";
import { startCallbackReceiver } from "../../simulators/callback_receiver.ts";

/** The package storebCredentialArgs configures: public, it is in the store listing. */
const PACKAGE_NAME = "com.example.app";
/** The tenant's own Pub/Sub push service account. */
const TENANT_ACCOUNT = "play-push@tenant-project.iam.gserviceaccount.com";
/** The stranger's: a service account of their own Google project. */
const STRANGER_ACCOUNT = "forger@strangers-project.iam.gserviceaccount.com";
/** A well-formed tenant id that no database of this run holds. */
const UNKNOWN_TENANT = "tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV";

/** The audience our docs recommend: the public endpoint URL of the tenant. */
function audienceOf(tenantId: string): string {
  return `https://relay.example.com/v1/webhooks/storeb/${tenantId}`;
}

/** `storeb set-credentials` with the docs' audience and the tenant's own account. */
function credentialArgs(tenantId: string, accountFile: string): string[] {
  const args = storebCredentialArgs(tenantId, accountFile, TENANT_ACCOUNT);
  args[args.indexOf("--push-audience") + 1] = audienceOf(tenantId);
  return args;
}

/** A purchase for the tenant's package, as the tenant's own subscription would push it. */
function genuinePurchase() {
  return subscriptionNotification(PACKAGE_NAME, {
    notificationType: 4,
    purchaseToken: `ptok-genuine-${crypto.randomUUID()}`,
  });
}

/** A refund for `purchaseToken`: what a forger would most like the tenant to act on. */
function forgedRefund(purchaseToken: string) {
  return pushEnvelope(voidedPurchaseNotification(PACKAGE_NAME, {
    purchaseToken,
    orderId: "GPA.3372-4150-9088-76543",
    productType: 1,
    refundType: 1,
  }));
}

async function storedEventCount(sql: postgres.Sql, tenantId: string): Promise<number> {
  const [{ count }] = await sql`
    SELECT count(*)::int AS count FROM events WHERE tenant_id = ${tenantId}`;
  return count;
}

function linesOf(service: RunningService, msg: string): LogLine[] {
  return service.logs.filter((line) => line.msg === msg);
}

Deno.test("adversarial: store B pushes from a stranger's Google project are refused", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-adv-storeb-" });
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  const env = { ...issuer.serviceEnv, DELIVERY_RETRY_SCHEDULE: "1s,1s", DELIVERY_TIMEOUT: "2s" };
  const { path: accountFile } = await writeServiceAccountFile(dir);

  // Set up with one process, as an operator did before upgrading: a tenant with a push service
  // account, and two set up as the docs allowed then, without one.
  const before = await startService({ env });
  let service: RunningService = before;
  const tenants: Record<"modern" | "legacy" | "legacy2", string> = {
    modern: "",
    legacy: "",
    legacy2: "",
  };
  const secrets: string[] = [];
  let sql: postgres.Sql | undefined;
  try {
    for (const name of ["modern", "legacy", "legacy2"] as const) {
      const { tenantId, secret } = await createTenantWithCallback(before, receiver.url);
      tenants[name] = tenantId;
      secrets.push(secret!);
      await cliOk(before, ...credentialArgs(tenantId, accountFile));
      if (name !== "modern") {
        const setup = databaseOf(before);
        await setup`UPDATE storeb_credentials SET push_service_account = NULL
          WHERE tenant_id = ${tenantId}`;
        await setup.end();
      }
    }
    receiver.setSecrets(secrets);
    await before.stop();

    // The upgraded service, on the same database.
    service = await startService({ env, db: before.db });
    sql = databaseOf(service);
    const endpoint = (tenantId: string) => `${service.url}/v1/webhooks/storeb/${tenantId}`;
    const post = (tenantId: string, body: unknown, token: string): Promise<JsonAnswer> =>
      postJson(endpoint(tenantId), body, { authorization: `Bearer ${token}` });
    /** A token as Google signs it for the push subscription of `email`'s project. */
    const tokenFor = (tenantId: string, email: string, emailVerified: boolean | string = true) =>
      issuer.mint({ audience: audienceOf(tenantId), email, emailVerified });

    await t.step("the boot warns of the tenants stored without a push service account", () => {
      const [warning, ...more] = linesOf(service, "tenants_without_push_service_account");
      assert.ok(warning, "no boot warning names the legacy tenants");
      assert.equal(more.length, 0);
      assert.equal(warning.level, "warn");
      assert.deepEqual(
        [...warning.tenantIds].sort(),
        [tenants.legacy, tenants.legacy2].sort(),
      );
      assert.equal(warning.count, 2);
      assert.match(warning.hint, /--push-service-account/);
    });

    await t.step("control: the tenant's own subscription is relayed", async () => {
      const renewal = pushEnvelope(subscriptionNotification(PACKAGE_NAME, {
        notificationType: 2,
        purchaseToken: "ptok-genuine-renewal",
        subscriptionId: "pro.monthly",
      }));
      const answer = await post(
        tenants.modern,
        renewal,
        await tokenFor(tenants.modern, TENANT_ACCOUNT),
      );
      const eventId = assertReceipt(answer, {
        externalId: renewal.message.messageId,
        isNew: true,
        enqueuedDelivery: true,
      });
      await deliveryReaches(sql!, eventId, "delivered");
      // The account is compared ignoring case, as Google's email addresses are.
      const again = pushEnvelope(genuinePurchase());
      assertReceipt(
        await post(
          tenants.modern,
          again,
          await tokenFor(tenants.modern, TENANT_ACCOUNT.toUpperCase()),
        ),
        { externalId: again.message.messageId, isNew: true, enqueuedDelivery: true },
      );
    });

    await t.step(
      "a stranger's correctly signed refund for the tenant's audience: 401",
      async () => {
        const token = await tokenFor(tenants.modern, STRANGER_ACCOUNT);
        const answer = await post(tenants.modern, forgedRefund("ptok-forged-modern"), token);
        assertError(answer, 401, "SIGNATURE_INVALID");
      },
    );

    await t.step("the same refund to a tenant stored without an account: 401", async () => {
      for (const tenantId of [tenants.legacy, tenants.legacy2]) {
        const token = await tokenFor(tenantId, STRANGER_ACCOUNT);
        const answer = await post(tenantId, forgedRefund(`ptok-forged-${tenantId}`), token);
        assertError(answer, 401, "UNAUTHENTICATED");
      }
    });

    await t.step("email_verified not true: 401 UNAUTHENTICATED", async () => {
      const token = await tokenFor(tenants.modern, TENANT_ACCOUNT, false);
      const answer = await post(tenants.modern, forgedRefund("ptok-unverified"), token);
      assertError(answer, 401, "UNAUTHENTICATED");
    });

    await t.step('email_verified the string "true": 401 UNAUTHENTICATED', async () => {
      // Google's claim is the boolean; a string that merely reads as true is not it.
      const token = await tokenFor(tenants.modern, TENANT_ACCOUNT, "true");
      const answer = await post(tenants.modern, forgedRefund("ptok-unverified-string"), token);
      assertError(answer, 401, "UNAUTHENTICATED");
    });

    await t.step("a legacy tenant's refusal reads like an unknown tenant's", async () => {
      const token = await tokenFor(tenants.legacy, TENANT_ACCOUNT);
      const legacy = await post(tenants.legacy, forgedRefund("ptok-legacy-probe"), token);
      const unknown = await post(UNKNOWN_TENANT, forgedRefund("ptok-unknown-probe"), token);
      assertError(legacy, 401, "UNAUTHENTICATED");
      assertError(unknown, 401, "UNAUTHENTICATED");
      assert.equal(legacy.json.message, unknown.json.message);
      assert.deepEqual(Object.keys(legacy.json).sort(), Object.keys(unknown.json).sort());
    });

    await t.step("a legacy tenant is named in a warning at most once a minute", async () => {
      // A burst well within the minute of the first refusal above.
      for (let i = 0; i < 5; i++) {
        const token = await tokenFor(tenants.legacy, STRANGER_ACCOUNT);
        assertError(
          await post(tenants.legacy, forgedRefund(`ptok-burst-${i}`), token),
          401,
          "UNAUTHENTICATED",
        );
      }
      const warnings = linesOf(service, "push_service_account_missing");
      for (const tenantId of [tenants.legacy, tenants.legacy2]) {
        const mine = warnings.filter((line) => line.tenantId === tenantId);
        assert.equal(mine.length, 1, `warnings for ${tenantId}: ${JSON.stringify(mine)}`);
        assert.equal(mine[0].level, "warn");
        assert.match(mine[0].hint, /--push-service-account/);
      }
      assert.equal(warnings.length, 2, "only the legacy tenants are named");
    });

    await t.step("nothing forged was stored or delivered", async () => {
      assert.equal(await storedEventCount(sql!, tenants.legacy), 0);
      assert.equal(await storedEventCount(sql!, tenants.legacy2), 0);
      assert.equal(await storedEventCount(sql!, tenants.modern), 2, "the two genuine pushes");
      const [{ count }] = await sql!`
        SELECT count(*)::int AS count FROM events WHERE platform_event = 'storeb.voided_purchase'`;
      assert.equal(count, 0);
      // Deliveries are attempted at once; give a forged one the time it would have needed.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const delivered = receiver.deliveries.map((d) => JSON.stringify(d.json));
      assert.equal(delivered.filter((body) => body.includes("ptok-forged")).length, 0);
      assert.ok(delivered.some((body) => body.includes("ptok-genuine-renewal")));
    });

    await t.step(
      "set-credentials without --push-service-account: usage error, exit 2",
      async () => {
        const args = credentialArgs(tenants.legacy2, accountFile);
        const withoutAccount = args.slice(0, args.indexOf("--push-service-account"));
        const result = await service.cli(...withoutAccount);
        assert.equal(result.code, 2, result.stderr);
        assert.equal(result.stdout, "");
        const error = JSON.parse(result.stderr.trim().split("\n").at(-1)!);
        assert.equal(error.error, "USAGE");
        assert.match(error.message, /--push-service-account is required/);
        const notAnEmail = await service.cli(...withoutAccount, "--push-service-account", "nobody");
        assert.equal(notAnEmail.code, 2, notAnEmail.stderr);
        // Nothing was written: still the legacy credentials.
        const [row] = await sql!`SELECT push_service_account FROM storeb_credentials
        WHERE tenant_id = ${tenants.legacy2}`;
        assert.equal(row.push_service_account, null);
      },
    );

    await t.step("tenant show says what is missing", async () => {
      const shown = await cliOk(service, "tenant", "show", tenants.legacy);
      assert.equal(shown.storeb.pushServiceAccount, null);
      assert.deepEqual(shown.storeb.missing, ["pushServiceAccount"]);
      assert.match(shown.storeb.warning, /refused/);
      assert.match(shown.storeb.warning, /--push-service-account/);
      const modern = await cliOk(service, "tenant", "show", tenants.modern);
      assert.equal(modern.storeb.pushServiceAccount, TENANT_ACCOUNT);
      assert.equal(modern.storeb.missing, undefined);
      assert.equal(modern.storeb.warning, undefined);
    });

    await t.step("the documented fix: set the credentials again with the account", async () => {
      await cliOk(service, ...credentialArgs(tenants.legacy, accountFile));
      const shown = await cliOk(service, "tenant", "show", tenants.legacy);
      assert.equal(shown.storeb.missing, undefined);
      // Credentials reach the receiver within a second.
      const genuine = pushEnvelope(genuinePurchase());
      await eventually(
        async () => {
          const token = await tokenFor(tenants.legacy, TENANT_ACCOUNT);
          const answer = await post(tenants.legacy, genuine, token);
          return answer.status === 200 ? answer : undefined;
        },
        10_000,
        "the fixed tenant's genuine push accepted",
      );
      // And the stranger is still refused, now by the account check.
      const forged = await post(
        tenants.legacy,
        forgedRefund("ptok-forged-after-fix"),
        await tokenFor(tenants.legacy, STRANGER_ACCOUNT),
      );
      assertError(forged, 401, "SIGNATURE_INVALID");
    });
  } finally {
    await sql?.end();
    if (service !== before) await before.stop();
    await stopAndDrop(service);
    await receiver.close();
    await issuer.close();
    await Deno.remove(dir, { recursive: true });
  }
});
