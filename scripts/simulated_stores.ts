/**
 * The store simulators as `deno task demo` and `deno task dev` run them, in the script's own
 * process: a test PKI and signer shaped like Apple's with a fake App Store Server API, a fake
 * Google token endpoint and Play Developer API, and a fake Google issuer of push tokens. They
 * accept one tenant's keys and answer for one purchase in each store.
 *
 * @module
 */
import { join } from "node:path";
import {
  createServiceAccount,
  createStoreaTestPki,
  type PushTokenIssuer,
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
