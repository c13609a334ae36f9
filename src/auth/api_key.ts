/**
 * API key tokens: `service_<live|test>_<43 base64url characters>` (docs/integration.md,
 * "Authentication"), made from 32 random bytes and stored only as their SHA-256.
 */
import { sha256Hex } from "../lib/sha256.ts";
import { base64url } from "../crypto/secrets.ts";

/** The environment label of a key; informational, both grant the same access. */
export type KeyEnv = "live" | "test";

const TOKEN = /^service_(live|test)_[A-Za-z0-9_-]{43}$/;
/** How much of a key listings show. */
const PREFIX_LENGTH = "service_live_".length + 4;

/** A freshly minted key: the token is shown once and then only its hash is kept. */
export interface MintedKey {
  token: string;
  hash: string;
  prefix: string;
}

/** Mints a new API key. */
export function mintApiKey(env: KeyEnv): MintedKey {
  const token = `service_${env}_${base64url(crypto.getRandomValues(new Uint8Array(32)))}`;
  return { token, hash: hashApiKey(token), prefix: token.slice(0, PREFIX_LENGTH) };
}

/** The stored form of a key. */
export function hashApiKey(token: string): string {
  return sha256Hex(token);
}

/** The token of an `Authorization: Bearer` header when it has the key shape, else null. */
export function parseBearerKey(header: string | null): string | null {
  if (header === null) return null;
  const match = /^Bearer +(\S+)\s*$/i.exec(header);
  if (!match || !TOKEN.test(match[1])) return null;
  return match[1];
}
