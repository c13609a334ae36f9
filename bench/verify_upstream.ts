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
 * With `--gateway` (the store gateway benchmark, `bench/gateway.ts`), each also answers the calls
 * of the endpoints beside verify, and counts every call it answers by kind (`GET /bench/counts`,
 * for the bench to check that each request made the calls it should, no more, no fewer):
 *
 * - `storea` also signs a renewal info per transaction at setup, and answers Get All Subscription
 *   Statuses (`GET .../inApps/v1/subscriptions/{id}`: one subscription group whose last
 *   transaction is transaction `id` with its renewal info, status 1), Get Transaction History v2
 *   (`GET .../inApps/v2/history/{id}`: one page, `hasMore` false, of {@linkcode HISTORY_PAGE}
 *   signed transactions, those of `id` and the ids after it) and Send Consumption Information
 *   (`PUT .../inApps/v2/transactions/consumption/{id}`: 202 without a body, as Apple answers).
 * - `storeb` also serves a Play Developer API of its own (`gatewayApiUrl`) beside the simulator,
 *   which stays the token endpoint: the simulator changes a purchase when it is acknowledged or
 *   consumed, so after one pass over the ids every request would find its work done and cost a
 *   read only. This one answers every purchase as a new one, the case the actions exist for: a
 *   subscription not yet acknowledged ({@linkcode STOREB_ACKNOWLEDGE_IDS}), a one-time product
 *   neither acknowledged nor consumed ({@linkcode STOREB_CONSUME_IDS}), and 200 to each
 *   `:acknowledge` and `:consume` without changing anything. It answers verify's tokens
 *   ({@linkcode STOREB_IDS}) with the acknowledged subscription the simulator holds, and accepts
 *   only access tokens the simulator issued.
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
 * Either takes `--gateway` as well.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { exportJWK, importJWK, importPKCS8, jwtVerify } from "jose";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
  type StorebSimulator,
} from "../simulators/storeb_play.ts";

/** What the store A upstream prints once it is ready to be measured against. */
export interface StoreaUpstreamReady {
  store: "storea";
  /** Base URL the service appends `/inApps/v1/...` to. */
  productionUrl: string;
  sandboxUrl: string;
  /** `GET` it for the calls answered so far, by kind ({@linkcode UpstreamCounts}). */
  countsUrl: string;
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
  /** With `--gateway`: the `STOREB_API_URL` of the stateless API described above; else null. */
  gatewayApiUrl: string | null;
  /** With `--gateway`: where the gateway API's counts are read; else null. */
  countsUrl: string | null;
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
/** Store B subscriptions the gateway upstream answers as not yet acknowledged. */
export const STOREB_ACKNOWLEDGE_IDS: IdPattern = { prefix: "benchack", suffix: STOREB_IDS.suffix };
/** Store B one-time products the gateway upstream answers as not yet consumed. */
export const STOREB_CONSUME_IDS: IdPattern = { prefix: "benchuse", suffix: STOREB_IDS.suffix };

/** Signed transactions in each page of history the store A gateway upstream answers. */
export const HISTORY_PAGE = 5;

/** What `GET /bench/counts` of a gateway upstream answers: calls answered, by kind. */
export type UpstreamCounts = Record<string, number>;

/**
 * The `index`-th id of `pattern`. The wrk script of `bench/verify.ts` builds the same strings
 * (`string.format("%09d", index)` between prefix and suffix).
 */
export function upstreamId(pattern: IdPattern, index: number): string {
  return `${pattern.prefix}${String(index).padStart(9, "0")}${pattern.suffix}`;
}

/** Signing jobs kept in flight at once during setup. */
const SIGNING_BATCH = 64;
const STOREA_ROUTES: { kind: string; method: string; path: RegExp }[] = [
  {
    kind: "transaction",
    method: "GET",
    path: /^\/production\/inApps\/v1\/transactions\/([0-9]+)$/,
  },
  {
    kind: "subscriptions",
    method: "GET",
    path: /^\/production\/inApps\/v1\/subscriptions\/([0-9]+)$/,
  },
  { kind: "history", method: "GET", path: /^\/production\/inApps\/v2\/history\/([0-9]+)$/ },
  {
    kind: "consumption",
    method: "PUT",
    path: /^\/production\/inApps\/v2\/transactions\/consumption\/([0-9]+)$/,
  },
];
const COUNTS_PATH = "/bench/counts";
const JSON_HEADERS = { "content-type": "application/json" };
/** Apple's 404 body for an unknown transaction id. */
const NOT_FOUND_BODY = JSON.stringify({
  errorCode: 4040010,
  errorMessage: "Transaction id not found.",
});
/** Apple's 400 body for consumption information sent without the customer's consent. */
const NO_CONSENT_BODY = JSON.stringify({
  errorCode: 4000035,
  errorMessage:
    "Invalid request. The customer consented field is required and must indicate the customer consented.",
});
/** The `appAppleId` of the bench's app in Apple's answers. */
const APP_APPLE_ID = 1234567890;

interface StoreaOptions {
  dir: string;
  count: number;
  keyFile: string;
  issuerId: string;
  keyId: string;
  bundleId: string;
  gateway: boolean;
}

async function serveStorea(options: StoreaOptions): Promise<void> {
  const started = performance.now();
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: options.bundleId });
  // The JWS of each transaction (and, for the gateway, its renewal info), by index.
  const transactions: string[] = [];
  const renewals: string[] = [];
  for (let first = 0; first < options.count; first += SIGNING_BATCH) {
    const last = Math.min(first + SIGNING_BATCH, options.count);
    const batch = [];
    for (let index = first; index < last; index++) {
      const transactionId = upstreamId(STOREA_IDS, index);
      const payload = signer.sampleTransaction({ transactionId, environment: "Production" });
      batch.push(signer.signTransaction(payload).then((jws) => (transactions[index] = jws)));
      if (options.gateway) {
        const renewal = signer.sampleRenewalInfo({
          originalTransactionId: transactionId,
          productId: payload.productId,
          autoRenewProductId: payload.productId,
          environment: "Production",
        });
        batch.push(signer.signRenewalInfo(renewal).then((jws) => (renewals[index] = jws)));
      }
    }
    await Promise.all(batch);
  }
  // Verify's answers, ready to send: Apple's `{ signedTransactionInfo }`.
  const answers = transactions.map((jws) => JSON.stringify({ signedTransactionInfo: jws }));
  const rootPemPath = await writeStoreaRootPem(pki, `${options.dir}/storea-root.pem`);
  const tokens = new TokenChecker(options, await Deno.readTextFile(options.keyFile));
  const counts: UpstreamCounts = {};
  const routes = options.gateway ? STOREA_ROUTES : STOREA_ROUTES.slice(0, 1);

  /** The answer of a call the token was accepted for, about transaction `index`. */
  const answer = async (kind: string, index: number, request: Request): Promise<Response> => {
    const id = upstreamId(STOREA_IDS, index);
    switch (kind) {
      case "transaction":
        return new Response(answers[index], { headers: JSON_HEADERS });
      case "subscriptions":
        // Built per call from strings made at setup: a JWS needs no escaping in JSON.
        return new Response(
          `{"environment":"Production","bundleId":"${options.bundleId}","appAppleId":${APP_APPLE_ID},` +
            `"data":[{"subscriptionGroupIdentifier":"21000001","lastTransactions":[{"status":1,` +
            `"originalTransactionId":"${id}","signedTransactionInfo":"${transactions[index]}",` +
            `"signedRenewalInfo":"${renewals[index]}"}]}]}`,
          { headers: JSON_HEADERS },
        );
      case "history": {
        const page = Array.from(
          { length: HISTORY_PAGE },
          (_, i) => `"${transactions[(index + i) % options.count]}"`,
        );
        return new Response(
          `{"revision":"${id}_${HISTORY_PAGE}","hasMore":false,"bundleId":"${options.bundleId}",` +
            `"appAppleId":${APP_APPLE_ID},"environment":"Production",` +
            `"signedTransactions":[${page.join(",")}]}`,
          { headers: JSON_HEADERS },
        );
      }
      default: {
        let consented = false;
        try {
          consented = JSON.parse(await request.text()).customerConsented === true;
        } catch {
          // not JSON: refused below, as Apple refuses it
        }
        return consented
          ? new Response(null, { status: 202 })
          : new Response(NO_CONSENT_BODY, { status: 400, headers: JSON_HEADERS });
      }
    }
  };

  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    async (request) => {
      const path = new URL(request.url).pathname;
      if (path === COUNTS_PATH) return Response.json(counts);
      let kind: string | undefined;
      let match: RegExpExecArray | null = null;
      for (const route of routes) {
        match = request.method === route.method ? route.path.exec(path) : null;
        if (match !== null) {
          kind = route.kind;
          break;
        }
      }
      const index = match === null ? -1 : indexOf(STOREA_IDS, match[1], options.count);
      if (kind === undefined || index === -1) {
        await request.body?.cancel();
        return new Response(NOT_FOUND_BODY, { status: 404, headers: JSON_HEADERS });
      }
      // Apple answers 401 with an empty body, whatever was wrong with the token.
      if (!await tokens.accepts(request.headers.get("authorization"))) {
        await request.body?.cancel();
        return new Response(null, { status: 401 });
      }
      counts[kind] = (counts[kind] ?? 0) + 1;
      return await answer(kind, index, request);
    },
  );
  const origin = `http://127.0.0.1:${server.addr.port}`;
  const ready: StoreaUpstreamReady = {
    store: "storea",
    productionUrl: `${origin}/production`,
    sandboxUrl: `${origin}/sandbox`,
    countsUrl: `${origin}${COUNTS_PATH}`,
    rootPemPath,
    count: options.count,
    setupMs: performance.now() - started,
  };
  console.log(JSON.stringify(ready));

  await untilSignal();
  await server.shutdown();
}

/** The index of `id` in `pattern` if it is one of the first `count`, else -1. */
function indexOf(pattern: IdPattern, id: string, count: number): number {
  if (!id.startsWith(pattern.prefix) || !id.endsWith(pattern.suffix)) return -1;
  const digits = id.slice(pattern.prefix.length, id.length - pattern.suffix.length);
  if (!/^[0-9]{9}$/.test(digits)) return -1;
  const index = Number(digits);
  return index < count ? index : -1;
}

interface StorebOptions {
  count: number;
  accountFile: string;
  packageName: string;
  gateway: boolean;
}

async function serveStoreb(options: StorebOptions): Promise<void> {
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
  const gateway = options.gateway ? serveStorebGateway(play, options) : null;
  const ready: StorebUpstreamReady = {
    store: "storeb",
    apiUrl: play.apiUrl,
    tokenUrl: play.tokenUrl,
    gatewayApiUrl: gateway?.url ?? null,
    countsUrl: gateway === null ? null : `${gateway.url}${COUNTS_PATH}`,
    count: options.count,
    setupMs: performance.now() - started,
  };
  console.log(JSON.stringify(ready));

  await untilSignal();
  await gateway?.server.shutdown();
  await play.close();
}

const PLAY_PURCHASES = "/androidpublisher/v3/applications/([^/]+)/purchases";
const PLAY_ROUTES: { kind: string; method: string; path: RegExp; ids: IdPattern }[] = [
  {
    kind: "subscription_read",
    method: "GET",
    path: new RegExp(`^${PLAY_PURCHASES}/subscriptionsv2/tokens/([^/]+)$`),
    ids: STOREB_IDS,
  },
  {
    kind: "subscription_read",
    method: "GET",
    path: new RegExp(`^${PLAY_PURCHASES}/subscriptionsv2/tokens/([^/]+)$`),
    ids: STOREB_ACKNOWLEDGE_IDS,
  },
  {
    kind: "subscription_acknowledge",
    method: "POST",
    path: new RegExp(`^${PLAY_PURCHASES}/subscriptions/[^/]+/tokens/([^/]+):acknowledge$`),
    ids: STOREB_ACKNOWLEDGE_IDS,
  },
  {
    kind: "product_read",
    method: "GET",
    path: new RegExp(`^${PLAY_PURCHASES}/products/[^/]+/tokens/([^/]+)$`),
    ids: STOREB_CONSUME_IDS,
  },
  {
    kind: "product_consume",
    method: "POST",
    path: new RegExp(`^${PLAY_PURCHASES}/products/[^/]+/tokens/([^/]+):consume$`),
    ids: STOREB_CONSUME_IDS,
  },
];

/**
 * The stateless Play Developer API described in the module's doc, on a loopback port of its own;
 * the access tokens it accepts are those `play` issued.
 */
function serveStorebGateway(
  play: StorebSimulator,
  options: StorebOptions,
): { server: Deno.HttpServer; url: string } {
  const bodies = new Map<IdPattern, string>([
    [STOREB_IDS, JSON.stringify(sampleSubscriptionPurchase())],
    [
      STOREB_ACKNOWLEDGE_IDS,
      JSON.stringify(
        sampleSubscriptionPurchase({ acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING" }),
      ),
    ],
    [STOREB_CONSUME_IDS, JSON.stringify(sampleProductPurchase({ acknowledgementState: 0 }))],
  ]);
  const notFound = JSON.stringify({
    error: { code: 404, message: "The purchase token was not found.", status: "NOT_FOUND" },
  });
  const unauthenticated = JSON.stringify({
    error: {
      code: 401,
      message: "Request had invalid authentication credentials.",
      status: "UNAUTHENTICATED",
    },
  });
  // Access tokens the simulator issued, read again from it only when an unknown one arrives.
  let issued = new Set<string>();
  const counts: UpstreamCounts = {};
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    async (request) => {
      const path = new URL(request.url).pathname;
      if (path === COUNTS_PATH) return Response.json(counts);
      // Every write the service sends has at most a small JSON body: read it as Google would.
      await request.text();
      const bearer = /^Bearer (\S+)$/.exec(request.headers.get("authorization") ?? "")?.[1];
      if (bearer === undefined || !issued.has(bearer)) {
        issued = new Set(play.issuedAccessTokens);
        if (bearer === undefined || !issued.has(bearer)) {
          return new Response(unauthenticated, { status: 401, headers: JSON_HEADERS });
        }
      }
      for (const route of PLAY_ROUTES) {
        const match = request.method === route.method ? route.path.exec(path) : null;
        if (match === null) continue;
        let segments: string[];
        try {
          segments = [decodeURIComponent(match[1]), decodeURIComponent(match[2])];
        } catch {
          continue;
        }
        const [packageName, token] = segments;
        if (
          packageName !== options.packageName || indexOf(route.ids, token, options.count) === -1
        ) {
          continue;
        }
        counts[route.kind] = (counts[route.kind] ?? 0) + 1;
        return route.method === "GET"
          ? new Response(bodies.get(route.ids), { headers: JSON_HEADERS })
          : new Response(null, { status: 200 });
      }
      return new Response(notFound, { status: 404, headers: JSON_HEADERS });
    },
  );
  return { server, url: `http://127.0.0.1:${server.addr.port}` };
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
      gateway: { type: "boolean", default: false },
    },
  });
  const required = (name: Exclude<keyof typeof values, "gateway">): string => {
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
      gateway: values.gateway,
    });
  } else if (positionals[0] === "storeb") {
    await serveStoreb({
      count: Number(required("count")),
      accountFile: required("account-file"),
      packageName: required("package-name"),
      gateway: values.gateway,
    });
  } else {
    throw new Error(`unknown store ${positionals[0]}: storea or storeb`);
  }
  Deno.exit(0);
}
