/**
 * A tenant (or whoever controls its callback's DNS) tries to make the relay POST into the
 * relay's own network: the cloud metadata endpoint, loopback, private ranges, in every spelling,
 * and by DNS rebinding (a public answer for the check, a private one for the connection). Through
 * the real CLI and real service processes, whose dispatcher sends the deliveries.
 *
 * The DNS answers of the service are scripted with tests/helpers/dns_answers_preload.ts, loaded
 * into the service process with `--preload`. That TLS still checks the certificate against the
 * host name on a pinned connection is tested in tests/delivery_sender_test.ts.
 */
import assert from "node:assert/strict";
import { lookup } from "node:dns/promises";
import { join } from "node:path";
import {
  type CliResult,
  databaseOf,
  freshDatabase,
  runCli,
  type RunningService,
  startService,
  stopAndDrop,
  TEST_ENCRYPTION_KEY,
} from "../helpers/service.ts";
import { readConfig } from "../../src/config.ts";
import { callbackPolicyOf } from "../../src/delivery/callback_policy.ts";
import { callbackUrlProblem } from "../../src/delivery/callback_url.ts";
import { checkCallback } from "../../src/delivery/callback_target.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "../helpers/fixtures.ts";
import { eventually, postJson } from "../helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../../simulators/storea_pki.ts";
import { StoreaSigner } from "../../simulators/storea_signer.ts";

const DNS_PRELOAD = new URL("../helpers/dns_answers_preload.ts", import.meta.url).pathname;

/** Callback URLs that reach an address that is not globally reachable, however written. */
const SPECIAL_PURPOSE_CALLBACKS = [
  // The three that production accepted before.
  "https://[64:ff9b::a9fe:a9fe]/", // NAT64 of the metadata address
  "https://[::a9fe:a9fe]/", // IPv4-compatible metadata address
  "https://198.18.0.1/", // benchmarking
  // The metadata address in IPv4 spellings the URL parser reads as 169.254.169.254.
  "https://169.254.169.254/latest/meta-data/",
  "https://2852039166/",
  "https://0xa9fea9fe/",
  "https://0xa9.0xfe.0xa9.0xfe/",
  "https://0251.0376.0251.0376/",
  "https://169.254.43518/",
  // ... and in IPv6 forms that carry it.
  "https://[::ffff:169.254.169.254]/",
  "https://[::ffff:a9fe:a9fe]/",
  "https://[64:ff9b::169.254.169.254]/",
  "https://[64:ff9b:1::a9fe:a9fe]/",
  "https://[2002:a9fe:a9fe::1]/",
  "https://[2001:0:a9fe:a9fe::1]/", // Teredo
  // Loopback, unspecified, private, shared, reserved, documentation, broadcast, multicast.
  "https://127.0.0.1/",
  "https://127.1/",
  "https://0x7f000001/",
  "https://0/",
  "https://0.0.0.0/",
  "https://10.0.0.1/",
  "https://172.16.0.1/",
  "https://192.168.0.1/",
  "https://100.64.0.1/",
  "https://192.0.0.8/",
  "https://192.0.0.170/",
  "https://192.0.2.1/",
  "https://198.51.100.1/",
  "https://203.0.113.1/",
  "https://240.0.0.1/",
  "https://255.255.255.255/",
  "https://224.0.0.1/",
  "https://[::1]/",
  "https://[::]/",
  "https://[::ffff:127.0.0.1]/",
  "https://[100::1]/",
  "https://[2001:db8::1]/",
  "https://[2001:2::1]/",
  "https://[fc00::1]/",
  "https://[fd12:3456::1]/",
  "https://[fe80::1]/",
  "https://[fec0::1]/",
  "https://[ff02::1]/",
  "https://[3fff::1]/",
  "https://localhost/",
  "https://localhost./",
  "https://metadata.localhost/",
];

function refusedAsInvalid(result: CliResult, url: string): void {
  assert.equal(result.code, 1, `${url} was accepted: ${result.stdout}`);
  assert.equal(result.json?.error, "INVALID_CALLBACK_URL", `${url}: ${result.stderr}`);
}

/**
 * The forms the CLI is asked about in its own processes, one of each kind; the policy the CLI
 * applies is checked on every form in the test's process, which spares some forty processes.
 */
const CLI_SAMPLE = [
  ...SPECIAL_PURPOSE_CALLBACKS.slice(0, 3),
  "https://0xa9.0xfe.0xa9.0xfe/",
  "https://[::ffff:169.254.169.254]/",
  "https://[2001:0:a9fe:a9fe::1]/",
  "https://localhost./",
];

Deno.test("ssrf: in production every special-purpose address form is refused when set", async () => {
  // The policy a production configuration gives the CLI and the service, on every form.
  const production = callbackPolicyOf(
    readConfig({ NODE_ENV: "production", ENCRYPTION_KEY: TEST_ENCRYPTION_KEY }),
  );
  for (const url of SPECIAL_PURPOSE_CALLBACKS) {
    assert.notEqual(callbackUrlProblem(url, production), null, `${url} was accepted`);
  }
  const db = await freshDatabase({ migrated: true });
  try {
    const env = { ...db.env, NODE_ENV: "production" };
    const cli = (...args: string[]) => runCli(args, env);
    // The CLI refuses a callback before it opens the database, so the refusals can run at once.
    const refusals = await Promise.all(
      CLI_SAMPLE.map((url) => cli("tenant", "create", "--name", "Attacker", "--callback-url", url)),
    );
    refusals.forEach((result, i) => refusedAsInvalid(result, CLI_SAMPLE[i]));
    const created = await cli(
      "tenant",
      "create",
      "--name",
      "Tenant",
      "--callback-url",
      "https://hooks.example.com/x",
    );
    assert.equal(created.code, 0, created.stderr);
    for (const url of SPECIAL_PURPOSE_CALLBACKS.slice(0, 3)) {
      refusedAsInvalid(await cli("tenant", "set-callback", created.json.id, "--url", url), url);
    }
    // Globally reachable addresses stay allowed, including the NAT64 form of a public one.
    for (
      const url of ["https://[64:ff9b::808:808]/x", "https://8.8.8.8/x", "https://192.0.0.9/x"]
    ) {
      const set = await cli("tenant", "set-callback", created.json.id, "--url", url);
      assert.equal(set.code, 0, `${url}: ${set.stderr}`);
    }
    const list = await cli("tenant", "list");
    assert.deepEqual(
      list.json.tenants.map((t: { id: string; callbackUrl: string }) => [t.id, t.callbackUrl]),
      [[created.json.id, "https://192.0.0.9/x"]],
    );
  } finally {
    await db.drop();
  }
});

/** A service whose tenant has store A credentials, and a way to send it notifications. */
interface Relay {
  service: RunningService;
  tenantId: string;
  /** The CLI as an operator whose own settings allow any callback (it skips the set-time check). */
  permissiveCli(...args: string[]): Promise<CliResult>;
  /** Sends a fresh notification; resolves with its event id. */
  notify(): Promise<string>;
  close(): Promise<void>;
}

async function startRelay(env: Record<string, string>, dnsAnswers: Record<string, string[][]>) {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const db = await freshDatabase();
  const service = await startService({
    db,
    // The preload reads its answers from TEST_DNS_ANSWERS, which the service may not read.
    permissions: (flags) => [
      ...flags.map((flag) => flag.startsWith("--allow-env=") ? `${flag},TEST_DNS_ANSWERS` : flag),
      "--preload",
      DNS_PRELOAD,
    ],
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s,1s",
      DELIVERY_TIMEOUT: "2s",
      TEST_DNS_ANSWERS: JSON.stringify(dnsAnswers),
      ...env,
    },
  });
  // Outside production both allowances are on by default, before and after the split.
  const permissiveCli = (...args: string[]) => runCli(args, { ...service.env, NODE_ENV: "test" });
  const tenant = await permissiveCli("tenant", "create", "--name", "Relay");
  assert.equal(tenant.code, 0, tenant.stderr);
  const credentials = await permissiveCli(
    ...storeaCredentialArgs(tenant.json.id, await writeStoreaKeyFile(dir)),
  );
  assert.equal(credentials.code, 0, credentials.stderr);
  const relay: Relay = {
    service,
    tenantId: tenant.json.id,
    permissiveCli,
    async notify() {
      const signedPayload = await signer.signNotification(
        await signer.notificationPayload({
          notificationType: "DID_RENEW",
          transaction: signer.sampleTransaction({}),
        }),
      );
      const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenant.json.id}`, {
        signedPayload,
      });
      assert.equal(answer.status, 200, JSON.stringify(answer.json));
      return answer.json.eventId;
    },
    async close() {
      await stopAndDrop(service);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
  return relay;
}

/** The recorded attempts of an event's delivery, oldest first, once there are `count`. */
async function attemptsOf(
  relay: Relay,
  eventId: string,
  count: number,
): Promise<{ error: string | null; response_code: number | null }[]> {
  const sql = databaseOf(relay.service);
  try {
    return await eventually(
      async () => {
        const rows = await sql`
        SELECT a.error, a.response_code FROM delivery_attempts a
        JOIN deliveries d ON d.id = a.delivery_id
        WHERE d.event_id = ${eventId} ORDER BY a.id`;
        if (rows.length < count) return undefined;
        return rows.slice(0, count).map((row) => ({
          error: row.error as string | null,
          response_code: row.response_code as number | null,
        }));
      },
      15_000,
      `${count} attempts of ${eventId}`,
    );
  } finally {
    await sql.end();
  }
}

/** Resolves once none of the relay's deliveries is pending: every retry is spent. */
async function noDeliveryPending(relay: Relay): Promise<void> {
  const sql = databaseOf(relay.service);
  try {
    await eventually(
      async () => {
        const [row] = await sql`
          SELECT count(*)::int AS pending FROM deliveries WHERE status = 'pending'`;
        return row.pending === 0 ? true : undefined;
      },
      15_000,
      "no pending delivery",
    );
  } finally {
    await sql.end();
  }
}

/** A TCP listener that only counts the connections made to it. */
function startConnectionCounter(hostname: string) {
  const listener = Deno.listen({ hostname, port: 0 });
  let connections = 0;
  const accepting = (async () => {
    for await (const conn of listener) {
      connections++;
      conn.close();
    }
  })().catch(() => {});
  return {
    port: (listener.addr as Deno.NetAddr).port,
    connections: () => connections,
    async close() {
      listener.close();
      await accepting;
    },
  };
}

/**
 * An address this machine's own resolver (getaddrinfo, which an HTTP client resolving the name
 * again would use) gives for its host name: usually 127.0.0.1 or the machine's private address.
 */
async function systemAddressOf(name: string): Promise<string | null> {
  try {
    return (await lookup(name, { family: 4 })).address;
  } catch {
    return null;
  }
}

/** Spellings of the cloud metadata addresses, carried in IPv6 forms too. */
const METADATA_CALLBACKS = [
  "https://[64:ff9b::a9fe:a9fe]/", // NAT64
  "https://[::a9fe:a9fe]/", // IPv4-compatible
  "https://169.254.169.254/latest/meta-data/",
  "https://2852039166/",
  "https://0xa9.0xfe.0xa9.0xfe/",
  "https://0251.0376.0251.0376/",
  "https://169.254.43518/",
  "https://[::ffff:169.254.169.254]/",
  "https://[64:ff9b::169.254.169.254]/",
  "https://[2002:a9fe:a9fe::1]/", // 6to4
  "https://[fd00:ec2::254]/",
  "https://169.254.170.2/v2/credentials",
  "https://100.100.100.200/latest/meta-data/",
];

Deno.test("ssrf: a cloud metadata service is refused even where private networks are allowed", async () => {
  // An operator who allows private networks (a callback on the same VPC) still cannot be made to
  // post the machine's credentials request to its metadata service.
  const permissive = { allowHttp: true, allowPrivateNetworks: true };
  for (const url of METADATA_CALLBACKS) {
    assert.match(callbackUrlProblem(url, permissive) ?? "", /cloud metadata service/, url);
  }
  assert.equal(callbackUrlProblem("https://10.0.0.1/", permissive), null);
  assert.equal(callbackUrlProblem("http://metadata.internal/", permissive), null);
  // A name resolving to one, checked at send time.
  const resolvingTo = (addresses: string[]) => () => Promise.resolve(addresses);
  for (const addresses of [["169.254.169.254"], ["10.0.0.1", "fd00:ec2::254"]]) {
    const checked = await checkCallback("http://metadata.internal/", {
      policy: permissive,
      timeoutMs: 1_000,
      resolve: resolvingTo(addresses),
    }, AbortSignal.timeout(1_000));
    assert.ok("problem" in checked, `${addresses} passed`);
    assert.match(checked.problem, /resolves to .* cloud metadata service/);
  }
  const lan = await checkCallback("http://intranet.internal/", {
    policy: permissive,
    timeoutMs: 1_000,
    resolve: resolvingTo(["10.0.0.7"]),
  }, AbortSignal.timeout(1_000));
  assert.deepEqual("addresses" in lan && lan.addresses, ["10.0.0.7"]);
  // The CLI of a development setup refuses it when it is set.
  const db = await freshDatabase({ migrated: true });
  try {
    const refused = await runCli(
      ["tenant", "create", "--name", "Attacker", "--callback-url", "http://169.254.169.254/"],
      { ...db.env, NODE_ENV: "development" },
    );
    refusedAsInvalid(refused, "http://169.254.169.254/");
  } finally {
    await db.drop();
  }
});

Deno.test("ssrf: the dispatcher refuses special-purpose targets and DNS rebinding at send time", async (t) => {
  // The rebinding host: a name this machine resolves to one of its own addresses, where the sink
  // listens. Scripted DNS answers it with a public address first, then with the sink's address.
  const rebindingHost = Deno.hostname();
  const sinkAddress = await systemAddressOf(rebindingHost) ?? "127.0.0.1";
  const sink = startConnectionCounter(sinkAddress);
  const relay = await startRelay({ NODE_ENV: "production" }, {
    [rebindingHost]: [["192.0.0.9"], [sinkAddress]],
  });
  try {
    await t.step("literal special-purpose addresses that passed an older check", async () => {
      // Stored as an older version stored them: today's CLI refuses the metadata ones even where
      // private networks are allowed.
      const sql = databaseOf(relay.service);
      for (const url of SPECIAL_PURPOSE_CALLBACKS.slice(0, 3)) {
        try {
          await sql`UPDATE tenants SET callback_url = ${url} WHERE id = ${relay.tenantId}`;
        } catch (error) {
          await sql.end();
          throw error;
        }
        const [first] = await attemptsOf(relay, await relay.notify(), 1);
        assert.equal(first.response_code, null);
        assert.match(
          first.error ?? "",
          /^callback URL refused: must not point at an address that is not public: /,
          url,
        );
      }
      await sql.end();
    });
    await t.step("a DNS answer that changes between check and connection", async () => {
      // A retry of the step above would go to the new callback and take its first DNS answer.
      await noDeliveryPending(relay);
      const url = `https://${rebindingHost}:${sink.port}/hooks`;
      const set = await relay.permissiveCli("tenant", "set-callback", relay.tenantId, "--url", url);
      assert.equal(set.code, 0, set.stderr);
      const [first, second] = await attemptsOf(relay, await relay.notify(), 2);
      assert.equal(
        sink.connections(),
        0,
        `the private address was reached; first attempt: ${first.error}`,
      );
      // The first attempt was checked against the public answer and went there, not to a
      // second lookup's answer; the next one was refused on the private answer.
      assert.equal(first.response_code, null);
      assert.doesNotMatch(first.error ?? "", /refused: /);
      assert.match(
        second.error ?? "",
        new RegExp(
          `resolves to an address that is not public: ${sinkAddress.replaceAll(".", "\\.")} is in`,
        ),
      );
    });
  } finally {
    await relay.close();
    await sink.close();
  }
});

Deno.test("ssrf: callback query strings reach neither the logs nor the attempts", async () => {
  // Outside production, both allowances on: a plain http callback on loopback is allowed.
  const relay = await startRelay({}, {});
  try {
    // Callbacks that fail, so that the HTTP client's error is what gets stored and logged: a
    // closed port, and a name that cannot resolve (.invalid, RFC 6761).
    const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (closed.addr as Deno.NetAddr).port;
    closed.close();
    for (
      const url of [
        `http://127.0.0.1:${port}/hooks?token=tenant-secret`,
        "http://callback.invalid/hooks?token=tenant-secret",
      ]
    ) {
      const set = await relay.permissiveCli("tenant", "set-callback", relay.tenantId, "--url", url);
      assert.equal(set.code, 0, set.stderr);
      const [first] = await attemptsOf(relay, await relay.notify(), 1);
      assert.equal(first.response_code, null);
      assert.ok((first.error ?? "").length > 0);
    }
    const sql = databaseOf(relay.service);
    try {
      const stored = await sql`
        SELECT error AS text FROM delivery_attempts
        UNION ALL SELECT last_error FROM deliveries`;
      for (const row of stored) {
        assert.ok(!String(row.text).includes("tenant-secret"), `stored: ${row.text}`);
      }
    } finally {
      await sql.end();
    }
    await relay.service.waitForLog((line) =>
      line.msg === "delivery_attempt" && line.error !== null
    );
    assert.ok(
      !relay.service.rawStdout().includes("tenant-secret"),
      "a log line holds the callback's query string",
    );
  } finally {
    await relay.close();
  }
});
