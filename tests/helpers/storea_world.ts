/**
 * Store A's side of a test in one call: a test PKI, a signer for its leaf, the App Store Server
 * API simulator answering with it, an App Store Connect key written in the test's directory that
 * the simulator knows (the key `storeaCredentialArgs` configures), and the PKI's root as a PEM
 * file for `STOREA_ROOT_CERTS`.
 */
import { join } from "node:path";
import {
  createStoreaTestPki,
  type StoreaTestPki,
  writeStoreaRootPem,
} from "../../simulators/storea_pki.ts";
import { StoreaSigner } from "../../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  type StoreaApiSimulator,
  type StoreaApiSimulatorOptions,
} from "../../simulators/storea_api.ts";
import { TEST_ISSUER_ID, writeStoreaKeyFile } from "./fixtures.ts";

/** The bundle id `storeaCredentialArgs` configures. */
const BUNDLE_ID = "com.example.app";

/** What {@linkcode startStoreaWorld} made; the caller closes `api`. */
export interface StoreaWorld {
  pki: StoreaTestPki;
  signer: StoreaSigner;
  api: StoreaApiSimulator;
  /** The `.p8` key the simulator accepts tokens of. */
  keyFile: string;
  /** The PKI's root, for `STOREA_ROOT_CERTS`. */
  rootPemPath: string;
}

/** Starts store A's simulator in `dir` with `options` (its signer made here). */
export async function startStoreaWorld(
  dir: string,
  options: Omit<StoreaApiSimulatorOptions, "signer"> = {},
): Promise<StoreaWorld> {
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const api = await startStoreaApiSimulator({ ...options, signer });
  const keyFile = await writeStoreaKeyFile(dir);
  await api.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: BUNDLE_ID,
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  const rootPemPath = await writeStoreaRootPem(pki, join(dir, "root.pem"));
  return { pki, signer, api, keyFile, rootPemPath };
}
