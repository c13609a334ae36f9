/**
 * The store simulators as `deno task demo` and `deno task dev` run them, in the script's own
 * process: a test PKI and signer shaped like Apple's with a fake App Store Server API, a fake
 * Google token endpoint and Play Developer API, and a fake Google issuer of push tokens. They
 * accept one tenant's keys and answer for one purchase in each store, and with
 * {@linkcode GatewayPurchases} for the purchases the store gateway's examples act on.
 *
 * @module
 */
import { join } from "node:path";
import {
  createServiceAccount,
  createStoreaTestPki,
  type PushTokenIssuer,
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startPushTokenIssuer,
  startStoreaApiSimulator,
  startStorebSimulator,
  type StoreaApiSimulator,
  StoreaSigner,
  type StorebSimulator,
  writeStoreaRootPem,
} from "../simulators/mod.ts";
import { derToPem } from "../simulators/pem.ts";
import { withTimeout } from "./local_service.ts";

/** The simulated app: the same bundle id and package name in both stores. */
export const SIMULATED_APP = {
  bundleId: "com.example.app",
  packageName: "com.example.app",
  storeaProductId: "pro.monthly",
  storebProductId: "premium_monthly",
  /** A one-time product bought once for good (no ads), to acknowledge. */
  storebNonConsumableId: "remove_ads",
  /** A consumable one-time product, to consume. */
  storebConsumableId: "coins_100",
  /** The service account the simulated Pub/Sub push subscription signs its tokens as. */
  pushServiceAccount: "pubsub-push@demo-project.iam.gserviceaccount.com",
} as const;

const CLOSE_TIMEOUT_MS = 5_000;

/**
 * A tenant's store keys, as a developer downloads them: an App Store Connect In-App Purchase key
 * (`.p8`, with its key id and issuer id) and a Play service account's JSON key file.
 */
export interface TenantStoreKeys {
  storeaKeyId: string;
  storeaIssuerId: string;
  /** PKCS#8 PEM: the `.p8` file. */
  storeaPrivateKeyPem: string;
  /** The service account's JSON key file. */
  serviceAccountJson: string;
}

/** Makes a tenant's store keys, fresh. */
export async function createTenantStoreKeys(): Promise<TenantStoreKeys> {
  const pair = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
    "sign",
    "verify",
  ]);
  const storeaPrivateKeyPem = derToPem(
    new Uint8Array(await crypto.subtle.exportKey("pkcs8", pair.privateKey)),
    "PRIVATE KEY",
  );
  const account = await createServiceAccount();
  const keyId = Array.from(
    crypto.getRandomValues(new Uint8Array(10)),
    (byte) => "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"[byte % 32],
  ).join("");
  return {
    storeaKeyId: keyId,
    storeaIssuerId: crypto.randomUUID(),
    storeaPrivateKeyPem,
    serviceAccountJson: account.json,
  };
}

/** Where {@linkcode writeTenantStoreKeys} put the key files (what `set-credentials` reads). */
export interface TenantStoreKeyFiles {
  storeaKeyPath: string;
  serviceAccountPath: string;
}

/** Writes the key files into `dir`, readable by their owner only. */
export async function writeTenantStoreKeys(
  dir: string,
  keys: TenantStoreKeys,
): Promise<TenantStoreKeyFiles> {
  const storeaKeyPath = join(dir, `AuthKey_${keys.storeaKeyId}.p8`);
  const serviceAccountPath = join(dir, "play-service-account.json");
  await Deno.writeTextFile(storeaKeyPath, keys.storeaPrivateKeyPem, { mode: 0o600 });
  await Deno.writeTextFile(serviceAccountPath, keys.serviceAccountJson, { mode: 0o600 });
  return { storeaKeyPath, serviceAccountPath };
}

/** The purchase each store's simulator answers for. */
export interface SimulatedPurchases {
  /** A store A transaction id (numeric, as Apple's). */
  storeaTransactionId: string;
  /** A store B purchase token (see {@linkcode playPurchaseToken}). */
  storebPurchaseToken: string;
  /** With them, the purchases the store gateway's examples act on (`deno task dev`). */
  gateway?: GatewayPurchases;
}

/**
 * What the store gateway's examples need besides the two purchases: the store A subscription's
 * renewals, for a history, and in store B purchases waiting to be acknowledged or consumed, as a
 * purchase just made is. With them the store A subscription `storeaTransactionId` was bought two
 * months ago and renewed twice since (the last renewal a minute ago), and the store B
 * subscription is not acknowledged yet.
 */
export interface GatewayPurchases {
  /** The transaction ids of the store A subscription's two renewals, oldest first. */
  storeaRenewalIds: [string, string];
  /** A one-time product ({@linkcode SIMULATED_APP}`.storebNonConsumableId`), not acknowledged. */
  storebProductToken: string;
  /** A consumable ({@linkcode SIMULATED_APP}`.storebConsumableId`), not consumed nor acknowledged. */
  storebConsumableToken: string;
}

/** New {@linkcode GatewayPurchases}: renewal ids that follow `storeaTransactionId`, new tokens. */
export function createGatewayPurchases(storeaTransactionId: string): GatewayPurchases {
  const next = (step: bigint) => String(BigInt(storeaTransactionId) + step);
  return {
    storeaRenewalIds: [next(1n), next(2n)],
    storebProductToken: playPurchaseToken(),
    storebConsumableToken: playPurchaseToken(),
  };
}

/** Options of {@linkcode startSimulatedStores}. */
export interface SimulatedStoresOptions {
  /** Where the test root certificate is written, for `STOREA_ROOT_CERTS`. */
  dir: string;
  /** The tenant's keys the simulated APIs accept. */
  keys: TenantStoreKeys;
  purchases: SimulatedPurchases;
}

/** The running simulators. */
export interface SimulatedStores {
  /** Signs store A transactions and notifications with the test PKI. */
  signer: StoreaSigner;
  storeaApi: StoreaApiSimulator;
  play: StorebSimulator;
  issuer: PushTokenIssuer;
  /** The test root certificate (PEM), which the service must trust instead of Apple's. */
  rootPemPath: string;
  /** The service's variables that point it at the simulators and make it trust the test root. */
  serviceEnv: Record<string, string>;
  /** Closes every simulator, each within a bounded time. */
  close(): Promise<void>;
}

/**
 * Starts the simulators on loopback ports with a fresh test PKI. A service that trusts
 * {@linkcode SimulatedStores.rootPemPath} accepts the notifications they sign only until they
 * stop: the next start makes another PKI and another push-token key.
 */
export async function startSimulatedStores(
  options: SimulatedStoresOptions,
): Promise<SimulatedStores> {
  const started: { name: string; close(): Promise<void> }[] = [];
  const close = async () => {
    for (const simulator of started.reverse()) {
      await withTimeout(simulator.close(), CLOSE_TIMEOUT_MS, `closing the ${simulator.name}`)
        .catch(() => {});
    }
  };
  try {
    const pki = await createStoreaTestPki();
    const signer = new StoreaSigner(pki, {
      bundleId: SIMULATED_APP.bundleId,
      environment: "Production",
    });
    const rootPemPath = await writeStoreaRootPem(pki, join(options.dir, "storea-test-root.pem"));
    const storeaApi = await startStoreaApiSimulator({ signer });
    started.push({ name: "App Store simulator", close: () => storeaApi.close() });
    const play = await startStorebSimulator();
    started.push({ name: "Google Play simulator", close: () => play.close() });
    const issuer = await startPushTokenIssuer();
    started.push({ name: "push token issuer", close: () => issuer.close() });

    const { keys, purchases } = options;
    await storeaApi.addKey({
      issuerId: keys.storeaIssuerId,
      keyId: keys.storeaKeyId,
      bundleId: SIMULATED_APP.bundleId,
      privateKeyPem: keys.storeaPrivateKeyPem,
    });
    const account = JSON.parse(keys.serviceAccountJson);
    await play.addServiceAccount({
      clientEmail: account.client_email,
      privateKeyPem: account.private_key,
      privateKeyId: account.private_key_id,
    });
    if (purchases.gateway === undefined) {
      // One purchase in each store: a monthly subscription bought a minute ago.
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({
          transactionId: purchases.storeaTransactionId,
          originalTransactionId: purchases.storeaTransactionId,
          productId: SIMULATED_APP.storeaProductId,
        }),
      );
      play.addSubscription({
        packageName: SIMULATED_APP.packageName,
        purchaseToken: purchases.storebPurchaseToken,
        purchase: sampleSubscriptionPurchase(),
      });
    } else {
      await addGatewayPurchases(storeaApi, signer, play, purchases, purchases.gateway);
    }
    return {
      signer,
      storeaApi,
      play,
      issuer,
      rootPemPath,
      serviceEnv: {
        ...storeaApi.serviceEnv,
        STOREA_ROOT_CERTS: rootPemPath,
        ...play.serviceEnv,
        ...issuer.serviceEnv,
      },
      close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}

/** A month of a monthly subscription, as the simulated purchases count it. */
const MONTH_MS = 30 * 24 * 3600_000;

/** The purchases of {@linkcode GatewayPurchases}, in both simulators. */
async function addGatewayPurchases(
  storeaApi: StoreaApiSimulator,
  signer: StoreaSigner,
  play: StorebSimulator,
  purchases: SimulatedPurchases,
  gateway: GatewayPurchases,
): Promise<void> {
  // Store A: bought two months ago, renewed a month ago and a minute ago; the customer's account
  // token is the same on every transaction, as StoreKit sends it.
  const bought = Date.now() - 2 * MONTH_MS - 60_000;
  const appAccountToken = crypto.randomUUID();
  const ids = [purchases.storeaTransactionId, ...gateway.storeaRenewalIds];
  for (const [period, transactionId] of ids.entries()) {
    const purchaseDate = bought + period * MONTH_MS;
    await storeaApi.addTransaction(
      "production",
      signer.sampleTransaction({
        transactionId,
        originalTransactionId: purchases.storeaTransactionId,
        productId: SIMULATED_APP.storeaProductId,
        purchaseDate,
        originalPurchaseDate: bought,
        expiresDate: purchaseDate + MONTH_MS,
        transactionReason: period === 0 ? "PURCHASE" : "RENEWAL",
        appAccountToken,
      }),
    );
  }
  // Store B: all three just bought, and waiting for the backend, as Google leaves them.
  play.addSubscription({
    packageName: SIMULATED_APP.packageName,
    purchaseToken: purchases.storebPurchaseToken,
    purchase: sampleSubscriptionPurchase({
      acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING",
    }),
  });
  play.addProduct({
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebNonConsumableId,
    purchaseToken: gateway.storebProductToken,
    purchase: sampleProductPurchase({ acknowledgementState: 0 }),
  });
  play.addProduct({
    packageName: SIMULATED_APP.packageName,
    productId: SIMULATED_APP.storebConsumableId,
    purchaseToken: gateway.storebConsumableToken,
    purchase: sampleProductPurchase({ acknowledgementState: 0 }),
  });
}

/** A token shaped like Play's: 24 letters, a dot, then an opaque base64url tail. */
export function playPurchaseToken(): string {
  const letters = Array.from(
    crypto.getRandomValues(new Uint8Array(24)),
    (byte) => String.fromCharCode(97 + (byte % 26)),
  ).join("");
  const tail = crypto.getRandomValues(new Uint8Array(30)).toBase64({
    alphabet: "base64url",
    omitPadding: true,
  });
  return `${letters}.AO-J1O${tail}`;
}
