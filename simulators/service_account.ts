/**
 * Test service accounts for store B: an RSA 2048 key pair and the JSON file Google Cloud would
 * hand out for it, made fresh on every call so no key material is ever checked in.
 */

import { derToPem } from "./pem.ts";

/** A generated service account. */
export interface GeneratedServiceAccount {
  /** The service-account JSON file, as text (what `storeb set-credentials` reads). */
  json: string;
  clientEmail: string;
  /** The file's `private_key_id`, sent by the service as the assertion's `kid`. */
  privateKeyId: string;
  /** PKCS#8 PEM of the private key (the file's `private_key`). */
  privateKeyPem: string;
  /** SPKI PEM of the public key, what the simulator checks assertions with. */
  publicKeyPem: string;
}

/** Options of {@linkcode createServiceAccount}. */
export interface CreateServiceAccountOptions {
  /** Default: `relay-<random>@sim-project.iam.gserviceaccount.com`. */
  clientEmail?: string;
  /** Default: 40 random hex digits, like Google's. */
  privateKeyId?: string;
  /** The file's `token_uri` (informational: the service uses `STOREB_TOKEN_URL`). */
  tokenUri?: string;
}

/** Generates a service account with a new RSA 2048 key. */
export async function createServiceAccount(
  options: CreateServiceAccountOptions = {},
): Promise<GeneratedServiceAccount> {
  const pair = await crypto.subtle.generateKey(
    {
      name: "RSASSA-PKCS1-v1_5",
      modulusLength: 2048,
      publicExponent: new Uint8Array([1, 0, 1]),
      hash: "SHA-256",
    },
    true,
    ["sign", "verify"],
  );
  const privateKeyPem = derToPem(
    new Uint8Array(await crypto.subtle.exportKey("pkcs8", pair.privateKey)),
    "PRIVATE KEY",
  );
  const publicKeyPem = derToPem(
    new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey)),
    "PUBLIC KEY",
  );
  const clientEmail = options.clientEmail ??
    `relay-${randomHex(4)}@sim-project.iam.gserviceaccount.com`;
  const privateKeyId = options.privateKeyId ?? randomHex(20);
  const json = JSON.stringify(
    {
      type: "service_account",
      project_id: "sim-project",
      private_key_id: privateKeyId,
      private_key: privateKeyPem,
      client_email: clientEmail,
      client_id: String(100_000_000_000_000_000_000n + BigInt(parseInt(randomHex(6), 16))),
      auth_uri: "https://accounts.google.com/o/oauth2/auth",
      token_uri: options.tokenUri ?? "https://oauth2.googleapis.com/token",
    },
    null,
    2,
  );
  return { json, clientEmail, privateKeyId, privateKeyPem, publicKeyPem };
}

function randomHex(bytes: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)))
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}
