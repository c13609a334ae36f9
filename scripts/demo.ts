/**
 * `deno task demo`: the whole flow on one machine, on loopback only, in about half a minute.
 *
 * It starts the store simulators and a callback receiver in this process, the real service as a
 * child process (`deno run main.ts serve`) on a fresh embedded database in a temporary directory,
 * sets up a tenant through the real admin CLI (`deno run main.ts <command>`), verifies one purchase
 * of each store over HTTP, sends one notification of each store, and shows the signed deliveries
 * arriving at the receiver. Before each action it prints the command a user would run.
 *
 * `--keep` leaves the service and the simulators running until Ctrl-C. Everything is cleaned up at
 * the end, on failure and on Ctrl-C; every wait is bounded.
 *
 * @module
 */
import { join } from "node:path";
import { pushEnvelope, subscriptionNotification } from "../simulators/storeb_push.ts";
import {
  type CallbackReceiver,
  type ReceivedDelivery,
  startCallbackReceiver,
} from "../simulators/callback_receiver.ts";
import {
  ExplainedError,
  type JsonAnswer,
  requestJson,
  runAdminCommand,
  serviceEnv,
  ServiceProcess,
  withTimeout,
} from "./local_service.ts";
import {
  createTenantStoreKeys,
  playPurchaseToken,
  SIMULATED_APP,
  type SimulatedStores,
  startSimulatedStores,
  type TenantStoreKeys,
  writeTenantStoreKeys,
} from "./simulated_stores.ts";
import { bold, curlArguments, cyan, dim, green, red, shellWord } from "./terminal.ts";

const BUNDLE_ID = SIMULATED_APP.bundleId;
const PACKAGE_NAME = SIMULATED_APP.packageName;
const TRANSACTION_ID = "2000000123456789";
const RENEWAL_TRANSACTION_ID = "2000000123456790";
const STOREA_PRODUCT_ID = SIMULATED_APP.storeaProductId;
const STOREB_PRODUCT_ID = SIMULATED_APP.storebProductId;
const PUSH_ACCOUNT = SIMULATED_APP.pushServiceAccount;

/** First boot may download the service's npm packages: allow for a slow network. */
const BOOT_TIMEOUT_MS = 120_000;
const CLI_TIMEOUT_MS = 60_000;
const HTTP_TIMEOUT_MS = 15_000;
const DELIVERY_TIMEOUT_MS = 15_000;
const CLOSE_TIMEOUT_MS = 5_000;
const TOTAL_STEPS = 12;

const USAGE = `usage: deno task demo [--keep]

Runs Purchase Relay end to end on this machine against store simulators: no Apple or Google
account, no database server, no network access beyond loopback.

  --keep   leave the service and the simulators running after the demo, until Ctrl-C
  --help   print this text`;

// ---------------------------------------------------------------------------------------------
// Output

/** Prints lines as they are. */
function say(...lines: string[]): void {
  for (const line of lines) console.log(line);
}

/** Prints an explanation, indented. */
function explain(...lines: string[]): void {
  for (const line of lines) console.log(`  ${line}`);
}

/** Prints the command a user would run, `\`-continued over several lines. */
function showCommand(lines: string[]): void {
  console.log("");
  lines.forEach((line, index) => {
    const prefix = index === 0 ? "  $ " : "      ";
    const suffix = index < lines.length - 1 ? " \\" : "";
    console.log(cyan(`${prefix}${line}${suffix}`));
  });
  console.log("");
}

/** Prints a value as indented JSON. */
function showJson(value: unknown): void {
  for (const line of JSON.stringify(value, null, 2).split("\n")) console.log(`    ${line}`);
}

function ok(text: string): void {
  console.log(`  ${green("✓")} ${text}`);
}

/** `text` cut to `max` characters with an ellipsis. */
function shorten(text: string, max = 40): string {
  return text.length <= max ? text : `${text.slice(0, max)}…`;
}

/** Long strings shortened and nested objects below `depth` summarised, for display. */
function abridge(value: unknown, depth = 2): unknown {
  if (typeof value === "string") return shorten(value, 56);
  if (Array.isArray(value)) {
    return depth <= 0 ? `[${value.length} items]` : value.map((item) => abridge(item, depth - 1));
  }
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value);
    if (depth <= 0) return { "...": `${entries.length} fields` };
    return Object.fromEntries(entries.map(([key, item]) => [key, abridge(item, depth - 1)]));
  }
  return value;
}

/** The named fields of `value`, then a `"..."` entry counting the ones left out. */
function pick(value: Record<string, unknown>, keys: string[]): Record<string, unknown> {
  const picked: Record<string, unknown> = {};
  for (const key of keys) if (key in value) picked[key] = value[key];
  const rest = Object.keys(value).length - Object.keys(picked).length;
  if (rest > 0) picked["..."] = `${rest} more ${rest === 1 ? "field" : "fields"}`;
  return picked;
}

/** The CLI command as a user runs it from a checkout, cut into lines of a readable width. */
function cliCommandLines(args: string[]): string[] {
  const lines: string[] = [];
  let line = "deno task cli";
  for (let i = 0; i < args.length; i++) {
    // An option and its value stay together.
    let word = shellWord(args[i]);
    if (args[i].startsWith("--") && i + 1 < args.length && !args[i + 1].startsWith("--")) {
      word += ` ${shellWord(args[++i])}`;
    }
    if (line.length + word.length + 1 > 92) {
      lines.push(line);
      line = word;
    } else {
      line += ` ${word}`;
    }
  }
  lines.push(line);
  return lines;
}

/** A curl command: URL, headers and a JSON body (already shortened for display). */
function curlLines(url: string, headers: Record<string, string>, body: string): string[] {
  return [`curl -s ${url}`, ...curlArguments(headers, body)];
}

// ---------------------------------------------------------------------------------------------
// Running things

/** Everything the demo starts, so that one call stops it all. */
class Resources {
  tempDir: string | null = null;
  service: ServiceProcess | null = null;
  readonly simulators: { name: string; close(): Promise<void> }[] = [];
  readonly commands = new Set<Deno.ChildProcess>();
  #cleaning: Promise<void> | null = null;

  cleanUp(): Promise<void> {
    this.#cleaning ??= this.#cleanUp();
    return this.#cleaning;
  }

  async #cleanUp(): Promise<void> {
    for (const command of this.commands) {
      try {
        command.kill("SIGKILL");
      } catch {
        // already exited
      }
    }
    const done: string[] = [];
    if (this.service !== null) {
      await this.service.stop();
      done.push("service stopped");
    }
    for (const simulator of this.simulators.reverse()) {
      await withTimeout(simulator.close(), CLOSE_TIMEOUT_MS, `closing the ${simulator.name}`)
        .catch(() => {});
    }
    if (this.simulators.length > 0) done.push("simulators closed");
    if (this.tempDir !== null) {
      await Deno.remove(this.tempDir, { recursive: true }).catch(() => {});
      done.push("temporary directory removed");
    }
    if (done.length > 0) say("", dim(`Cleaned up: ${done.join(", ")}.`));
  }
}

// ---------------------------------------------------------------------------------------------
// The demo

/** The state the steps share. */
class Demo {
  readonly resources = new Resources();
  step = 0;
  stepTitle = "";
  // Set by the steps, in order.
  dir = "";
  dataDir = "";
  env: Record<string, string> = {};
  stores!: SimulatedStores;
  keys!: TenantStoreKeys;
  receiver!: CallbackReceiver;
  storeaKeyPath = "";
  serviceAccountPath = "";
  purchaseToken = "";
  serviceUrl = "";
  tenantId = "";
  apiKey = "";
  storeaReceipt = "";
  storebReceipt = "";
  readonly summary: string[] = [];

  begin(title: string, ...explanation: string[]): void {
    this.step++;
    this.stepTitle = title;
    say("", bold(`Step ${this.step}/${TOTAL_STEPS}  ${title}`));
    explain(...explanation);
  }

  /** Runs `main.ts <args>` as the admin CLI and returns its JSON answer. */
  cli(args: string[]): Promise<Record<string, unknown>> {
    showCommand(cliCommandLines(args));
    return runAdminCommand(this.env, args, {
      timeoutMs: CLI_TIMEOUT_MS,
      track: this.resources.commands,
    });
  }
}

async function startSimulators(demo: Demo): Promise<void> {
  demo.begin(
    "Start the store simulators",
    "Nothing in this demo talks to Apple or Google. Simulators stand in for them, in this process:",
    "- store A (App Store): a test certificate chain shaped like Apple's, a signer for",
    "  transactions and notifications, and a fake App Store Server API;",
    "- store B (Google Play): a fake OAuth token endpoint and Play Developer API, and a fake",
    "  Google OIDC issuer for the tokens that come with push notifications;",
    "- a callback receiver, standing in for your backend: it checks every delivery's signature.",
  );
  const resources = demo.resources;
  demo.dir = await Deno.makeTempDir({ prefix: "purchase-relay-demo-" });
  resources.tempDir = demo.dir;
  demo.dataDir = join(demo.dir, "data");

  // The tenant's App Store Connect API key (.p8) and Play service account, made fresh, and one
  // purchase in each store: a monthly subscription bought a minute ago.
  demo.keys = await createTenantStoreKeys();
  ({ storeaKeyPath: demo.storeaKeyPath, serviceAccountPath: demo.serviceAccountPath } =
    await writeTenantStoreKeys(demo.dir, demo.keys));
  demo.purchaseToken = playPurchaseToken();
  demo.stores = await startSimulatedStores({
    dir: demo.dir,
    keys: demo.keys,
    purchases: { storeaTransactionId: TRANSACTION_ID, storebPurchaseToken: demo.purchaseToken },
  });
  resources.simulators.push({ name: "store simulators", close: () => demo.stores.close() });
  // A careful backend refuses a delivery whose signature does not verify.
  demo.receiver = await startCallbackReceiver({ rejectInvalidSignatures: true });
  resources.simulators.push({ name: "callback receiver", close: () => demo.receiver.close() });

  const { storeaApi, play, issuer } = demo.stores;
  say("");
  ok(`App Store Server API   ${storeaApi.productionUrl} (and /sandbox)`);
  ok(`Play Developer API     ${play.apiUrl} (OAuth tokens at ${play.tokenUrl})`);
  ok(`push token issuer      ${issuer.certsUrl}`);
  ok(`callback receiver      ${demo.receiver.url}`);
  explain(
    dim(`Temporary directory: ${demo.dir}`),
    dim(`(the store A test root certificate, the tenant's App Store Connect key and Play service`),
    dim("account, and soon the service's embedded database)"),
  );
}

async function startService(demo: Demo): Promise<void> {
  demo.begin(
    "Start the service",
    "The real service, `main.ts serve`, with the permissions `deno task start` computes from",
    "this configuration (it may write only in its DATA_DIR, and read only that and the files",
    "the configuration names) and a fresh embedded database in the temporary directory. The",
    "STOREA_* and STOREB_* variables point it at the simulators instead of Apple and Google,",
    "and STOREA_ROOT_CERTS makes it trust the test root instead of Apple's. PORT=0 picks a",
    "free port; CALLBACK_ALLOW_HTTP and CALLBACK_ALLOW_PRIVATE_NETWORKS allow the",
    "http://127.0.0.1 callback receiver.",
  );
  const own: [string, string][] = [
    ["DATA_DIR", demo.dataDir],
    ["PORT", "0"],
    ["HOST", "127.0.0.1"],
    ["CALLBACK_ALLOW_HTTP", "true"],
    ["CALLBACK_ALLOW_PRIVATE_NETWORKS", "true"],
    ...Object.entries(demo.stores.serviceEnv),
  ];
  demo.env = serviceEnv(Object.fromEntries(own), { keepCallerVariables: false });
  // `deno task start` runs the same command, with the permissions this configuration gives.
  showCommand([...own.map(([name, value]) => `${name}=${shellWord(value)}`), "deno task start"]);
  const service = new ServiceProcess(demo.env);
  demo.resources.service = service;
  say(dim("  Waiting for the `listening` log line (the first run also creates the database)…"));
  const port = await service.listeningPort(BOOT_TIMEOUT_MS);
  demo.serviceUrl = `http://127.0.0.1:${port}`;
  ok(`listening on ${demo.serviceUrl}`);

  showCommand([`curl -s ${demo.serviceUrl}/ready`]);
  const ready = await requestJson("GET", `${demo.serviceUrl}/ready`, {
    timeoutMs: HTTP_TIMEOUT_MS,
  });
  showJson(ready.json);
  if (ready.status !== 200) throw new ExplainedError(`/ready answered ${ready.status}`);
}

async function createTenant(demo: Demo): Promise<void> {
  demo.begin(
    "Create a tenant with a callback URL",
    "A tenant is one app backend, with its own store credentials, callback URL and API keys.",
    "Administration is the admin CLI (there is no admin HTTP route). Its commands are shown as",
    "you would run them next to `deno task start`; the demo runs them with its own DATA_DIR.",
    "The callback URL is where the service relays the stores' notifications, signed with the",
    "tenant's webhook secret. The secret is printed once; the callback receiver now checks with it.",
  );
  const tenant = await demo.cli([
    "tenant",
    "create",
    "--name",
    "Demo tenant",
    "--callback-url",
    demo.receiver.url,
  ]);
  const secret = String(tenant.webhookSecret ?? "");
  if (!/^whsec_/.test(secret)) throw new ExplainedError("tenant create printed no webhook secret");
  demo.tenantId = String(tenant.id);
  demo.receiver.setSecrets([secret]);
  showJson({ ...tenant, webhookSecret: shorten(secret, 12) });
}

async function createKey(demo: Demo): Promise<void> {
  demo.begin(
    "Create an API key",
    "The tenant's backend calls the verify endpoints with it, as a bearer token. It is printed",
    "once; this one belongs to a throwaway tenant, so the demo shows it whole.",
  );
  const key = await demo.cli(["key", "create", demo.tenantId, "--env", "test", "--name", "demo"]);
  demo.apiKey = String(key.key);
  showJson(key);
}

async function setStoreaCredentials(demo: Demo): Promise<void> {
  demo.begin(
    "Give the tenant its store A (App Store) credentials",
    "The app's bundle id and an App Store Connect In-App Purchase key (key id, issuer id and the",
    ".p8 file). The service signs its App Store Server API calls with the key; the key is stored",
    "encrypted and never printed.",
  );
  const result = await demo.cli([
    "storea",
    "set-credentials",
    demo.tenantId,
    "--bundle-id",
    BUNDLE_ID,
    "--key-id",
    demo.keys.storeaKeyId,
    "--issuer-id",
    demo.keys.storeaIssuerId,
    "--private-key-file",
    demo.storeaKeyPath,
    "--environment",
    "auto",
  ]);
  showJson(result);
}

async function setStorebCredentials(demo: Demo): Promise<void> {
  demo.begin(
    "Give the tenant its store B (Google Play) credentials",
    "The app's package name and a service account with access to the Play Developer API. The push",
    "audience and service account are what the Pub/Sub push subscription is set up with: the",
    "service accepts a push only with a Google-signed token for that audience and account.",
  );
  const result = await demo.cli([
    "storeb",
    "set-credentials",
    demo.tenantId,
    "--package-name",
    PACKAGE_NAME,
    "--service-account-file",
    demo.serviceAccountPath,
    "--push-audience",
    storebWebhookUrl(demo),
    "--push-service-account",
    PUSH_ACCOUNT,
  ]);
  showJson(result);
}

async function verifyStorea(demo: Demo): Promise<void> {
  demo.begin(
    "Verify a store A purchase",
    "Your backend sends the transaction id the app got from StoreKit. The service asks the App",
    "Store Server API (production first, then sandbox), verifies the signed transaction up to",
    "the trusted root, checks the bundle id and answers with one normalized result.",
  );
  const body = { transactionId: TRANSACTION_ID };
  const url = `${demo.serviceUrl}/v1/storea/verify`;
  const headers = { Authorization: `Bearer ${demo.apiKey}`, "Content-Type": "application/json" };
  showCommand(curlLines(url, headers, JSON.stringify(body)));
  const answer = await requestJson("POST", url, {
    headers: { Authorization: headers.Authorization },
    body,
    timeoutMs: HTTP_TIMEOUT_MS,
  });
  const transaction = answer.json?.transaction ?? {};
  showJson(abridge({
    ...pick(answer.json ?? {}, [
      "valid",
      "version",
      "environment",
      "appUserId",
      "error",
      "message",
      "transaction",
    ]),
    ...(answer.json?.transaction
      ? {
        transaction: pick(transaction, [
          "transactionId",
          "originalTransactionId",
          "bundleId",
          "productId",
          "type",
          "purchaseDate",
          "expiresDate",
          "price",
          "currency",
          "signedTransactionInfo",
        ]),
      }
      : {}),
  }));
  if (answer.status !== 200 || answer.json?.valid !== true) {
    throw new ExplainedError(
      `the store A verify answered ${outcome(answer)}, not a valid purchase`,
    );
  }
  say("");
  ok(
    `valid: ${transaction.productId}, found in ${answer.json.environment}; price ${transaction.price} is in cents of ${transaction.currency}`,
  );
  explain(
    dim("Your backend keeps originalTransactionId with the user: deliveries name it as the key."),
  );
  demo.summary.push(`store A verify: valid (transaction ${TRANSACTION_ID})`);
}

async function verifyStoreb(demo: Demo): Promise<void> {
  demo.begin(
    "Verify a store B purchase",
    "Your backend sends the purchase token the app got from Play Billing. The service gets an",
    "access token with the tenant's service account, asks the Play Developer API and answers in",
    "the same shape as for store A (appUserId is in the same place).",
  );
  const body = {
    packageName: PACKAGE_NAME,
    productId: STOREB_PRODUCT_ID,
    purchaseToken: demo.purchaseToken,
    type: "subscription",
  };
  const url = `${demo.serviceUrl}/v1/storeb/verify`;
  const headers = { Authorization: `Bearer ${demo.apiKey}`, "Content-Type": "application/json" };
  showCommand(curlLines(url, headers, JSON.stringify(body)));
  const answer = await requestJson("POST", url, {
    headers: { Authorization: headers.Authorization },
    body,
    timeoutMs: HTTP_TIMEOUT_MS,
  });
  const purchase = answer.json?.purchase ?? {};
  showJson(abridge({
    ...pick(answer.json ?? {}, ["valid", "version", "appUserId", "error", "message", "purchase"]),
    ...(answer.json?.purchase
      ? {
        purchase: pick(purchase, [
          "kind",
          "packageName",
          "productId",
          "purchaseToken",
          "expiryTime",
          "autoRenewing",
          "priceCurrencyCode",
          "priceAmountMicros",
          "acknowledgementState",
          "orderId",
        ]),
      }
      : {}),
  }));
  if (answer.status !== 200 || answer.json?.valid !== true) {
    throw new ExplainedError(
      `the store B verify answered ${outcome(answer)}, not a valid purchase`,
    );
  }
  say("");
  ok(`valid: ${purchase.productId}, auto-renewing until ${purchase.expiryTime}`);
  explain(dim("Your backend keeps purchaseToken with the user: deliveries name it as the key."));
  demo.summary.push(`store B verify: valid (subscription ${purchase.productId})`);
}

async function notifyStorea(demo: Demo): Promise<void> {
  demo.begin(
    "Send a store A notification (the subscription renewed)",
    "The App Store posts a signed payload (App Store Server Notifications V2) to the tenant's",
    "receiver URL. The service verifies the signature chain, the nested signed transaction and",
    "the bundle id, drops repeats, stores the event and queues its delivery before answering.",
    "Here the store A signer makes a DID_RENEW notification for the purchase verified above.",
  );
  const now = Date.now();
  const transaction = demo.stores.signer.sampleTransaction({
    transactionId: RENEWAL_TRANSACTION_ID,
    originalTransactionId: TRANSACTION_ID,
    productId: STOREA_PRODUCT_ID,
    purchaseDate: now,
    originalPurchaseDate: now - 60_000,
    expiresDate: now + 30 * 86_400_000,
    transactionReason: "RENEWAL",
  });
  const payload = await demo.stores.signer.notificationPayload({
    notificationType: "DID_RENEW",
    transaction,
    renewalInfo: demo.stores.signer.sampleRenewalInfo({
      originalTransactionId: TRANSACTION_ID,
      productId: STOREA_PRODUCT_ID,
    }),
    status: 1,
  });
  const signedPayload = await demo.stores.signer.signNotification(payload);
  const url = `${demo.serviceUrl}/v1/webhooks/storea/${demo.tenantId}`;
  showCommand(
    curlLines(
      url,
      { "Content-Type": "application/json" },
      `{"signedPayload":"${shorten(signedPayload, 36)}"}`,
    ),
  );
  explain(dim("where signedPayload decodes to:"));
  showJson(abridge(payload));
  say("");
  const answer = await requestJson("POST", url, {
    body: { signedPayload },
    timeoutMs: HTTP_TIMEOUT_MS,
  });
  demo.storeaReceipt = checkReceipt(answer, "store A");
  showJson(answer.json);
  say("");
  ok(`accepted as ${demo.storeaReceipt}; its delivery is queued`);
  demo.summary.push(`store A notification accepted (${demo.storeaReceipt})`);
}

async function notifyStoreb(demo: Demo): Promise<void> {
  demo.begin(
    "Send a store B notification (the subscription renewed)",
    "Google Play publishes a Real-time developer notification to Pub/Sub, which pushes it with a",
    "Google-signed OIDC token. The service checks the token's signature, audience and account,",
    "and the package name, then stores and queues it like any notification. Here the fake",
    "issuer mints the token and the push carries a SUBSCRIPTION_RENEWED (type 2) notification.",
  );
  const notification = subscriptionNotification(PACKAGE_NAME, {
    notificationType: 2,
    purchaseToken: demo.purchaseToken,
    subscriptionId: STOREB_PRODUCT_ID,
  });
  const envelope = pushEnvelope(notification);
  const token = await demo.stores.issuer.mint({
    audience: storebWebhookUrl(demo),
    email: PUSH_ACCOUNT,
  });
  const url = storebWebhookUrl(demo);
  const shown = JSON.stringify({
    message: { data: shorten(envelope.message.data, 36), messageId: envelope.message.messageId },
    subscription: envelope.subscription,
  });
  showCommand(curlLines(url, {
    Authorization: `Bearer ${shorten(token, 36)}`,
    "Content-Type": "application/json",
  }, shown));
  explain(dim("where message.data decodes to:"));
  showJson(abridge(notification));
  say("");
  const answer = await requestJson("POST", url, {
    headers: { Authorization: `Bearer ${token}` },
    body: envelope,
    timeoutMs: HTTP_TIMEOUT_MS,
  });
  demo.storebReceipt = checkReceipt(answer, "store B");
  showJson(answer.json);
  say("");
  ok(`accepted as ${demo.storebReceipt}; its delivery is queued`);
  demo.summary.push(`store B notification accepted (${demo.storebReceipt})`);
}

async function showDeliveries(demo: Demo): Promise<void> {
  demo.begin(
    "Watch the signed deliveries arrive",
    "The service POSTs each event to the callback URL at once (and retries on failure). Both",
    "stores' renewals arrive in one shape, with one unified event name. X-Service-Signature is",
    "an HMAC-SHA256 of `<timestamp>.<body>` with the webhook secret; the receiver checks it.",
  );
  const expected = [
    { eventId: demo.storeaReceipt, source: "storea" },
    { eventId: demo.storebReceipt, source: "storeb" },
  ];
  await withTimeout(
    demo.receiver.waitFor(expected.length, DELIVERY_TIMEOUT_MS),
    DELIVERY_TIMEOUT_MS + 1000,
    "waiting for the deliveries",
  ).catch((error) => {
    throw new ExplainedError((error as Error).message);
  });
  for (const [index, { eventId, source }] of expected.entries()) {
    const delivery = demo.receiver.deliveries.find((d) =>
      d.headers["x-service-event-id"] === eventId
    );
    if (delivery === undefined) throw new ExplainedError(`no delivery arrived for ${eventId}`);
    showDelivery(delivery, index + 1, expected.length);
    // deno-lint-ignore no-explicit-any
    const body = delivery.json as any;
    if (!delivery.signatureValid) {
      throw new ExplainedError(`the delivery of ${eventId} does not carry a valid signature`);
    }
    if (body?.source !== source || body?.eventId !== eventId) {
      throw new ExplainedError(`the delivery of ${eventId} does not describe that event`);
    }
    const line = `delivery ${body.event} ${eventId} from ${source}: signature valid`;
    ok(line);
    demo.summary.push(line);
  }
}

function showDelivery(delivery: ReceivedDelivery, index: number, count: number): void {
  const h = delivery.headers;
  say("", `  Delivery ${index} of ${count}: ${delivery.method} ${delivery.path}`);
  for (
    const name of [
      "X-Service-Event",
      "X-Service-Event-Id",
      "X-Service-Timestamp",
      "X-Service-Signature",
    ]
  ) {
    const value = h[name.toLowerCase()] ?? "(missing)";
    say(`    ${(name + ":").padEnd(21)} ${shorten(value, 36)}`);
  }
  say(
    `    ${"signature:".padEnd(21)} ${
      delivery.signatureValid ? green("valid") : red("INVALID")
    } (answered ${delivery.answeredStatus})`,
  );
  // deno-lint-ignore no-explicit-any
  const body = (delivery.json ?? {}) as any;
  showJson(abridge(pick(body, [
    "event",
    "reason",
    "platformEvent",
    "eventId",
    "externalId",
    "tenantId",
    "source",
    "subject",
  ])));
}

async function listDeliveries(demo: Demo): Promise<void> {
  demo.begin(
    "Look at the service's record of the deliveries",
    "Every delivery and every attempt is stored: an operator can list, inspect and retry them.",
  );
  const result = await demo.cli(["deliveries", "list", "--tenant", demo.tenantId]);
  const deliveries = (result.deliveries ?? []) as Record<string, unknown>[];
  showJson({
    deliveries: deliveries.map((delivery) =>
      pick(delivery, ["id", "eventId", "event", "platformEvent", "status", "attempts"])
    ),
  });
}

function checkReceipt(answer: JsonAnswer, store: string): string {
  const receipt = answer.json ?? {};
  if (answer.status !== 200 || receipt.isNew !== true || receipt.enqueuedDelivery !== true) {
    showJson(receipt);
    throw new ExplainedError(`the ${store} receiver answered ${outcome(answer)}, not a new event`);
  }
  return String(receipt.eventId);
}

/** The status and error code of an answer, for a failure message. */
function outcome(answer: JsonAnswer): string {
  const code = answer.json?.error;
  return typeof code === "string" ? `${answer.status} ${code}` : String(answer.status);
}

function storebWebhookUrl(demo: Demo): string {
  return `${demo.serviceUrl}/v1/webhooks/storeb/${demo.tenantId}`;
}

function whatNext(demo: Demo, keep: boolean): void {
  say("", bold("Summary"));
  for (const line of demo.summary) ok(line);
  say(
    "",
    bold("What next"),
    "  - Build your backend against it: `deno task dev` runs the service against these",
    "    simulators with a ready tenant, and `deno task cli trigger` sends any event to your",
    '    endpoint (docs/testing.md, "Testing locally")',
    "  - Integrate your backend: docs/integration.md (the verify answers, deliveries, and how to",
    "    check a signature, with examples in docs/examples/)",
    "  - Event names of both stores: docs/events.md",
    "  - Run it for real (store credentials, store setup, PostgreSQL, configuration, every CLI",
    "    command): docs/operations.md",
  );
  if (!keep) say(dim("  Run `deno task demo --keep` to keep everything running and explore."));
}

/** Waits for Ctrl-C, following the service's log lines; fails if the service exits first. */
async function keepRunning(demo: Demo, signalled: Promise<void>): Promise<void> {
  say(
    "",
    bold("Still running (--keep)"),
    `  The service listens on ${demo.serviceUrl}, with the simulators. The curl commands above`,
    "  work as shown, except those with a shortened token or payload. The admin CLI works on",
    "  this service's database from the checkout, for example:",
  );
  showCommand([`DATA_DIR=${shellWord(demo.dataDir)}`, "deno task cli deliveries list"]);
  say("  The service's log lines follow. Press Ctrl-C to stop and clean up.", "");
  const service = demo.resources.service!;
  service.onLine = (line) => say(dim(line));
  const exited = service.exited.then((status) => {
    throw new ExplainedError(`the service exited with code ${status.code}`);
  });
  exited.catch(() => {});
  await Promise.race([signalled, exited]);
}

// ---------------------------------------------------------------------------------------------
// Main

const STEPS = [
  startSimulators,
  startService,
  createTenant,
  createKey,
  setStoreaCredentials,
  setStorebCredentials,
  verifyStorea,
  verifyStoreb,
  notifyStorea,
  notifyStoreb,
  showDeliveries,
  listDeliveries,
];

async function main(args: string[]): Promise<number> {
  if (args.includes("--help") || args.includes("-h")) {
    say(USAGE);
    return 0;
  }
  const unknown = args.filter((arg) => arg !== "--keep");
  if (unknown.length > 0) {
    console.error(`unknown argument: ${unknown[0]}\n\n${USAGE}`);
    return 2;
  }
  const keep = args.includes("--keep");
  const started = performance.now();
  const demo = new Demo();

  // Ctrl-C (or SIGTERM) at any point: stop everything, remove the temporary directory, exit.
  const signal = Promise.withResolvers<void>();
  let signalled = false;
  const onSignal = () => {
    signalled = true;
    signal.resolve();
  };
  const signals: Deno.Signal[] = Deno.build.os === "windows" ? ["SIGINT"] : ["SIGINT", "SIGTERM"];
  for (const name of signals) Deno.addSignalListener(name, onSignal);

  say(
    bold("Purchase Relay demo"),
    "",
    "This runs the whole flow on this machine in about half a minute, with no Apple or Google",
    "account and no database server: store simulators, the real service and its admin CLI, two",
    "purchases verified, two store notifications relayed to a local receiver as signed deliveries.",
    "Before each action you see the command you would run yourself. Everything is removed at the",
    "end.",
  );

  let code = 0;
  let elapsed = "";
  try {
    const run = (async () => {
      for (const step of STEPS) {
        if (signalled) return;
        await step(demo);
      }
    })();
    // After a signal the steps are abandoned; their late failures are of no interest.
    run.catch(() => {});
    await Promise.race([run, signal.promise]);
    if (signalled) {
      say("", "Interrupted: stopping.");
      code = 130;
    } else {
      elapsed = ((performance.now() - started) / 1000).toFixed(1);
      whatNext(demo, keep);
      if (keep) {
        await keepRunning(demo, signal.promise);
        say("", "Stopping.");
      }
    }
  } catch (error) {
    code = 1;
    const message = error instanceof Error ? error.message : String(error);
    console.error(
      "\n" + red(`✗ Step ${demo.step}/${TOTAL_STEPS} (${demo.stepTitle}) failed: ${message}`),
    );
    if (!(error instanceof ExplainedError) && error instanceof Error && error.stack) {
      console.error(dim(error.stack));
    }
    const tail = demo.resources.service?.tail() ?? "";
    if (tail !== "") console.error(dim("\nThe service's last log lines:\n" + tail));
  } finally {
    await demo.resources.cleanUp();
    for (const name of signals) Deno.removeSignalListener(name, onSignal);
  }
  if (code === 0) say("", green(`Demo finished: every step passed in ${elapsed} s.`));
  else if (code === 1) console.error(red("Demo failed."));
  return code;
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
