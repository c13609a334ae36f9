/**
 * Store A JWS verifications per second: ours (`StoreaJwsVerifier.verify`) on Deno against Apple's
 * official library (`SignedDataVerifier.verifyAndDecodeNotification`, offline) on Node.js, where
 * its users run it, on the same real App Store Server Notification and the same machine, one
 * verification at a time.
 *
 * Ours runs in this process on the ES256 engine the service picks here (OpenSSL's libcrypto
 * through FFI when it opens), and again on WebCrypto, its fallback. Apple's runs in a Node.js
 * child (`bench/apple_node/verify_notification.mjs`, the library installed there from its
 * package-lock.json by `npm ci` on first use), whose ES256 engine is Node's crypto (OpenSSL built
 * into Node); and, for context, in this process under Deno's Node compatibility. All verify the
 * outer `signedPayload` only: ours by design (nested JWS are verified by the caller), Apple's
 * because `verifyAndDecodeNotification` calls `verifyJWT` on the signedPayload alone
 * (dist/jws_verification.js of 3.1.0). With `enableOnlineChecks` false Apple's library keeps no
 * cache, so it checks the certificate chain on every call; ours checks a chain once and remembers
 * it under the JWS header's text, then costs one ES256 verification and the decoding of the
 * payload.
 *
 * The rounds interleave the verifiers, rotating which goes first, so that a burst of noise from
 * other processes falls on all. As context it also times one ES256 check alone of the same
 * signing input with the same leaf key, on each engine, and the decoding of the payload as
 * `src/storea/jws.ts` does it.
 *
 * Run it from the repository root (the real notification is in `tests/fixtures/storea/`):
 *
 *     deno run --allow-read --allow-ffi --allow-run=node,npm bench/storea_jws.ts [--rounds 5] [--count 300] [--json]
 *
 * It needs `node` (20 or later) and, the first time, `npm` and the npm registry.
 * @module
 */
import { parseArgs } from "node:util";
import { Buffer } from "node:buffer";
import { X509Certificate } from "node:crypto";
import { decodeSegment, StoreaJwsVerifier } from "../src/storea/jws.ts";
import { type Es256Engine, importEs256Key, selectEs256Engine } from "../src/crypto/es256.ts";
import { formatTable, type Progress, ROOT, writeProgress } from "./support.ts";

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
  /** The runtime it ran on, e.g. `Deno 2.9.6` or `Node.js v20.20.2`. */
  runtime: string;
  /** What checked its ES256 signatures. */
  engine: string;
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
  /** Apple's library on Node.js: what the goal is judged against. */
  appleNode: VerifierTiming;
  /** Apple's library under Deno's Node compatibility, for context. */
  apple: VerifierTiming;
  /** ours ops/s divided by Apple's on Node. */
  ratio: number;
  /** The same ratio in each round, to show how stable it was. */
  roundRatios: number[];
  /** One ES256 check alone, µs: on WebCrypto, and on OpenSSL when it is the engine. */
  es256Micros: { webcrypto: number; openssl: number | null };
  /** Decoding the JWS's payload as `src/storea/jws.ts` does once its header is cached, in µs. */
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

  const appleNode = await startAppleOnNode(progress);
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
  // Each times `count` sequential verifications and resolves with the seconds they took.
  const inProcess = (verify: () => Promise<unknown>) => (count: number) =>
    timeSequential(verify, count);
  const timers = {
    ours: inProcess(() => ours.verify(jws)),
    oursWebCrypto: inProcess(() => oursWebCrypto.verify(jws)),
    appleNode: (count: number) => appleNode.round(count),
    apple: inProcess(() => apple.verifyAndDecodeNotification(jws)),
  };
  type Which = keyof typeof timers;
  const names = Object.keys(timers) as Which[];

  const rounds: Record<Which, number[]> = {
    ours: [],
    oursWebCrypto: [],
    appleNode: [],
    apple: [],
  };
  try {
    // All must accept the vector and read the same notification, or the timing means nothing.
    const uuids = new Set<unknown>([
      (await ours.verify(jws)).notificationUUID,
      (await oursWebCrypto.verify(jws)).notificationUUID,
      (await apple.verifyAndDecodeNotification(jws)).notificationUUID,
      appleNode.notificationUUID,
    ]);
    if (uuids.size !== 1) throw new Error(`the verifiers disagree: ${[...uuids].join(" vs ")}`);
    progress(
      `all verify ${VECTOR_FILE} (${jws.length} characters), notification ${
        [...uuids][0]
      }; ours on ${engine}`,
    );

    for (const which of names) await timers[which](settings.warmup);
    for (let round = 0; round < settings.rounds; round++) {
      // Which goes first rotates, so none always runs right after another's garbage.
      const order = names.map((_, i) => names[(i + round) % names.length]);
      for (const which of order) rounds[which].push(await timers[which](settings.count));
      progress(
        `round ${round + 1}: ${
          names.map((which) => `${which} ${(settings.count / rounds[which][round]).toFixed(0)}/s`)
            .join(", ")
        }`,
      );
    }
  } finally {
    await appleNode.close();
  }
  const oursRounds = rounds.ours;
  const appleRounds = rounds.appleNode;

  const deno = `Deno ${Deno.version.deno}`;
  const timing = (
    name: string,
    runtime: string,
    engine: string,
    rounds: number[],
  ): VerifierTiming => {
    const total = rounds.reduce((sum, seconds) => sum + seconds, 0);
    return {
      name,
      runtime,
      engine,
      roundsOpsPerSecond: rounds.map((seconds) => settings.count / seconds),
      opsPerSecond: (settings.count * rounds.length) / total,
      meanMicros: (total / (settings.count * rounds.length)) * 1e6,
    };
  };
  const openssl = `OpenSSL ${libcryptoVersion()} libcrypto through FFI`;
  const oursTiming = timing(
    "ours (StoreaJwsVerifier.verify)",
    deno,
    engine === "openssl" ? openssl : "WebCrypto",
    oursRounds,
  );
  const oursWebCryptoTiming = timing(
    "ours (StoreaJwsVerifier.verify)",
    deno,
    "WebCrypto",
    rounds.oursWebCrypto,
  );
  const appleNodeTiming = timing(
    "Apple's (SignedDataVerifier.verifyAndDecodeNotification)",
    appleNode.engine.runtime,
    appleNode.engine.engine,
    appleRounds,
  );
  const appleTiming = timing(
    "Apple's (SignedDataVerifier.verifyAndDecodeNotification)",
    deno,
    "node:crypto of Deno",
    rounds.apple,
  );
  const ratio = oursTiming.opsPerSecond / appleNodeTiming.opsPerSecond;
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
    appleNode: appleNodeTiming,
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
  const row = (timing: VerifierTiming) => [
    timing.name,
    timing.runtime,
    timing.engine,
    timing.opsPerSecond.toFixed(0),
    timing.meanMicros.toFixed(0),
    (timing.opsPerSecond / result.appleNode.opsPerSecond).toFixed(2),
  ];
  return formatTable([
    { header: "verifier" },
    { header: "runtime" },
    { header: "ES256 engine" },
    { header: "verifications/s", numeric: true },
    { header: "mean µs", numeric: true },
    { header: "vs Apple's on Node", numeric: true },
  ], [
    row(result.ours),
    ...(result.engine === "webcrypto" ? [] : [row(result.oursWebCrypto)]),
    row(result.appleNode),
    row(result.apple),
  ]);
}

/** The goal line and the context figures. */
export function formatJwsGoal(result: JwsBenchmarkResult): string {
  return [
    `- ours on Deno at least ${result.goal.minRatio}x Apple's on Node: ${
      result.ratio.toFixed(2)
    }x, ${result.goal.met ? "met" : "NOT met"} (per round: ${
      result.roundRatios.map((r) => r.toFixed(2)).join(", ")
    })`,
    `- one ES256 check alone of the same signing input, in this Deno process: ${
      result.es256Micros.openssl === null
        ? ""
        : `OpenSSL ${result.es256Micros.openssl.toFixed(0)} µs, `
    }WebCrypto ${result.es256Micros.webcrypto.toFixed(0)} µs`,
    `- decoding the payload (base64url, strict UTF-8, JSON) as src/storea/jws.ts does: ${
      result.decodeMicros.toFixed(0)
    } µs`,
  ].join("\n");
}

/** Apple's library in a Node.js child, driven round by round over its stdin. */
interface AppleOnNode {
  notificationUUID: unknown;
  engine: { runtime: string; engine: string };
  /** Runs `count` verifications there; resolves with the seconds they took. */
  round(count: number): Promise<number>;
  close(): Promise<void>;
}

const APPLE_NODE_DIR = `${ROOT}/bench/apple_node`;

/**
 * Installs Apple's library for Node from bench/apple_node/package-lock.json when it is not there
 * yet, then starts the child and waits until it has verified the vector once.
 */
async function startAppleOnNode(progress: Progress): Promise<AppleOnNode> {
  const installed = await Deno.stat(
    `${APPLE_NODE_DIR}/node_modules/@apple/app-store-server-library/package.json`,
  ).then(() => true, () => false);
  if (!installed) {
    progress("installing Apple's library for Node (npm ci in bench/apple_node)");
    const npm = await new Deno.Command("npm", {
      args: ["ci", "--ignore-scripts", "--no-audit", "--no-fund"],
      cwd: APPLE_NODE_DIR,
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!npm.success) {
      throw new Error(`npm ci in bench/apple_node failed: ${new TextDecoder().decode(npm.stderr)}`);
    }
  }
  const child = new Deno.Command("node", {
    args: [
      `${APPLE_NODE_DIR}/verify_notification.mjs`,
      decodeURIComponent(new URL(VECTOR_FILE, VECTORS).pathname),
      decodeURIComponent(new URL(ROOT_FILE, VECTORS).pathname),
      BUNDLE_ID,
      String(APP_APPLE_ID),
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(lineSplitter())
    .getReader();
  const writer = child.stdin.getWriter();
  const next = async () => {
    const { value, done } = await lines.read();
    if (done) throw new Error("the Node child of Apple's library exited");
    return JSON.parse(value);
  };
  const ready = await next();
  const [runtime, engine] = String(ready.engine).split(" crypto ");
  return {
    notificationUUID: ready.notificationUUID,
    engine: { runtime, engine: `Node's crypto ${engine}` },
    async round(count) {
      await writer.write(new TextEncoder().encode(`round ${count}\n`));
      const answer = await next();
      return answer.seconds;
    },
    async close() {
      await writer.close().catch(() => {});
      await child.status;
    },
  };
}

/** Splits a text stream into lines. */
function lineSplitter(): TransformStream<string, string> {
  let carry = "";
  return new TransformStream({
    transform(chunk, controller) {
      const parts = (carry + chunk).split("\n");
      carry = parts.pop()!;
      for (const line of parts) if (line.trim() !== "") controller.enqueue(line);
    },
    flush(controller) {
      if (carry.trim() !== "") controller.enqueue(carry);
    },
  });
}

/** The version of the libcrypto the service's OpenSSL engine opens, e.g. `3.0.17`. */
function libcryptoVersion(): string {
  try {
    const library = Deno.dlopen("libcrypto.so.3", {
      OpenSSL_version: { parameters: ["i32"], result: "pointer" },
    });
    const text = new Deno.UnsafePointerView(library.symbols.OpenSSL_version(0)!).getCString();
    library.close();
    return /OpenSSL (\S+)/.exec(text)?.[1] ?? "3";
  } catch {
    return "3";
  }
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

/**
 * The payload decoded by src/storea/jws.ts's own `decodeSegment`; a JWS whose header is cached has
 * nothing else decoded.
 */
function decodeMicros(jws: string, count: number): number {
  const [, payload] = jws.split(".");
  for (let i = 0; i < 50; i++) decodeSegment(payload, "payload");
  const started = performance.now();
  for (let i = 0; i < count; i++) decodeSegment(payload, "payload");
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
