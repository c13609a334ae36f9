/**
 * A fake App Store Server API (Get Transaction Info) on loopback, for tests, the demo and
 * tenant developers. It checks the bearer JWT as Apple does, answers from registered
 * transactions, and can be scripted to fail the way Apple fails: 429 with a Retry-After in
 * epoch milliseconds, 5xx, slow answers, and connections closed without an answer.
 *
 * It runs on `node:http` rather than `Deno.serve`: only a Node socket can be destroyed
 * before any byte of an answer is written, which a connection-reset test needs.
 *
 * @module
 */
import http from "node:http";
import {
  answerAndClose,
  clientGone,
  closeServer,
  listenOnLoopback,
  sleepUnlessAborted,
} from "./loopback_http.ts";
import {
  compactVerify,
  decodeProtectedHeader,
  exportJWK,
  importJWK,
  importPKCS8,
  importSPKI,
} from "jose";
import type {
  StoreaEnvironmentName,
  StoreaSigner,
  StoreaTransactionPayload,
} from "./storea_signer.ts";

/** One of the two App Store Server API environments, as the service names them. */
export type StoreaApiEnvironment = "production" | "sandbox";

/** Error bodies exactly as the App Store Server API sends them. */
export const STOREA_API_ERRORS = {
  invalidTransactionId: { errorCode: 4000006, errorMessage: "Invalid transaction id." },
  transactionIdNotFound: { errorCode: 4040010, errorMessage: "Transaction id not found." },
  rateLimitExceeded: { errorCode: 4290000, errorMessage: "Rate limit exceeded." },
  generalInternal: { errorCode: 5000000, errorMessage: "An unknown error occurred." },
  generalInternalRetryable: {
    errorCode: 5000001,
    errorMessage: "An unknown error occurred. Please try again.",
  },
} as const;

/** Audience every App Store Server API token must carry. */
export const STOREA_API_AUDIENCE = "appstoreconnect-v1";

/** An App Store Connect API key the simulator accepts tokens from. */
export interface StoreaApiKeyRegistration {
  /** The token's `iss`. */
  issuerId: string;
  /** The token header's `kid`. */
  keyId: string;
  /** The token's `bid`. */
  bundleId: string;
  /** The public key: a `CryptoKey` of type `public`, or an SPKI PEM. */
  publicKey?: CryptoKey | string;
  /** Or the `.p8` private key PEM (PKCS#8), whose public half is derived. */
  privateKeyPem?: string;
}

/**
 * An answer to script for the next call(s) of one environment. With `status`, that answer
 * is sent; without it the call is answered normally (after `delayMs`, for a slow upstream).
 */
export interface StoreaScriptedAnswer {
  /** HTTP status to answer. */
  status?: number;
  /** Body: an object is sent as JSON, a string as is; none means an empty body. */
  body?: unknown;
  /** Extra response headers, e.g. `Retry-After`. */
  headers?: Record<string, string>;
  /** Wait this long before answering (or resetting). */
  delayMs?: number;
  /** Close the connection without sending a single byte: the client's fetch rejects. */
  reset?: boolean;
  /** How many calls this answer applies to. Default 1. */
  times?: number;
}

/** One call the simulator received. */
export interface StoreaApiRequestRecord {
  environment: StoreaApiEnvironment;
  transactionId: string;
  /** Status answered; `null` when no answer was sent (scripted reset, or the client left). */
  status: number | null;
  /** Why the bearer token was refused, when it was (status 401). */
  authFailure?: string;
  /** Arrival time, epoch milliseconds. */
  at: number;
}

/** Options of {@link startStoreaApiSimulator}. */
export interface StoreaApiSimulatorOptions {
  /** Signs the `signedTransactionInfo` of every answer. */
  signer: StoreaSigner;
  /** Answer 401 to every production call, as Apple does for apps never released. */
  productionUnauthorized?: boolean;
  /** How far in the future a token's `iat` may be. Default 10 seconds. */
  clockToleranceSeconds?: number;
}

/** A running fake App Store Server API. */
export interface StoreaApiSimulator {
  /** Base URL of production (`http://127.0.0.1:PORT/production`); the service appends `/inApps/v1/...`. */
  readonly productionUrl: string;
  /** Base URL of sandbox (`http://127.0.0.1:PORT/sandbox`). */
  readonly sandboxUrl: string;
  /** The service's variables that point it at this simulator (both environments). */
  readonly serviceEnv: Record<string, string>;
  /** Every call received, in the order they were answered (or dropped). Tests may clear it. */
  readonly requests: StoreaApiRequestRecord[];
  /** Number of distinct bearer tokens presented so far, accepted or not. */
  readonly tokensSeen: number;
  /** Answer 401 to every production call while true. */
  productionUnauthorized: boolean;
  /** Registers an API key whose tokens are accepted. */
  addKey(key: StoreaApiKeyRegistration): Promise<void>;
  /**
   * Stores a transaction answered for its `transactionId` in `environment` as
   * `{ signedTransactionInfo }`. The payload's `environment` is set to match; the id must
   * be numeric, as Apple's are. Transactions are not scoped by bundle id, so a test can
   * make the service see a transaction of another bundle. Returns the signed JWS.
   */
  addTransaction(
    environment: StoreaApiEnvironment,
    payload: StoreaTransactionPayload,
  ): Promise<string>;
  /** Queues an answer for the next call(s) to `environment`, after earlier queued ones. */
  script(environment: StoreaApiEnvironment, answer: StoreaScriptedAnswer): void;
  /** Drops the answers still queued for `environment`, or for both when omitted. */
  clearScripts(environment?: StoreaApiEnvironment): void;
  /** Stops listening, drops open connections and cuts scripted delays short. */
  close(): Promise<void>;
}

/**
 * Starts the simulator on 127.0.0.1 on a free port.
 *
 * @example
 * ```ts
 * const api = await startStoreaApiSimulator({ signer });
 * await api.addKey({ issuerId, keyId: "ABC123DEFG", bundleId: "com.example.app", privateKeyPem });
 * await api.addTransaction("sandbox", signer.sampleTransaction({ transactionId: "2000000000000001" }));
 * api.script("production", storeaRateLimitedAnswer());
 * // configure the service with api.serviceEnv (STOREA_API_URL_PRODUCTION, ..._SANDBOX)
 * await api.close();
 * ```
 */
export async function startStoreaApiSimulator(
  options: StoreaApiSimulatorOptions,
): Promise<StoreaApiSimulator> {
  const simulator = new ApiSimulator(options);
  await simulator.listen();
  return simulator;
}

/**
 * A scripted 429 as Apple sends it: `Retry-After` is a UNIX time in milliseconds (not the
 * RFC 7231 seconds), body `{"errorCode":4290000,...}`.
 */
export function storeaRateLimitedAnswer(
  options: { retryAt?: number; times?: number } = {},
): StoreaScriptedAnswer {
  const retryAt = options.retryAt ?? Date.now() + 1000;
  return {
    status: 429,
    headers: { "Retry-After": String(retryAt) },
    body: STOREA_API_ERRORS.rateLimitExceeded,
    times: options.times,
  };
}

const TRANSACTION_PATH = /^\/(production|sandbox)\/inApps\/v1\/transactions\/([^/?#]+)$/;
const MAX_TOKEN_LIFETIME_SECONDS = 3600;

interface RegisteredKey {
  issuerId: string;
  bundleId: string;
  publicKey: CryptoKey;
}

interface Answer {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
}

class ApiSimulator implements StoreaApiSimulator {
  productionUrl = "";
  sandboxUrl = "";
  get serviceEnv(): Record<string, string> {
    return {
      STOREA_API_URL_PRODUCTION: this.productionUrl,
      STOREA_API_URL_SANDBOX: this.sandboxUrl,
    };
  }
  readonly requests: StoreaApiRequestRecord[] = [];
  productionUnauthorized: boolean;
  readonly #signer: StoreaSigner;
  readonly #toleranceSeconds: number;
  readonly #keys = new Map<string, RegisteredKey>();
  readonly #transactions = {
    production: new Map<string, string>(),
    sandbox: new Map<string, string>(),
  };
  readonly #scripts: Record<StoreaApiEnvironment, StoreaScriptedAnswer[]> = {
    production: [],
    sandbox: [],
  };
  readonly #tokens = new Set<string>();
  readonly #server = http.createServer((req, res) => {
    this.#handle(req, res).catch((error) => {
      // A bug here must not hang the client: answer 500 with no body.
      console.error("storea api simulator:", error);
      if (!res.headersSent) res.writeHead(500).end();
    });
  });

  constructor(options: StoreaApiSimulatorOptions) {
    this.#signer = options.signer;
    this.#toleranceSeconds = options.clockToleranceSeconds ?? 10;
    this.productionUnauthorized = options.productionUnauthorized ?? false;
  }

  get tokensSeen(): number {
    return this.#tokens.size;
  }

  async listen(): Promise<void> {
    const port = await listenOnLoopback(this.#server);
    this.productionUrl = `http://127.0.0.1:${port}/production`;
    this.sandboxUrl = `http://127.0.0.1:${port}/sandbox`;
  }

  async addKey(key: StoreaApiKeyRegistration): Promise<void> {
    this.#keys.set(key.keyId, {
      issuerId: key.issuerId,
      bundleId: key.bundleId,
      publicKey: await publicKeyOf(key),
    });
  }

  async addTransaction(
    environment: StoreaApiEnvironment,
    payload: StoreaTransactionPayload,
  ): Promise<string> {
    if (!/^\d+$/.test(payload.transactionId)) {
      throw new TypeError(
        `transactionId must be numeric, as Apple's are: ${payload.transactionId}`,
      );
    }
    const environmentName: StoreaEnvironmentName = environment === "production"
      ? "Production"
      : "Sandbox";
    const jws = await this.#signer.signTransaction({ ...payload, environment: environmentName });
    this.#transactions[environment].set(payload.transactionId, jws);
    return jws;
  }

  script(environment: StoreaApiEnvironment, answer: StoreaScriptedAnswer): void {
    this.#scripts[environment].push({ ...answer, times: answer.times ?? 1 });
  }

  clearScripts(environment?: StoreaApiEnvironment): void {
    for (const name of environment ? [environment] : (["production", "sandbox"] as const)) {
      this.#scripts[name].length = 0;
    }
  }

  close(): Promise<void> {
    return closeServer(this.#server);
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const at = Date.now();
    const match = TRANSACTION_PATH.exec(new URL(req.url ?? "/", "http://localhost").pathname);
    if (!match) {
      send(res, { status: 404 });
      return;
    }
    const environment = match[1] as StoreaApiEnvironment;
    const transactionId = decodeURIComponent(match[2]);
    const record = (status: number | null, authFailure?: string) => {
      this.requests.push({
        environment,
        transactionId,
        status,
        at,
        ...(authFailure ? { authFailure } : {}),
      });
    };
    if (req.method !== "GET") {
      record(405);
      send(res, { status: 405 });
      return;
    }

    const authFailure = await this.#authenticate(req.headers.authorization);
    // Apple answers 401 with an empty body, whatever was wrong with the token.
    if (authFailure !== null) {
      record(401, authFailure);
      send(res, { status: 401 });
      return;
    }
    if (environment === "production" && this.productionUnauthorized) {
      record(401);
      send(res, { status: 401 });
      return;
    }

    const scripted = this.#nextScripted(environment);
    if (scripted?.delayMs) {
      // close() destroys every connection, so this also cuts delays short on close.
      const completed = await sleepUnlessAborted(scripted.delayMs, clientGone(res));
      if (!completed) {
        record(null);
        res.destroy();
        return;
      }
    }
    if (scripted?.reset) {
      record(null);
      req.socket.destroy();
      return;
    }
    const answer = scripted?.status !== undefined
      ? { status: scripted.status, body: scripted.body, headers: scripted.headers }
      : this.#lookup(environment, transactionId);
    record(answer.status);
    send(res, answer);
  }

  #lookup(environment: StoreaApiEnvironment, transactionId: string): Answer {
    const signedTransactionInfo = this.#transactions[environment].get(transactionId);
    if (signedTransactionInfo !== undefined) {
      return { status: 200, body: { signedTransactionInfo } };
    }
    if (!/^\d+$/.test(transactionId)) {
      return { status: 400, body: STOREA_API_ERRORS.invalidTransactionId };
    }
    return { status: 404, body: STOREA_API_ERRORS.transactionIdNotFound };
  }

  #nextScripted(environment: StoreaApiEnvironment): StoreaScriptedAnswer | undefined {
    const queue = this.#scripts[environment];
    const next = queue[0];
    if (next === undefined) return undefined;
    next.times = (next.times ?? 1) - 1;
    if (next.times <= 0) queue.shift();
    return next;
  }

  /**
   * Checks the token as Apple documents it ("Generating JSON Web Tokens for API requests"):
   * ES256, typ JWT, a known kid; iss, aud, bid of that key; iat not in the future; exp in
   * the future and at most 60 minutes after iat. Returns why it is refused, or null.
   */
  async #authenticate(authorization: string | undefined): Promise<string | null> {
    const token = /^Bearer (\S+)$/.exec(authorization ?? "")?.[1];
    if (token === undefined) return "missing bearer token";
    this.#tokens.add(token);

    let header;
    try {
      header = decodeProtectedHeader(token);
    } catch {
      return "malformed token";
    }
    if (header.alg !== "ES256") return `alg ${header.alg} is not ES256`;
    if (header.typ !== "JWT") return `typ ${header.typ} is not JWT`;
    const key = typeof header.kid === "string" ? this.#keys.get(header.kid) : undefined;
    if (key === undefined) return `unknown kid ${header.kid}`;

    let claims: Record<string, unknown>;
    try {
      const { payload } = await compactVerify(token, key.publicKey, { algorithms: ["ES256"] });
      claims = JSON.parse(new TextDecoder().decode(payload));
    } catch {
      return "signature does not verify with the key of kid";
    }
    const now = Math.floor(Date.now() / 1000);
    const { iss, aud, bid, iat, exp } = claims;
    if (iss !== key.issuerId) return `iss ${iss} is not the key's issuer`;
    if (aud !== STOREA_API_AUDIENCE) return `aud ${aud} is not ${STOREA_API_AUDIENCE}`;
    if (bid !== key.bundleId) return `bid ${bid} is not the key's bundle`;
    if (typeof iat !== "number" || typeof exp !== "number") return "iat or exp missing";
    if (iat > now + this.#toleranceSeconds) return "iat is in the future";
    if (exp <= now) return "token expired";
    if (exp - iat > MAX_TOKEN_LIFETIME_SECONDS) return "exp is more than 60 minutes after iat";
    return null;
  }
}

/** The public key of a registration, from whichever form it was given in. */
async function publicKeyOf(key: StoreaApiKeyRegistration): Promise<CryptoKey> {
  if (key.publicKey instanceof CryptoKey) {
    if (key.publicKey.type !== "public") throw new TypeError("publicKey must be a public key");
    return key.publicKey;
  }
  if (typeof key.publicKey === "string") return await importSPKI(key.publicKey, "ES256");
  if (key.privateKeyPem !== undefined) {
    const privateKey = await importPKCS8(key.privateKeyPem, "ES256", { extractable: true });
    const { d: _private, ...publicJwk } = await exportJWK(privateKey);
    return await importJWK(publicJwk, "ES256") as CryptoKey;
  }
  throw new TypeError("addKey needs publicKey or privateKeyPem");
}

function send(res: http.ServerResponse, answer: Answer): void {
  const body = answer.body === undefined
    ? ""
    : typeof answer.body === "string"
    ? answer.body
    : JSON.stringify(answer.body);
  answerAndClose(res, answer.status, body, answer.headers);
}
