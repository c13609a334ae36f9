/**
 * Apple's App Store Server Library on Node.js, where its users run it, timed for
 * `bench/storea_jws.ts`: `SignedDataVerifier.verifyAndDecodeNotification` (offline,
 * `enableOnlineChecks` false) of one JWS, one verification at a time.
 *
 * Run by `bench/storea_jws.ts` (the library is installed here from package-lock.json):
 *
 *     node bench/apple_node/verify_notification.mjs JWS_FILE ROOT_DER_FILE BUNDLE_ID APP_APPLE_ID
 *
 * It verifies the JWS once and prints `{"ready":true,"notificationUUID":...,"engine":...}`, then
 * reads commands on stdin, one per line: `warmup N` runs N verifications unmeasured and prints
 * `{"done":true}`; `round N` runs N and prints `{"seconds":...}`. It exits when stdin closes.
 * @module
 */
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";

// Through a constant, so that `deno check bench/` leaves the Node package out of its graph.
const LIBRARY = "@apple/app-store-server-library";
const { Environment, SignedDataVerifier } = await import(LIBRARY);

const [jwsFile, rootFile, bundleId, appAppleId] = process.argv.slice(2);
const jws = readFileSync(jwsFile, "utf8").trim();
const verifier = new SignedDataVerifier(
  [readFileSync(rootFile)],
  false,
  Environment.SANDBOX,
  bundleId,
  Number(appAppleId),
);

const first = await verifier.verifyAndDecodeNotification(jws);
console.log(JSON.stringify({
  ready: true,
  notificationUUID: first.notificationUUID,
  engine: `Node.js ${process.version} crypto (OpenSSL ${process.versions.openssl})`,
}));

for await (const line of createInterface({ input: process.stdin })) {
  const [command, count] = line.trim().split(" ");
  const n = Number(count);
  const started = performance.now();
  for (let i = 0; i < n; i++) await verifier.verifyAndDecodeNotification(jws);
  const seconds = (performance.now() - started) / 1000;
  console.log(JSON.stringify(command === "round" ? { seconds } : { done: true }));
}
