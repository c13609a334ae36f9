/**
 * The upstreams of `bench/verify.ts`, each in a process of its own so that its CPU is not charged
 * to the bench driver and it can be pinned to a core of its own.
 *
 * `storea` answers the App Store Server API's Get Transaction Info
 * (`GET /production/inApps/v1/transactions/{id}`) for `--count` distinct transactions, each signed
 * once at setup by the test PKI and signer of `simulators/` (`StoreaSigner`: ES256, x5c chain
 * of three, Apple-shaped payload). The real App Store signs every answer afresh, so every request
 * of the benchmark must bring the service a JWS it has not verified before.
 *
 * Why not `simulators/storea_api.ts` itself: it verifies the ES256 bearer token on every call,
 * which caps it at about 2,500 answers per second on a whole core of this machine, below what the
 * baseline proxy asks of it; the benchmark would then measure the simulator. This upstream checks
 * the token by the same rules (ES256, typ JWT, known kid, iss, aud `appstoreconnect-v1`, bid, iat
 * not in the future, exp in the future, at most 60 minutes of life) but verifies each distinct
 * token string once and remembers the verdict, as the expiry is rechecked on every call. Checking
 * the token is Apple's CPU, not the service's: the service sends one token per tenant and hour.
 *
 * `storeb` runs the Google Play simulator of `simulators/storeb_play.ts` as it is (its checks
 * of access tokens are map lookups, cheap enough), with the bench's service account and `--count`
 * distinct subscription purchase tokens.
 *
 * When ready it prints one JSON line on stdout ({@linkcode UpstreamReady}), then serves until
 * SIGTERM or SIGINT.
 *
 *     deno run --allow-net=127.0.0.1 --allow-read --allow-write=DIR bench/verify_upstream.ts \
 *       storea --dir DIR --count 20000 --key-file DIR/AuthKey.p8 --issuer-id UUID --key-id KID \
 *       --bundle-id com.example.app
 *     deno run --allow-net=127.0.0.1 --allow-read bench/verify_upstream.ts \
 *       storeb --count 20000 --account-file DIR/service-account.json --package-name com.example.app
 *
 * @module
 */
import { parseArgs } from "node:util";
import { exportJWK, importJWK, importPKCS8, jwtVerify } from "jose";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import { sampleSubscriptionPurchase, startStorebSimulator } from "../simulators/storeb_play.ts";

/** What the store A upstream prints once it is ready to be measured against. */
export interface StoreaUpstreamReady {
  store: "storea";
  /** Base URL the service appends `/inApps/v1/...` to. */
  productionUrl: string;
  sandboxUrl: string;
  /** PEM of the test root, for `STOREA_ROOT_CERTS`. */
  rootPemPath: string;
  /** How many transactions were registered; their ids are {@linkcode upstreamId}. */
  count: number;
  /** Time spent making the PKI and signing the transactions, in milliseconds. */
  setupMs: number;
}

/** What the store B upstream prints once it is ready to be measured against. */
export interface StorebUpstreamReady {
  store: "storeb";
  /** `STOREB_API_URL`. */
  apiUrl: string;
  /** `STOREB_TOKEN_URL`. */
  tokenUrl: string;
  /** How many subscriptions were registered; their tokens are {@linkcode upstreamId}. */
  count: number;
  setupMs: number;
}

/** The line either upstream prints when it is ready. */
export type UpstreamReady = StoreaUpstreamReady | StorebUpstreamReady;

/** How the ids an upstream answers for are spelled: prefix, 9-digit index, suffix. */
export interface IdPattern {
  prefix: string;
  suffix: string;
}

/** Store A transaction ids: 16 digits, like Apple's. */
export const STOREA_IDS: IdPattern = { prefix: "2000000", suffix: "" };
/** Store B purchase tokens: about as long as Google's (150 characters). */
export const STOREB_IDS: IdPattern = { prefix: "bench", suffix: `.AO-J1Oz${"Qx7b".repeat(34)}` };

/**
 * The `index`-th id of `pattern`. The wrk script of `bench/verify.ts` builds the same strings
 * (`string.format("%09d", index)` between prefix and suffix).
 */
export function upstreamId(pattern: IdPattern, index: number): string {
  return `${pattern.prefix}${String(index).padStart(9, "0")}${pattern.suffix}`;
}

/** Signing jobs kept in flight at once during setup. */
const SIGNING_BATCH = 64;
const TRANSACTION_PATH = /^\/(production|sandbox)\/inApps\/v1\/transactions\/([0-9]+)$/;
const JSON_HEADERS = { "content-type": "application/json" };
/** Apple's 404 body for an unknown transaction id. */
const NOT_FOUND_BODY = JSON.stringify({
  errorCode: 4040010,
  errorMessage: "Transaction id not found.",
});

interface StoreaOptions {
  dir: string;
  count: number;
  keyFile: string;
  issuerId: string;
  keyId: string;
  bundleId: string;
}

async function serveStorea(options: StoreaOptions): Promise<void> {
  const started = performance.now();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: options.bundleId });
  // The answer bodies, ready to send: Apple's `{ signedTransactionInfo }`.
  const answers = new Map<string, string>();
  for (let first = 0; first < options.count; first += SIGNING_BATCH) {
    const last = Math.min(first + SIGNING_BATCH, options.count);
    const batch = [];
    for (let index = first; index < last; index++) {
      const transactionId = upstreamId(STOREA_IDS, index);
      const payload = signer.sampleTransaction({ transactionId, environment: "Production" });
      batch.push(
        signer.signTransaction(payload).then((jws) =>
          answers.set(transactionId, JSON.stringify({ signedTransactionInfo: jws }))
        ),
      );
    }
    await Promise.all(batch);
  }
  const rootPemPath = await writeStoreaRootPem(pki, `${options.dir}/storea-root.pem`);
  const tokens = new TokenChecker(options, await Deno.readTextFile(options.keyFile));

  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    async (request) => {
      const match = TRANSACTION_PATH.exec(new URL(request.url).pathname);
      if (request.method !== "GET" || match === null || match[1] !== "production") {
        return new Response(NOT_FOUND_BODY, { status: 404, headers: JSON_HEADERS });
      }
      // Apple answers 401 with an empty body, whatever was wrong with the token.
      if (!await tokens.accepts(request.headers.get("authorization"))) {
        return new Response(null, { status: 401 });
      }
      const body = answers.get(match[2]);
      return body === undefined
        ? new Response(NOT_FOUND_BODY, { status: 404, headers: JSON_HEADERS })
        : new Response(body, { headers: JSON_HEADERS });
    },
  );
  const origin = `http://127.0.0.1:${server.addr.port}`;
  const ready: StoreaUpstreamReady = {
    store: "storea",
    productionUrl: `${origin}/production`,
    sandboxUrl: `${origin}/sandbox`,
    rootPemPath,
    count: options.count,
    setupMs: performance.now() - started,
  };
  console.log(JSON.stringify(ready));

  await untilSignal();
  await server.shutdown();
}

async function serveStoreb(options: {
  count: number;
  accountFile: string;
  packageName: string;
}): Promise<void> {
  const started = performance.now();
  const account = JSON.parse(await Deno.readTextFile(options.accountFile));
  const play = await startStorebSimulator();
  await play.addServiceAccount({
    clientEmail: account.client_email,
    privateKeyPem: account.private_key,
    privateKeyId: account.private_key_id,
  });
  for (let index = 0; index < options.count; index++) {
    play.addSubscription({
      packageName: options.packageName,
      purchaseToken: upstreamId(STOREB_IDS, index),
      purchase: sampleSubscriptionPurchase(),
    });
  }
  const ready: StorebUpstreamReady = {
    store: "storeb",
    apiUrl: play.apiUrl,
    tokenUrl: play.tokenUrl,
    count: options.count,
    setupMs: performance.now() - started,
  };
  console.log(JSON.stringify(ready));

  await untilSignal();
  await play.close();
}

/**
 * Checks App Store Server API tokens as Apple documents them ("Generating JSON Web Tokens for API
 * requests"). A token string is verified once; its verdict and expiry are kept (a handful of
 * tokens per run, so no eviction).
 */
class TokenChecker {
  #options: StoreaOptions;
  #key: Promise<CryptoKey>;
  #verdicts = new Map<string, Promise<{ ok: boolean; exp: number }>>();

  constructor(options: StoreaOptions, privateKeyPem: string) {
    this.#options = options;
    // The public half is all a verifier needs, derived from the .p8 as the simulator does.
    this.#key = (async () => {
      const privateKey = await importPKCS8(privateKeyPem, "ES256", { extractable: true });
      const { d: _private, ...publicJwk } = await exportJWK(privateKey);
      return await importJWK(publicJwk, "ES256") as CryptoKey;
    })();
  }

  async accepts(authorization: string | null): Promise<boolean> {
    const token = /^Bearer (\S+)$/.exec(authorization ?? "")?.[1];
    if (token === undefined) return false;
    let verdict = this.#verdicts.get(token);
    if (verdict === undefined) {
      verdict = this.#verify(token);
      this.#verdicts.set(token, verdict);
    }
    const { ok, exp } = await verdict;
    return ok && exp > Date.now() / 1000;
  }

  async #verify(token: string): Promise<{ ok: boolean; exp: number }> {
    try {
      const { payload, protectedHeader } = await jwtVerify(token, await this.#key, {
        algorithms: ["ES256"],
        typ: "JWT",
        issuer: this.#options.issuerId,
        audience: "appstoreconnect-v1",
        clockTolerance: 10,
        maxTokenAge: 3600,
      });
      const ok = protectedHeader.kid === this.#options.keyId &&
        payload.bid === this.#options.bundleId &&
        typeof payload.iat === "number" && typeof payload.exp === "number" &&
        payload.exp - payload.iat <= 3600;
      return { ok, exp: payload.exp ?? 0 };
    } catch {
      return { ok: false, exp: 0 };
    }
  }
}

/** Resolves on the first SIGTERM or SIGINT. */
function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    for (const signal of ["SIGTERM", "SIGINT"] as const) {
      Deno.addSignalListener(signal, () => resolve());
    }
  });
}

if (import.meta.main) {
  const { positionals, values } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      dir: { type: "string" },
      count: { type: "string", default: "20000" },
      "key-file": { type: "string" },
      "issuer-id": { type: "string" },
      "key-id": { type: "string" },
      "bundle-id": { type: "string" },
      "account-file": { type: "string" },
      "package-name": { type: "string" },
    },
  });
  const required = (name: keyof typeof values): string => {
    const value = values[name];
    if (typeof value !== "string") throw new Error(`--${name} is required`);
    return value;
  };
  if (positionals[0] === "storea") {
    await serveStorea({
      dir: required("dir"),
      count: Number(required("count")),
      keyFile: required("key-file"),
      issuerId: required("issuer-id"),
      keyId: required("key-id"),
      bundleId: required("bundle-id"),
    });
  } else if (positionals[0] === "storeb") {
    await serveStoreb({
      count: Number(required("count")),
      accountFile: required("account-file"),
      packageName: required("package-name"),
    });
  } else {
    throw new Error(`unknown store ${positionals[0]}: storea or storeb`);
  }
  Deno.exit(0);
}
