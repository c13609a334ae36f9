/**
 * Store A JWS verifications per second: ours (`StoreaJwsVerifier.verify`) against Apple's
 * official library (`SignedDataVerifier.verifyAndDecodeNotification`, offline), on the same real
 * App Store Server Notification, in the same process, one verification at a time.
 *
 * Ours runs on the ES256 engine the service picks here (OpenSSL's libcrypto when it opens), and
 * again on WebCrypto, its fallback. All verify the outer `signedPayload` only: ours by design
 * (nested JWS are verified by the caller), Apple's because `verifyAndDecodeNotification` calls
 * `verifyJWT` on the signedPayload alone (dist/jws_verification.js of 3.1.0). With
 * `enableOnlineChecks` false Apple's library keeps no cache, so it checks the certificate chain on
 * every call; ours checks a chain once and remembers it, then costs one ES256 verification and the
 * decoding of the JWS.
 *
 * The rounds alternate ours and Apple's, so that a burst of noise from other processes falls on
 * both. As context it also times one ES256 check alone of the same signing input with the same
 * leaf key, on each engine, and the base64url decoding of the JWS as `src/storea/jws.ts` does it.
 *
 * Run it from the repository root (the real notification is in `tests/fixtures/storea/`):
 *
 *     deno run --allow-read --allow-ffi bench/storea_jws.ts [--rounds 5] [--count 300] [--json]
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Buffer } from "node:buffer";
import { X509Certificate } from "node:crypto";
import { StoreaJwsVerifier } from "../src/storea/jws.ts";
import { type Es256Engine, importEs256Key, selectEs256Engine } from "../src/crypto/es256.ts";
import { formatTable, type Progress, writeProgress } from "./support.ts";

type AppleLibrary = typeof import("./apple_store_server_library.d.ts");

/** Options of {@linkcode runJwsBenchmark}. */
export interface JwsBenchmarkOptions {
  /** Measured rounds of each verifier; 5 by default. */
  rounds?: number;
  /** Sequential verifications per round; 300 by default. */
  count?: number;
  /** Unmeasured verifications of each before the first round; 100 by default. */
  warmup?: number;
  /** Where progress lines go; standard error by default. */
  progress?: Progress;
}

/** The timing of one verifier over all rounds. */
export interface VerifierTiming {
  name: string;
  /** Verifications per second in each round. */
  roundsOpsPerSecond: number[];
  /** Verifications per second over all rounds together. */
  opsPerSecond: number;
  /** Mean time of one verification, in microseconds. */
  meanMicros: number;
}

/** What {@linkcode runJwsBenchmark} returns. */
export interface JwsBenchmarkResult {
  startedAt: string;
  machine: { cpus: number; os: string; deno: string; v8: string };
  vector: string;
  settings: Required<Omit<JwsBenchmarkOptions, "progress">>;
  /** The ES256 engine the service picks here (`CRYPTO_ENGINE=auto`), which `ours` runs on. */
  engine: Es256Engine;
  ours: VerifierTiming;
  /** Ours on the WebCrypto engine, the fallback without libcrypto. */
  oursWebCrypto: VerifierTiming;
  apple: VerifierTiming;
  /** ours ops/s divided by Apple's. */
  ratio: number;
  /** The same ratio in each round, to show how stable it was. */
  roundRatios: number[];
  /** One ES256 check alone, µs: on WebCrypto, and on OpenSSL when it is the engine. */
  es256Micros: { webcrypto: number; openssl: number | null };
  /** Decoding the JWS's header and payload as `src/storea/jws.ts` does, in µs. */
  decodeMicros: number;
  goal: { minRatio: number; met: boolean };
}

/**
 * Apple's library, a benchmark-only dependency pinned here rather than in the service's import map
 * (it is in deno.lock). It is imported dynamically through a constant so that `deno check` leaves
 * it out of the type-checked graph: its package depends on `@types/node@25`, and with that in the
 * graph Deno types every `node:` module with it, whose `CryptoKey` clashes with the web one in
 * jose's signatures across src/. Its types are declared in `apple_store_server_library.d.ts`.
 */
const APPLE_LIBRARY = "npm:@apple/app-store-server-library@3.1.0";

/** The goal: ours verifies at least this many times as many JWS per second as Apple's. */
export const MIN_RATIO = 5;

const VECTORS = new URL("../tests/fixtures/storea/", import.meta.url);
const VECTOR_FILE = "real-sandbox/notification-01.jws";
const ROOT_FILE = "roots/AppleRootCA-G3.cer";
/** The app the real notifications belong to (tests/fixtures/storea/README.md). */
const BUNDLE_ID = "com.loki-project.loki-messenger";
const APP_APPLE_ID = 1470168868;

/** Times both verifiers on the real notification; throws if either does not verify it. */
export async function runJwsBenchmark(
  options: JwsBenchmarkOptions = {},
): Promise<JwsBenchmarkResult> {
  const settings = {
    rounds: options.rounds ?? 5,
    count: options.count ?? 300,
    warmup: options.warmup ?? 100,
  };
  const progress = options.progress ?? writeProgress;
  const jws = (await Deno.readTextFile(new URL(VECTOR_FILE, VECTORS))).trim();
  const rootDer = await Deno.readFile(new URL(ROOT_FILE, VECTORS));

  const { Environment, SignedDataVerifier }: AppleLibrary = await import(APPLE_LIBRARY);
  // The built-in pin is Apple Root CA - G3, the root this notification's chain ends in.
  const engine = await selectEs256Engine("auto");
  const ours = new StoreaJwsVerifier({ engine });
  const oursWebCrypto = new StoreaJwsVerifier({ engine: "webcrypto" });
  const apple = new SignedDataVerifier(
    [Buffer.from(rootDer)],
    false,
    Environment.SANDBOX,
    BUNDLE_ID,
    APP_APPLE_ID,
  );
  const verifiers = {
    ours: () => ours.verify(jws),
    oursWebCrypto: () => oursWebCrypto.verify(jws),
    apple: () => apple.verifyAndDecodeNotification(jws),
  };
  type Which = keyof typeof verifiers;
  const names = Object.keys(verifiers) as Which[];

  // All must accept the vector and read the same notification, or the timing means nothing.
  const uuids = new Set<unknown>();
  for (const which of names) uuids.add((await verifiers[which]()).notificationUUID);
  if (uuids.size !== 1) throw new Error(`the verifiers disagree: ${[...uuids].join(" vs ")}`);
  progress(
    `all verify ${VECTOR_FILE} (${jws.length} characters), notification ${
      [...uuids][0]
    }; ours on ${engine}`,
  );

  for (let i = 0; i < settings.warmup; i++) {
    for (const which of names) await verifiers[which]();
  }
  const rounds: Record<Which, number[]> = { ours: [], oursWebCrypto: [], apple: [] };
  for (let round = 0; round < settings.rounds; round++) {
    // Which goes first rotates, so none always runs right after another's garbage.
    const order = names.map((_, i) => names[(i + round) % names.length]);
    for (const which of order) {
      rounds[which].push(await timeSequential(verifiers[which], settings.count));
    }
    progress(
      `round ${round + 1}: ${
        names.map((which) => `${which} ${(settings.count / rounds[which][round]).toFixed(0)}/s`)
          .join(", ")
      }`,
    );
  }
  const oursRounds = rounds.ours;
  const appleRounds = rounds.apple;

  const timing = (name: string, rounds: number[]): VerifierTiming => {
    const total = rounds.reduce((sum, seconds) => sum + seconds, 0);
    return {
      name,
      roundsOpsPerSecond: rounds.map((seconds) => settings.count / seconds),
      opsPerSecond: (settings.count * rounds.length) / total,
      meanMicros: (total / (settings.count * rounds.length)) * 1e6,
    };
  };
  const oursTiming = timing(`ours (StoreaJwsVerifier.verify), ${engine}`, oursRounds);
  const oursWebCryptoTiming = timing(
    "ours (StoreaJwsVerifier.verify), webcrypto",
    rounds.oursWebCrypto,
  );
  const appleTiming = timing(
    "Apple's (SignedDataVerifier.verifyAndDecodeNotification)",
    appleRounds,
  );
  const ratio = oursTiming.opsPerSecond / appleTiming.opsPerSecond;
  return {
    startedAt: new Date().toISOString(),
    machine: {
      cpus: navigator.hardwareConcurrency,
      os: `${Deno.build.os} ${Deno.build.arch}`,
      deno: Deno.version.deno,
      v8: Deno.version.v8,
    },
    vector: VECTOR_FILE,
    settings,
    engine,
    ours: oursTiming,
    oursWebCrypto: oursWebCryptoTiming,
    apple: appleTiming,
    ratio,
    roundRatios: oursRounds.map((seconds, i) => appleRounds[i] / seconds),
    es256Micros: {
      webcrypto: await es256Micros(jws, settings.count * 2, "webcrypto"),
      openssl: engine === "openssl" ? await es256Micros(jws, settings.count * 10, "openssl") : null,
    },
    decodeMicros: decodeMicros(jws, settings.count * 10),
    goal: { minRatio: MIN_RATIO, met: ratio >= MIN_RATIO },
  };
}

/** The markdown table of a result. */
export function formatJwsTable(result: JwsBenchmarkResult): string {
  const row = (timing: VerifierTiming, ratio: string) => [
    timing.name,
    timing.opsPerSecond.toFixed(0),
    timing.meanMicros.toFixed(0),
    ratio,
  ];
  return formatTable([
    { header: "verifier" },
    { header: "verifications/s", numeric: true },
    { header: "mean µs", numeric: true },
    { header: "vs Apple's", numeric: true },
  ], [
    row(result.ours, result.ratio.toFixed(2)),
    ...(result.engine === "webcrypto" ? [] : [
      row(
        result.oursWebCrypto,
        (result.oursWebCrypto.opsPerSecond / result.apple.opsPerSecond).toFixed(2),
      ),
    ]),
    row(result.apple, "1.00"),
  ]);
}

/** The goal line and the context figures. */
export function formatJwsGoal(result: JwsBenchmarkResult): string {
  return [
    `- ours at least ${result.goal.minRatio}x Apple's: ${result.ratio.toFixed(2)}x, ${
      result.goal.met ? "met" : "NOT met"
    } (per round: ${result.roundRatios.map((r) => r.toFixed(2)).join(", ")})`,
    `- one ES256 check alone of the same signing input: ${
      result.es256Micros.openssl === null
        ? ""
        : `OpenSSL ${result.es256Micros.openssl.toFixed(0)} µs, `
    }WebCrypto ${result.es256Micros.webcrypto.toFixed(0)} µs`,
    `- decoding the header and payload as src/storea/jws.ts does: ${
      result.decodeMicros.toFixed(0)
    } µs`,
  ].join("\n");
}

async function timeSequential(verify: () => Promise<unknown>, count: number): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < count; i++) await verify();
  return (performance.now() - started) / 1000;
}

/**
 * One ES256 check on `engine` and nothing else: the leaf's key from x5c[0], the JWS's signature
 * over its signing input. The service pays this once per store A JWS, whatever else it does.
 */
async function es256Micros(jws: string, count: number, engine: Es256Engine): Promise<number> {
  const [header, payload, signature] = jws.split(".");
  const leaf = new X509Certificate(
    decodeBase64(JSON.parse(new TextDecoder().decode(decodeBase64(header))).x5c[0]),
  );
  const spki = leaf.publicKey.export({ type: "spki", format: "der" });
  const key = await importEs256Key(new Uint8Array(spki), engine);
  const data = new TextEncoder().encode(`${header}.${payload}`);
  const signatureBytes = decodeBase64(signature);
  if (!await key.verify(signatureBytes, data)) {
    throw new Error(`the ES256 check on ${engine} does not verify the vector`);
  }
  for (let i = 0; i < 50; i++) await key.verify(signatureBytes, data);
  const started = performance.now();
  for (let i = 0; i < count; i++) await key.verify(signatureBytes, data);
  return ((performance.now() - started) / count) * 1000;
}

/** The header and payload decoded as `decodeBase64` of src/storea/jws.ts does. */
function decodeMicros(jws: string, count: number): number {
  const [header, payload] = jws.split(".");
  const decodeAsJwsTs = (text: string) => Uint8Array.fromBase64(text, { alphabet: "base64url" });
  for (let i = 0; i < 50; i++) decodeAsJwsTs(header);
  const started = performance.now();
  for (let i = 0; i < count; i++) {
    decodeAsJwsTs(header);
    decodeAsJwsTs(payload);
  }
  return ((performance.now() - started) / count) * 1000;
}

function decodeBase64(text: string): Uint8Array<ArrayBuffer> {
  const binary = atob(text.replaceAll("-", "+").replaceAll("_", "/"));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      rounds: { type: "string" },
      count: { type: "string" },
      json: { type: "boolean", default: false },
    },
  });
  const result = await runJwsBenchmark({
    rounds: values.rounds === undefined ? undefined : Number(values.rounds),
    count: values.count === undefined ? undefined : Number(values.count),
  });
  console.log(`## Store A JWS verification (${result.vector})\n`);
  console.log(formatJwsTable(result));
  console.log();
  console.log(formatJwsGoal(result));
  if (values.json) console.log(`\n${JSON.stringify(result, null, 2)}`);
}
