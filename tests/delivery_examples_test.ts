/**
 * The verification examples of docs/examples/ and Stripe's own library, given a real delivery:
 * a store A REFUND that a running service received, relayed and signed. Each example runs as a
 * program, as a tenant would run it, and must accept the delivery and refuse a tampered body,
 * an old timestamp, a wrong secret and broken headers, saying why (docs/deliveries.md,
 * "Verifying deliveries"). An example whose toolchain is not installed is skipped, saying so;
 * .ci/run installs them all.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
// @ts-types="./helpers/stripe_webhooks.d.ts"
import Stripe from "stripe";
import { runCli, startService, stopAndDrop } from "./helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "./helpers/fixtures.ts";
import { postJson } from "./helpers/relay.ts";
import { signatureHeader } from "../src/delivery/signature.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { startCallbackReceiver } from "../simulators/callback_receiver.ts";
import { checkDelivery, type DeliveryRefusal } from "../docs/examples/verify_delivery.ts";

const EXAMPLES = fileURLToPath(new URL("../docs/examples/", import.meta.url));
const WRONG_SECRET = "whsec_2Vq8mJ0pLxR7cN4tYk1sWb9eHfGu3aZo6dQiTnXyKvE";

/** One input to a verifier and what it must answer. */
interface Case {
  name: string;
  secret: string;
  header: string;
  body: string;
  /** null: the delivery is genuine. */
  refusal: DeliveryRefusal | null;
}

/** A real delivery, as the tenant's receiver got it, and the tenant's webhook secret. */
interface RealDelivery {
  secret: string;
  header: string;
  body: string;
}

/**
 * Runs a service with a store A tenant whose callback is a local receiver, sends it a signed
 * REFUND notification and returns the delivery the receiver got.
 */
async function realRefundDelivery(): Promise<RealDelivery> {
  const dir = await Deno.makeTempDir();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app" });
  const receiver = await startCallbackReceiver();
  const service = await startService({
    env: { STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")) },
  });
  try {
    // As an operator whose CLI allows a callback on loopback.
    const setup = async (...args: string[]) => {
      const result = await runCli(args, {
        ...service.env,
        CALLBACK_ALLOW_HTTP: "true",
        CALLBACK_ALLOW_PRIVATE_NETWORKS: "true",
      });
      assert.equal(result.code, 0, result.stderr);
      return result.json;
    };
    const tenant = await setup(
      "tenant",
      "create",
      "--name",
      "Examples",
      "--callback-url",
      receiver.url,
    );
    receiver.setSecrets([tenant.webhookSecret]);
    await setup(...storeaCredentialArgs(tenant.id, await writeStoreaKeyFile(dir)));

    const transaction = signer.sampleTransaction({
      appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
      revocationDate: Date.now(),
      revocationReason: 0,
    });
    const signedPayload = await signer.signNotification(
      await signer.notificationPayload({ notificationType: "REFUND", transaction }),
    );
    const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenant.id}`, {
      signedPayload,
    });
    assert.equal(answer.status, 200, JSON.stringify(answer.json));
    const [delivery] = await receiver.waitFor(1, 15_000);
    assert.equal(delivery.signatureValid, true);

    // docs/events.md: a refund has no subject; the user key is in the nested transaction.
    // deno-lint-ignore no-explicit-any
    const body = delivery.json as any;
    assert.equal(body.event, "refund.issued");
    assert.equal(body.subject, null);
    const refunded = decodeJwsPayload(body.data.data.signedTransactionInfo);
    assert.equal(refunded.originalTransactionId, transaction.originalTransactionId);
    assert.equal(refunded.transactionId, transaction.transactionId);
    assert.equal(refunded.appAccountToken, "7e3fb20b-4cdb-47cc-936d-99d65f608138");

    return {
      secret: tenant.webhookSecret,
      header: delivery.headers["x-service-signature"],
      body: delivery.body,
    };
  } finally {
    await stopAndDrop(service);
    await receiver.close();
    await Deno.remove(dir, { recursive: true });
  }
}

/** The payload of a compact JWS, as docs/integration.md shows a tenant reading it. */
function decodeJwsPayload(jws: string): Record<string, unknown> {
  const part = jws.split(".")[1].replaceAll("-", "+").replaceAll("_", "/");
  const binary = atob(part + "=".repeat((4 - (part.length % 4)) % 4));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0))));
}

function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

/** The cases every verifier must answer alike, built around `real`. */
function casesOf(real: RealDelivery): Case[] {
  const { secret, header, body } = real;
  const t = nowSeconds();
  // A non-ASCII body: the HMAC covers the UTF-8 bytes, not characters.
  const parsed = JSON.parse(body);
  const accented = JSON.stringify({ ...parsed, data: { ...parsed.data, note: "Grüße, 東京" } });
  return [
    { name: "the real delivery", secret, header, body, refusal: null },
    {
      name: "a non-ASCII body",
      secret,
      header: signatureHeader([secret], t, accented),
      body: accented,
      refusal: null,
    },
    {
      name: "a rotation's two signatures",
      secret,
      header: signatureHeader([WRONG_SECRET, secret], t, body),
      body,
      refusal: null,
    },
    {
      name: "a tampered body",
      secret,
      header,
      body: body.replace('"refund.issued"', '"refund.declined"'),
      refusal: "no_matching_signature",
    },
    {
      name: "a body parsed and serialised again",
      secret,
      header,
      body: JSON.stringify(parsed, null, 2),
      refusal: "no_matching_signature",
    },
    {
      name: "an old timestamp",
      secret,
      header: signatureHeader([secret], t - 301, body),
      body,
      refusal: "timestamp_outside_tolerance",
    },
    {
      name: "a timestamp in the future",
      secret,
      // Well beyond the tolerance: the clock moves on while the programs run.
      header: signatureHeader([secret], t + 400, body),
      body,
      refusal: "timestamp_outside_tolerance",
    },
    {
      name: "a wrong secret",
      secret: WRONG_SECRET,
      header,
      body,
      refusal: "no_matching_signature",
    },
    { name: "no header", secret, header: "", body, refusal: "no_header" },
    {
      name: "a header without t",
      secret,
      header: header.split(",")[1],
      body,
      refusal: "malformed_header",
    },
    { name: "a header without v1", secret, header: `t=${t}`, body, refusal: "malformed_header" },
  ];
}

/** An example program: how to find its toolchain and how to run it. */
interface Program {
  file: string;
  /** The commands it needs, and the Debian package that has them. */
  needs: string[];
  debian: string;
  /** Builds it if it must be built; returns the command line before SECRET HEADER BODY_FILE. */
  prepare(workDir: string): Promise<string[]>;
}

const PROGRAMS: Program[] = [
  {
    file: "verify_delivery.py",
    needs: ["python3"],
    debian: "python3",
    prepare: () => Promise.resolve(["python3", join(EXAMPLES, "verify_delivery.py")]),
  },
  {
    file: "verify_delivery.rb",
    needs: ["ruby"],
    debian: "ruby",
    prepare: () => Promise.resolve(["ruby", join(EXAMPLES, "verify_delivery.rb")]),
  },
  {
    file: "verify_delivery.php",
    needs: ["php"],
    debian: "php-cli",
    prepare: () => Promise.resolve(["php", join(EXAMPLES, "verify_delivery.php")]),
  },
  {
    file: "verify_delivery.go",
    needs: ["go"],
    debian: "golang-go",
    async prepare(workDir) {
      const binary = join(workDir, "verify_delivery_go");
      await mustRun("go", ["build", "-o", binary, join(EXAMPLES, "verify_delivery.go")], {
        GOCACHE: join(workDir, "gocache"),
        GOPATH: join(workDir, "gopath"),
      });
      return [binary];
    },
  },
  {
    file: "verify_delivery.java",
    needs: ["javac", "java"],
    debian: "openjdk-17-jdk-headless",
    async prepare(workDir) {
      // Compiled once rather than run as a source file, which compiles on every run. javac wants
      // the file named after its public class, as a project would have it.
      const classes = join(workDir, "java");
      await Deno.mkdir(classes);
      const source = join(classes, "VerifyDelivery.java");
      await Deno.copyFile(join(EXAMPLES, "verify_delivery.java"), source);
      await mustRun("javac", ["-d", classes, source]);
      return ["java", "-cp", classes, "VerifyDelivery"];
    },
  },
];

async function mustRun(command: string, args: string[], env: Record<string, string> = {}) {
  const output = await new Deno.Command(command, { args, env, stdout: "piped", stderr: "piped" })
    .output();
  const text = new TextDecoder().decode(output.stderr) + new TextDecoder().decode(output.stdout);
  assert.equal(output.code, 0, `${command} ${args.join(" ")}: ${text}`);
}

async function commandExists(command: string): Promise<boolean> {
  try {
    const args = command === "go" ? ["version"] : ["--version"];
    const { success } = await new Deno.Command(command, { args, stdout: "null", stderr: "null" })
      .output();
    return success;
  } catch {
    return false;
  }
}

/** Why `program` cannot run here, or null when it can. */
async function missingToolchain(program: Program): Promise<string | null> {
  for (const command of program.needs) {
    if (!(await commandExists(command))) {
      return `${program.file} skipped: \`${command}\` is not installed ` +
        `(Debian: apt-get install ${program.debian}; .ci/run installs it)`;
    }
  }
  return null;
}

/** Runs the example on one case: its output and exit status. */
async function runExample(
  commandLine: string[],
  workDir: string,
  example: Case,
): Promise<{ code: number; stdout: string }> {
  const bodyFile = join(workDir, "body.json");
  await Deno.writeTextFile(bodyFile, example.body);
  const output = await new Deno.Command(commandLine[0], {
    args: [...commandLine.slice(1), example.secret, example.header, bodyFile],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: output.code, stdout: new TextDecoder().decode(output.stdout).trim() };
}

function expectedOutput(example: Case): { code: number; stdout: string } {
  return example.refusal === null
    ? { code: 0, stdout: "valid" }
    : { code: 1, stdout: `invalid: ${example.refusal}` };
}

Deno.test("docs/examples and Stripe's library verify a real delivery", async (t) => {
  const real = await realRefundDelivery();
  const workDir = await Deno.makeTempDir({ prefix: "pr-examples-" });
  try {
    await t.step("verify_delivery.ts", async () => {
      for (const example of casesOf(real)) {
        const check = await checkDelivery(example.secret, example.header || null, example.body);
        assert.deepEqual(
          check,
          { valid: example.refusal === null, reason: example.refusal },
          example.name,
        );
      }
    });

    for (const program of PROGRAMS) {
      const missing = await missingToolchain(program);
      if (missing !== null) console.log(missing);
      await t.step({
        name: program.file,
        ignore: missing !== null,
        async fn() {
          const commandLine = await program.prepare(workDir);
          for (const example of casesOf(real)) {
            const answer = await runExample(commandLine, workDir, example);
            assert.deepEqual(answer, expectedOutput(example), `${program.file}: ${example.name}`);
          }
          const usage = await new Deno.Command(commandLine[0], {
            args: commandLine.slice(1),
            stdout: "null",
            stderr: "null",
          }).output();
          assert.equal(usage.code, 2, `${program.file} without arguments`);
        },
      });
    }

    await t.step("the stripe npm package (constructEventAsync, as in Deno)", async () => {
      await assertStripeVerdicts(
        real,
        (body, header, secret) => Stripe.webhooks.constructEventAsync(body, header, secret),
      );
    });

    const nodeMissing = (await commandExists("node"))
      ? null
      : "the stripe npm package on Node skipped: `node` is not installed (Debian: apt-get install nodejs)";
    if (nodeMissing !== null) console.log(nodeMissing);
    await t.step({
      name: "the stripe npm package on Node (constructEvent, as docs/integration.md shows it)",
      ignore: nodeMissing !== null,
      async fn() {
        const script = await nodeStripeScript(workDir);
        await assertStripeVerdicts(real, async (body, header, secret) => {
          const bodyFile = join(workDir, "stripe_body.json");
          await Deno.writeTextFile(bodyFile, body);
          const output = await new Deno.Command("node", {
            args: [script, secret, header, bodyFile],
            cwd: workDir,
            stdout: "piped",
            stderr: "piped",
          }).output();
          const stdout = new TextDecoder().decode(output.stdout);
          if (output.code === 0) return JSON.parse(stdout);
          throw new Error(stdout + new TextDecoder().decode(output.stderr));
        });
      },
    });
  } finally {
    await Deno.remove(workDir, { recursive: true });
  }
});

/**
 * What Stripe's library answers for our deliveries: the same as our examples, except that it
 * accepts a timestamp in the future and reports its refusals in its own words.
 */
async function assertStripeVerdicts(
  real: RealDelivery,
  construct: (body: string, header: string, secret: string) => Promise<unknown>,
): Promise<void> {
  const stripeMessages: Record<DeliveryRefusal, RegExp> = {
    no_header: /No stripe-signature header value was provided/,
    malformed_header:
      /Unable to extract timestamp and signatures from header|No signatures found with expected scheme/,
    timestamp_outside_tolerance: /Timestamp outside the tolerance zone/,
    no_matching_signature: /No signatures found matching the expected signature for payload/,
  };
  for (const example of casesOf(real)) {
    const future = example.name === "a timestamp in the future";
    if (example.refusal === null || future) {
      const event = await construct(example.body, example.header, example.secret);
      assert.deepEqual(event, JSON.parse(example.body), example.name);
    } else {
      await assert.rejects(
        construct(example.body, example.header, example.secret),
        stripeMessages[example.refusal],
        example.name,
      );
    }
  }
}

/**
 * A Node script that verifies with `stripe.webhooks.constructEvent`, as docs/integration.md
 * shows it, using the stripe package pinned in deno.json from Deno's npm cache.
 */
async function nodeStripeScript(workDir: string): Promise<string> {
  const info = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const npmCache: string = JSON.parse(new TextDecoder().decode(info.stdout)).npmCache;
  const denoJson = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
  const version = denoJson.imports.stripe.replace("npm:stripe@", "");
  const stripePackage = join(npmCache, "registry.npmjs.org", "stripe", version);
  assert.ok(
    (await Deno.stat(stripePackage)).isDirectory,
    `npm:stripe@${version} is not in ${npmCache}`,
  );
  await Deno.mkdir(join(workDir, "node_modules"), { recursive: true });
  await Deno.symlink(stripePackage, join(workDir, "node_modules", "stripe"));
  const script = join(workDir, "stripe_verify.mjs");
  await Deno.writeTextFile(
    script,
    `import Stripe from "stripe";
import { readFileSync } from "node:fs";
const [secret, header, bodyFile] = process.argv.slice(2);
const stripe = new Stripe("sk_test_unused");
try {
  const delivery = stripe.webhooks.constructEvent(readFileSync(bodyFile), header, secret);
  process.stdout.write(JSON.stringify(delivery));
} catch (error) {
  process.stdout.write(error.message);
  process.exit(1);
}
`,
  );
  return script;
}
