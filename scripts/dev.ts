/**
 * `deno task dev`: the service on this machine wired to the store simulators, with a tenant ready
 * to call, for developing a backend against it (docs/testing.md, "Testing locally").
 *
 * It starts the simulators in this process (a test PKI and fake App Store Server API, a fake
 * Play Developer API and OAuth endpoint, a fake Google issuer of push tokens), the service as a
 * child process (`main.ts serve`, with the permissions `deno task start` computes) trusting them,
 * and a signer for `purchase-relay trigger`. On the first run it creates, with the admin CLI, a
 * tenant whose callback URL is http://localhost:3000/webhooks, a test API key, and store
 * credentials the simulators accept, and keeps them in `DATA_DIR` (./data-dev unless set): a
 * restart prints the same tenant and key; deleting the directory starts over. It points the App
 * Store simulator's notification URL at the service's store A receiver for that tenant, so that
 * `storea test-notification` follows a test notification through the service. Then it prints what
 * to call, with the tenant's values, and follows the service's log until Ctrl-C.
 *
 * Development only: it refuses to run when NODE_ENV is production. The service trusts the
 * simulators' keys only while this runs; each start makes new ones.
 *
 * @module
 */
import { join } from "node:path";
import { ConfigError, readConfig } from "../src/config.ts";
import { DEV_SIGNER_FILE, type DevSignerFile } from "../src/cli/trigger.ts";
import {
  AdminCommandError,
  ExplainedError,
  runAdminCommand,
  serviceEnv,
  ServiceProcess,
} from "./local_service.ts";
import {
  createGatewayPurchases,
  createTenantStoreKeys,
  playPurchaseToken,
  SIMULATED_APP,
  type SimulatedPurchases,
  type SimulatedStores,
  startSimulatedStores,
  type TenantStoreKeys,
  writeTenantStoreKeys,
} from "./simulated_stores.ts";
import { type DevSigner, startDevSigner } from "./dev_signer.ts";
import { bold, curlArguments, cyan, dim, green, red, shellWord } from "./terminal.ts";

/** Where the state of the dev loop lives unless DATA_DIR says otherwise. */
const DEFAULT_DATA_DIR = "./data-dev";
/** The callback URL of a new dev tenant: a backend on this machine. */
const DEFAULT_CALLBACK_URL = "http://localhost:3000/webhooks";
/** The state file, under DATA_DIR. */
const STATE_FILE = "dev/state.json";
/** First boot may download the service's npm packages and create the database. */
const BOOT_TIMEOUT_MS = 120_000;
const CLI_TIMEOUT_MS = 60_000;

const USAGE = `usage: deno task dev

Runs Purchase Relay on this machine against store simulators, with a tenant, an API key and
store credentials ready: verify, acknowledge and look up simulated purchases with curl, and make
the stores send any notification to your callback URL with \`deno task cli trigger\`. No Apple
or Google account,
no database server. State is kept in DATA_DIR (default ${DEFAULT_DATA_DIR}); PORT defaults to
8080 and HOST to 127.0.0.1. Refused when NODE_ENV is production.

  --help   print this text`;

/** What a restart keeps (mode 0600 in DATA_DIR: it holds a test key and test secrets). */
interface DevState {
  tenantId: string;
  keyId: string;
  apiKey: string;
  /** The webhook secret made with the tenant; `tenant set-callback` may have changed it. */
  webhookSecret: string | null;
  purchases: SimulatedPurchases;
  keys: TenantStoreKeys;
}

/**
 * Everything this script starts, so that one call stops it all. A start interrupted by Ctrl-C
 * stops what it starts afterwards too ({@linkcode Running.check}).
 */
class Running {
  stores: SimulatedStores | null = null;
  service: ServiceProcess | null = null;
  signer: DevSigner | null = null;
  signerFile: string | null = null;
  readonly commands = new Set<Deno.ChildProcess>();
  #stopped = false;

  /** Throws, after stopping what was started meanwhile, once {@linkcode Running.stop} ran. */
  async check(): Promise<void> {
    if (!this.#stopped) return;
    await this.stop();
    throw new ExplainedError("interrupted");
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    for (const command of this.commands) {
      try {
        command.kill("SIGKILL");
      } catch {
        // already exited
      }
    }
    const { signerFile, signer, service, stores } = this;
    this.signerFile =
      this.signer =
      this.service =
      this.stores =
        null;
    if (signerFile !== null) await Deno.remove(signerFile).catch(() => {});
    await signer?.close().catch(() => {});
    await service?.stop();
    await stores?.close();
  }
}

async function main(args: string[]): Promise<number> {
  if (args.includes("--help") || args.includes("-h")) {
    console.log(USAGE);
    return 0;
  }
  if (args.length > 0) {
    console.error(`unknown argument: ${args[0]}\n\n${USAGE}`);
    return 2;
  }
  if (Deno.env.get("NODE_ENV")?.trim() === "production") {
    console.error(red(
      "deno task dev is for development: it makes the service trust the store simulators' test\n" +
        "keys. It is refused when NODE_ENV is production.",
    ));
    return 2;
  }
  const own = {
    DATA_DIR: nonEmpty(Deno.env.get("DATA_DIR")) ?? DEFAULT_DATA_DIR,
    PORT: nonEmpty(Deno.env.get("PORT")) ?? "8080",
    HOST: nonEmpty(Deno.env.get("HOST")) ?? "127.0.0.1",
    // Development is asked for here, not assumed: a localhost callback needs its rules.
    NODE_ENV: nonEmpty(Deno.env.get("NODE_ENV")) ?? "development",
    // A notification lost on the way (trigger --lost) is recovered within seconds, not the hour.
    RECOVERY_INTERVAL: nonEmpty(Deno.env.get("RECOVERY_INTERVAL")) ?? "10s",
  };
  try {
    readConfig({ ...Deno.env.toObject(), ...own });
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    console.error(red(`invalid configuration: ${error.message}`));
    return 2;
  }

  const running = new Running();
  const stopped = Promise.withResolvers<void>();
  const signals: Deno.Signal[] = ["SIGINT", "SIGTERM"];
  const onSignal = () => stopped.resolve();
  for (const name of signals) Deno.addSignalListener(name, onSignal);
  let code = 0;
  try {
    const start = startAll(running, own);
    start.catch(() => {});
    const ready = await Promise.race([start, stopped.promise.then(() => null)]);
    if (ready !== null) {
      printBanner(ready, own.DATA_DIR);
      const service = running.service!;
      service.onLine = (line) => console.log(dim(line));
      const exited = service.exited.then((status) => {
        throw new ExplainedError(`the service exited with code ${status.code}`);
      });
      exited.catch(() => {});
      await Promise.race([stopped.promise, exited]);
    }
    console.log("\nStopping.");
  } catch (error) {
    code = 1;
    const message = (error as Error).message;
    console.error(red(`\ndeno task dev failed: ${message}`));
    if (/in use|AddrInUse/i.test(message)) {
      console.error(`Port ${own.PORT} is taken: set PORT to another one, e.g. PORT=8081.`);
    }
    if (!(error instanceof ExplainedError) && error instanceof Error && error.stack) {
      console.error(dim(error.stack));
    }
    const tail = running.service?.tail() ?? "";
    if (tail !== "") console.error(dim(`\nThe service's last log lines:\n${tail}`));
  } finally {
    await running.stop();
    for (const name of signals) Deno.removeSignalListener(name, onSignal);
  }
  return code;
}

/** What the banner shows. */
interface Ready {
  serviceUrl: string;
  state: DevState;
  callbackUrl: string | null;
  created: boolean;
  /**
   * Where the CLI finds the App Store simulator and its test root, as the service does: valid
   * only while this run lasts (the simulators' ports and keys change at each start).
   */
  storeaEnv: Record<string, string>;
}

async function startAll(running: Running, own: Record<string, string>): Promise<Ready> {
  const dataDir = own.DATA_DIR;
  const devDir = join(dataDir, "dev");
  await Deno.mkdir(devDir, { recursive: true, mode: 0o700 });
  const statePath = join(dataDir, STATE_FILE);
  const saved = await readState(statePath);
  const keys = saved?.keys ?? await createTenantStoreKeys();
  const kept = saved?.purchases ?? {
    storeaTransactionId: "2000000123456789",
    storebPurchaseToken: playPurchaseToken(),
  };
  // A state file from before the store gateway's examples has none of their purchases.
  const purchases = {
    ...kept,
    gateway: kept.gateway ?? createGatewayPurchases(kept.storeaTransactionId),
  };

  console.log(dim(`Starting the store simulators and the service (state in ${dataDir})…`));
  const stores = await startSimulatedStores({ dir: devDir, keys, purchases });
  running.stores = stores;
  await running.check();
  const env = serviceEnv({ ...own, ...stores.serviceEnv }, { keepCallerVariables: true });
  running.service = new ServiceProcess(env);
  await running.check();
  const port = await running.service.listeningPort(BOOT_TIMEOUT_MS);
  const serviceUrl = `http://${urlHost(own.HOST)}:${port}`;

  const cli = (args: string[]) =>
    runAdminCommand(env, args, { timeoutMs: CLI_TIMEOUT_MS, track: running.commands });
  let state = saved === null ? null : await checkedState(cli, { ...saved, purchases });
  const created = state === null;
  if (state === null) {
    state = await createTenant(cli, devDir, serviceUrl, keys, purchases);
  }
  await Deno.writeTextFile(statePath, JSON.stringify(state, null, 2), { mode: 0o600 });
  const tenant = await cli(["tenant", "show", state.tenantId]);
  // As App Store Connect's notification URL would: the tenant's store A receiver, in both
  // environments (docs/configuration.md, "Checking the notification chain").
  stores.storeaApi.setNotificationUrl({
    bundleId: SIMULATED_APP.bundleId,
    url: `${serviceUrl}/v1/webhooks/storea/${state.tenantId}`,
  });

  running.signer = await startDevSigner(stores, purchases);
  await running.check();
  const signerFile: DevSignerFile = {
    url: running.signer.url,
    token: running.signer.token,
    serviceUrl,
  };
  running.signerFile = join(dataDir, DEV_SIGNER_FILE);
  await Deno.writeTextFile(running.signerFile, JSON.stringify(signerFile), { mode: 0o600 });
  const storesEnv = stores.serviceEnv;
  return {
    serviceUrl,
    state,
    callbackUrl: (tenant.callbackUrl as string | null) ?? null,
    created,
    storeaEnv: {
      STOREA_API_URL_PRODUCTION: storesEnv.STOREA_API_URL_PRODUCTION,
      STOREA_API_URL_SANDBOX: storesEnv.STOREA_API_URL_SANDBOX,
      STOREA_ROOT_CERTS: storesEnv.STOREA_ROOT_CERTS,
    },
  };
}

/** The saved state, with a new API key if its key was revoked; null when its tenant is gone. */
async function checkedState(
  cli: (args: string[]) => Promise<Record<string, unknown>>,
  state: DevState,
): Promise<DevState | null> {
  let keys: { id: string; revokedAt: string | null }[];
  try {
    keys = (await cli(["key", "list", state.tenantId])).keys as typeof keys;
  } catch (error) {
    if (error instanceof AdminCommandError && error.code === "TENANT_NOT_FOUND") return null;
    throw error;
  }
  if (keys.some((key) => key.id === state.keyId && key.revokedAt === null)) return state;
  const key = await cli(["key", "create", state.tenantId, "--env", "test", "--name", "dev"]);
  return { ...state, keyId: String(key.id), apiKey: String(key.key) };
}

/** A new tenant with a callback URL, a test API key and store credentials. */
async function createTenant(
  cli: (args: string[]) => Promise<Record<string, unknown>>,
  devDir: string,
  serviceUrl: string,
  keys: TenantStoreKeys,
  purchases: SimulatedPurchases,
): Promise<DevState> {
  const tenant = await cli([
    "tenant",
    "create",
    "--name",
    "Dev tenant",
    "--callback-url",
    DEFAULT_CALLBACK_URL,
  ]);
  const tenantId = String(tenant.id);
  const key = await cli(["key", "create", tenantId, "--env", "test", "--name", "dev"]);
  const files = await writeTenantStoreKeys(devDir, keys);
  await cli([
    "storea",
    "set-credentials",
    tenantId,
    "--bundle-id",
    SIMULATED_APP.bundleId,
    "--key-id",
    keys.storeaKeyId,
    "--issuer-id",
    keys.storeaIssuerId,
    "--private-key-file",
    files.storeaKeyPath,
  ]);
  await cli([
    "storeb",
    "set-credentials",
    tenantId,
    "--package-name",
    SIMULATED_APP.packageName,
    "--service-account-file",
    files.serviceAccountPath,
    "--push-audience",
    `${serviceUrl}/v1/webhooks/storeb/${tenantId}`,
    "--push-service-account",
    SIMULATED_APP.pushServiceAccount,
  ]);
  return {
    tenantId,
    keyId: String(key.id),
    apiKey: String(key.key),
    webhookSecret: typeof tenant.webhookSecret === "string" ? tenant.webhookSecret : null,
    purchases,
    keys,
  };
}

async function readState(path: string): Promise<DevState | null> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
  try {
    const state = JSON.parse(text);
    if (typeof state.tenantId === "string" && typeof state.apiKey === "string") return state;
  } catch {
    // rewritten below
  }
  console.error(dim(`${path} is unreadable: starting with a new tenant.`));
  return null;
}

function printBanner(ready: Ready, dataDir: string): void {
  const { serviceUrl, state } = ready;
  const cli = `DATA_DIR=${shellWord(dataDir)} deno task cli`;
  const auth = { Authorization: `Bearer ${state.apiKey}`, "Content-Type": "application/json" };
  const curl = (path: string, body: unknown) =>
    [`curl -s ${serviceUrl}${path}`, ...curlArguments(auth, JSON.stringify(body))].join(" ");
  const command = (line: string) => console.log(`  ${cyan(line)}`);
  const tenant = state.tenantId;

  say(
    "",
    bold("Purchase Relay is running against the store simulators."),
    "",
    `  Service          ${serviceUrl}`,
    `  Tenant           ${tenant}${ready.created ? "" : dim("  (kept from the last run)")}`,
    `  API key          ${state.apiKey}`,
    `  Callback URL     ${ready.callbackUrl ?? "none"}`,
    `  Webhook secret   ${state.webhookSecret ?? "none"}${
      dim("  (as created; set-callback and rotate-secret print a new one)")
    }`,
    `  State            ${dataDir} ${dim("(delete it to start over)")}`,
  );
  say("", bold("Verify a simulated purchase") + dim(" (in another terminal):"));
  command(curl("/v1/storea/verify", { transactionId: state.purchases.storeaTransactionId }));
  command(curl("/v1/storeb/verify", {
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebProductId,
    purchaseToken: state.purchases.storebPurchaseToken,
    type: "subscription",
  }));
  const gateway = state.purchases.gateway!;
  say(
    "",
    bold("Acknowledge, or Google refunds the purchase after 3 days") +
      dim(" (verify and acknowledge; a one-time product; a consumable):"),
  );
  command(curl("/v1/storeb/verify", {
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebProductId,
    purchaseToken: state.purchases.storebPurchaseToken,
    type: "subscription",
    acknowledge: true,
  }));
  command(curl("/v1/storeb/acknowledge", {
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebNonConsumableId,
    purchaseToken: gateway.storebProductToken,
    type: "product",
  }));
  command(curl("/v1/storeb/consume", {
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebConsumableId,
    purchaseToken: gateway.storebConsumableToken,
  }));
  say(
    "",
    bold("Restore purchases, answer a refund request") +
      dim(" (the store A subscription, renewed twice):"),
  );
  const transactionId = state.purchases.storeaTransactionId;
  command(curl("/v1/storea/subscriptions", { transactionId }));
  command(curl("/v1/storea/history", { transactionId, sort: "descending" }));
  // An auto-renewable subscription: Apple computes its consumption, so no percentage.
  command(curl("/v1/storea/consumption", {
    transactionId,
    customerConsented: true,
    sampleContentProvided: false,
    deliveryStatus: "DELIVERED",
    refundPreference: "DECLINE",
  }));
  say(
    "",
    bold("Receive deliveries at your endpoint") +
      dim(" (http://localhost works when development is asked for):"),
  );
  command(
    `NODE_ENV=development ${cli} tenant set-callback ${tenant} --url http://localhost:3000/webhooks`,
  );
  console.log(dim("  No endpoint yet? This one prints each delivery and checks its signature:"));
  command(
    `deno task callback-receiver --port 3000 --path /webhooks --secret ${
      state.webhookSecret ?? "whsec_..."
    }`,
  );
  say("", bold("Make a store send a notification") + dim(" (any type of docs/events.md):"));
  command(`${cli} trigger storea DID_RENEW --tenant ${tenant}`);
  command(`${cli} trigger storea EXPIRED --subtype VOLUNTARY --tenant ${tenant}`);
  command(`${cli} trigger storeb subscription.4 --tenant ${tenant}`);
  command(`${cli} trigger storeb voided_purchase --tenant ${tenant}`);
  say(
    "",
    bold("Lose a notification on the way, and watch the service recover it") +
      dim(" (from the store's own records, within seconds):"),
  );
  command(`${cli} trigger storea DID_RENEW --lost TIMED_OUT --tenant ${tenant}`);
  command(`${cli} trigger storeb voided_purchase --lost yes --tenant ${tenant}`);
  say(
    "",
    bold("Check the chain App Store -> service -> your endpoint") +
      dim(" (this run's simulator; its ports change at each start):"),
  );
  const storea = Object.entries(ready.storeaEnv).map(([name, value]) =>
    `${name}=${shellWord(value)}`
  );
  command(`${storea.join(" ")} ${cli} storea test-notification --tenant ${tenant}`);
  say("", green("Ready.") + " The service's log follows; Ctrl-C stops everything.", "");
}

/** Prints each argument on a line of its own. */
function say(...lines: string[]): void {
  console.log(lines.join("\n"));
}

/** The host of the service's URLs: loopback when it listens on every address. */
function urlHost(host: string): string {
  if (host === "0.0.0.0") return "127.0.0.1";
  if (host === "::") return "[::1]";
  return host.includes(":") ? `[${host}]` : host;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === "" ? undefined : value.trim();
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
