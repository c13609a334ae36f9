/**
 * A store B (Google Play) simulator for tests, the demo and tenant developers: Google's OAuth
 * token endpoint for service accounts and the Play Developer API's purchase lookups,
 * acknowledgements, consumptions and list of voided purchases (in pages), served by one
 * `Deno.serve` on loopback.
 *
 * ```ts
 * const play = await startStorebSimulator();
 * const account = await createServiceAccount();
 * await play.addServiceAccount(account);
 * play.addSubscription({
 *   packageName: "com.example.app",
 *   purchaseToken: "tok",
 *   purchase: sampleSubscriptionPurchase(),
 * });
 * // run the service with play.serviceEnv (STOREB_API_URL, STOREB_TOKEN_URL)
 * play.script({ status: 503 }); // the next API call fails once
 * play.script({ operation: "acknowledge", reset: true, applyWrite: true }); // done, answer lost
 * play.calls({ operation: "acknowledge" }).length; // acknowledgements received
 * await play.close();
 * ```
 *
 * The token endpoint checks assertions as Google does (RS256 signature with the account's key,
 * `iss`, `aud` = its own token URL, the androidpublisher scope, a lifetime of at most an hour);
 * the API accepts only access tokens it issued, unexpired and not revoked. Acknowledge and consume
 * change the stored purchase as Google does: a pending purchase (a product's `purchaseState` 2, a
 * subscription's `SUBSCRIPTION_STATE_PENDING`) is refused with 400 `FAILED_PRECONDITION`, and
 * consuming a product acknowledges it too. Google does not document its answer to a repeated
 * acknowledge or consume; the simulator answers 200 and changes nothing.
 */
import { base64url } from "../src/crypto/secrets.ts";
import { decodeJwt, decodeProtectedHeader, importSPKI, jwtVerify } from "jose";
import { createPublicKey } from "node:crypto";

const JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const ANDROIDPUBLISHER_SCOPE = "https://www.googleapis.com/auth/androidpublisher";
/** Google refuses assertions whose `iat` is further in the future than this. */
const CLOCK_SKEW_SECONDS = 60;
const SUBSCRIPTION_PATH =
  /^\/androidpublisher\/v3\/applications\/([^/]+)\/purchases\/subscriptionsv2\/tokens\/([^/]+)$/;
const PRODUCT_PATH =
  /^\/androidpublisher\/v3\/applications\/([^/]+)\/purchases\/products\/([^/]+)\/tokens\/([^/]+)$/;
/** purchases.subscriptions.acknowledge; the subscription id is not checked, as Google allows. */
const SUBSCRIPTION_ACKNOWLEDGE_PATH =
  /^\/androidpublisher\/v3\/applications\/([^/]+)\/purchases\/subscriptions\/([^/]+)\/tokens\/([^/]+):acknowledge$/;
const PRODUCT_WRITE_PATH =
  /^\/androidpublisher\/v3\/applications\/([^/]+)\/purchases\/products\/([^/]+)\/tokens\/([^/]+):(acknowledge|consume)$/;
/** purchases.voidedpurchases.list. */
const VOIDED_PURCHASES_PATH =
  /^\/androidpublisher\/v3\/applications\/([^/]+)\/purchases\/voidedpurchases$/;
/** How far back Google lists voided purchases. */
const VOIDED_DAYS = 30;
const DAY_MS = 86_400_000;
/** Voided purchases per page, by default and at most. */
const VOIDED_MAX_RESULTS = 1000;

/** Google's canonical error status for an HTTP status, as its JSON errors carry it. */
const GOOGLE_STATUS: Record<number, string> = {
  400: "INVALID_ARGUMENT",
  401: "UNAUTHENTICATED",
  403: "PERMISSION_DENIED",
  404: "NOT_FOUND",
  409: "ABORTED",
  429: "RESOURCE_EXHAUSTED",
  500: "INTERNAL",
  501: "NOT_IMPLEMENTED",
  503: "UNAVAILABLE",
  504: "DEADLINE_EXCEEDED",
};

/**
 * Google's SubscriptionPurchaseV2 (purchases.subscriptionsv2.get), the fields the service reads.
 * Any other field may be added; the service forwards the whole object as `rawResponse`.
 */
export interface SubscriptionPurchaseV2 {
  kind?: string;
  regionCode?: string;
  startTime?: string;
  subscriptionState?: string;
  latestOrderId?: string;
  acknowledgementState?: string;
  externalAccountIdentifiers?: { obfuscatedExternalAccountId?: string; [field: string]: unknown };
  lineItems?: SubscriptionLineItem[];
  [field: string]: unknown;
}

/** One line item of a {@linkcode SubscriptionPurchaseV2}. */
export interface SubscriptionLineItem {
  productId?: string;
  expiryTime?: string;
  autoRenewingPlan?: {
    autoRenewEnabled?: boolean;
    /** Google's Money: `units` is an int64 as a string, `nanos` an int32. */
    recurringPrice?: { currencyCode?: string; units?: string; nanos?: number };
    [field: string]: unknown;
  };
  offerDetails?: { basePlanId?: string; offerId?: string; [field: string]: unknown };
  latestSuccessfulOrderId?: string;
  [field: string]: unknown;
}

/** Google's ProductPurchase (purchases.products.get). Any other field may be added. */
export interface ProductPurchase {
  kind?: string;
  purchaseTimeMillis?: string;
  purchaseState?: number;
  consumptionState?: number;
  developerPayload?: string;
  orderId?: string;
  purchaseType?: number;
  acknowledgementState?: number;
  obfuscatedExternalAccountId?: string;
  regionCode?: string;
  [field: string]: unknown;
}

/** A service account the token endpoint knows. Give its public key, or its private key. */
export interface SimulatedServiceAccount {
  clientEmail: string;
  /** SPKI PEM of the account's public key. */
  publicKeyPem?: string;
  /** PKCS#8 PEM of the private key; its public half is used. */
  privateKeyPem?: string;
  /** When set, an assertion whose `kid` differs is refused, as Google does. */
  privateKeyId?: string;
}

/** A subscription purchase to answer for. */
export interface SimulatedSubscription {
  packageName: string;
  purchaseToken: string;
  purchase: SubscriptionPurchaseV2;
}

/** A one-time product purchase to answer for. */
export interface SimulatedProduct {
  packageName: string;
  productId: string;
  purchaseToken: string;
  purchase: ProductPurchase;
}

/**
 * An API call: a lookup (`get`), a write (`acknowledge`, `consume`), or the list of voided
 * purchases (`voided_purchases`).
 */
export type SimulatorOperation = "get" | "acknowledge" | "consume" | "voided_purchases";

/**
 * A voided purchase as purchases.voidedpurchases.list returns it. Any other field may be added;
 * the service forwards the whole object.
 */
export interface VoidedPurchase {
  kind?: string;
  purchaseToken: string;
  /** Epoch milliseconds, as a string (Google's int64). */
  purchaseTimeMillis?: string;
  voidedTimeMillis: string;
  orderId: string;
  /** 0 user, 1 developer, 2 Google. */
  voidedSource?: number;
  /** 0 other, 1 remorse, 2 not received, 3 defective, 4 accidental, 5 fraud, 6 friendly fraud,
   * 7 chargeback, 8 unacknowledged purchase. */
  voidedReason?: number;
  /** Set for a quantity-based partial refund: how many were refunded. */
  voidedQuantity?: number;
  [field: string]: unknown;
}

/** A voided purchase the list answers for a package. */
export interface SimulatedVoidedPurchase {
  packageName: string;
  voidedPurchase: VoidedPurchase;
  /** A subscription's is listed only with `type=1`. Default `product`. */
  type?: "subscription" | "product";
  /**
   * When Google's systems saw it voided, epoch ms: what `startTime` and `endTime` filter on.
   * Default its `voidedTimeMillis`.
   */
  seenAt?: number;
}

/**
 * An answer given instead of (or before) the normal one, for the next `times` matching calls.
 * Scripts are matched in the order they were added.
 */
export interface ScriptedAnswer {
  /** Which endpoint it applies to (default `"api"`). */
  endpoint?: "api" | "token";
  /** Only API calls for this purchase token (default: any call to the endpoint). */
  purchaseToken?: string;
  /** Only API calls of this operation (default: any). */
  operation?: SimulatorOperation;
  /**
   * For a write: carry it out first, then give the scripted answer (status, reset, or the normal
   * answer after `delayMs`), as when Google did the work but its answer was lost. Unset, a
   * scripted status or reset does nothing, and a delay comes before the work.
   */
  applyWrite?: boolean;
  /** The status to answer with; absent: the normal answer, after `delayMs`. */
  status?: number;
  headers?: Record<string, string>;
  /** A JSON body; default: Google's error shape for `status`. */
  body?: unknown;
  /** A body sent as is, instead of `body` (e.g. an HTML error page). */
  rawBody?: string;
  /** Waits this long before answering (even if the caller has hung up meanwhile). */
  delayMs?: number;
  /**
   * Drops the connection instead of answering: status and headers go out, then the connection
   * is cut before the body, as when a proxy resets it. The caller sees a network error.
   */
  reset?: boolean;
  /** How many calls it applies to (default 1; `Infinity` for all). */
  times?: number;
}

/** A call the simulator received. */
export interface SimulatorRequest {
  endpoint: "api" | "token" | "other";
  method: string;
  /** The path as sent (percent-encoded). */
  pathname: string;
  /** What an API call asked for; null for other calls and unknown paths. */
  operation: SimulatorOperation | null;
  /** The decoded purchase token of an API call; null for other calls. */
  purchaseToken: string | null;
  /** The query string as sent, `?` included (empty when none): the voided list's parameters. */
  search: string;
  /** Arrival time, epoch milliseconds. */
  at: number;
}

/** Which calls {@linkcode StorebSimulator.calls} returns; unset fields match any. */
export interface CallFilter {
  operation?: SimulatorOperation;
  purchaseToken?: string;
}

/** Options of {@linkcode startStorebSimulator}. */
export interface StorebSimulatorOptions {
  /** Default 0: any free port. */
  port?: number;
  /** Default `127.0.0.1`. */
  hostname?: string;
  /** `expires_in` of issued access tokens (default 3599, like Google). */
  accessTokenLifetimeSeconds?: number;
}

/** Starts a simulator on loopback. Close it with {@linkcode StorebSimulator.close}. */
export async function startStorebSimulator(
  options: StorebSimulatorOptions = {},
): Promise<StorebSimulator> {
  const simulator = new StorebSimulator(options);
  await simulator.listening;
  return simulator;
}

/** A running store B simulator; made by {@linkcode startStorebSimulator}. */
export class StorebSimulator {
  /** `expires_in` of access tokens issued from now on. */
  accessTokenLifetimeSeconds: number;
  /** Resolves once the server listens. */
  readonly listening: Promise<void>;
  #server: Deno.HttpServer;
  #origin = "";
  #accounts = new Map<string, { key: CryptoKey; keyId: string | null }>();
  #accessTokens = new Map<string, { clientEmail: string; expiresAt: number; revoked: boolean }>();
  #purchases = new Map<string, SubscriptionPurchaseV2 | ProductPurchase>();
  #voided: Required<SimulatedVoidedPurchase>[] = [];
  #scripts: (ScriptedAnswer & { remaining: number })[] = [];
  #requests: SimulatorRequest[] = [];
  #closing = new AbortController();

  /** Use {@linkcode startStorebSimulator}. */
  constructor(options: StorebSimulatorOptions = {}) {
    this.accessTokenLifetimeSeconds = options.accessTokenLifetimeSeconds ?? 3599;
    const { promise, resolve } = Promise.withResolvers<void>();
    this.listening = promise;
    this.#server = Deno.serve({
      port: options.port ?? 0,
      hostname: options.hostname ?? "127.0.0.1",
      onListen: (addr) => {
        this.#origin = `http://${addr.hostname}:${addr.port}`;
        resolve();
      },
      // A scripted reset errors the body stream on purpose; nothing to report.
      onError: () => new Response(null, { status: 500 }),
    }, (request) => this.#handle(request));
  }

  /** Base URL of the Play Developer API (`STOREB_API_URL`). */
  get apiUrl(): string {
    return this.#origin;
  }

  /** URL of the OAuth token endpoint (`STOREB_TOKEN_URL`); also the `aud` it expects. */
  get tokenUrl(): string {
    return `${this.#origin}/token`;
  }

  /** The service's variables that point it at this simulator. */
  get serviceEnv(): Record<string, string> {
    return { STOREB_API_URL: this.apiUrl, STOREB_TOKEN_URL: this.tokenUrl };
  }

  /** Calls received by the token endpoint, answered or not. */
  get tokenRequests(): number {
    return this.#requests.filter((r) => r.endpoint === "token").length;
  }

  /** Calls received by the Play Developer API, answered or not. */
  get apiRequests(): number {
    return this.#requests.filter((r) => r.endpoint === "api").length;
  }

  /** Every call received, oldest first. */
  get requests(): readonly SimulatorRequest[] {
    return this.#requests;
  }

  /**
   * The API calls received that match `filter`, oldest first: `calls({ operation: "acknowledge",
   * purchaseToken })` are the acknowledgements of one purchase, `calls({ purchaseToken })` every
   * call about it (none: the service did not ask the store).
   */
  calls(filter: CallFilter = {}): SimulatorRequest[] {
    return this.#requests.filter((r) =>
      r.endpoint === "api" &&
      (filter.operation === undefined || r.operation === filter.operation) &&
      (filter.purchaseToken === undefined || r.purchaseToken === filter.purchaseToken)
    );
  }

  /** Every access token issued so far (to check that none leaks into logs). */
  get issuedAccessTokens(): string[] {
    return [...this.#accessTokens.keys()];
  }

  /** Lets the token endpoint issue tokens to `account`. */
  async addServiceAccount(account: SimulatedServiceAccount): Promise<void> {
    let spki = account.publicKeyPem;
    if (spki === undefined) {
      if (account.privateKeyPem === undefined) {
        throw new TypeError("a service account needs publicKeyPem or privateKeyPem");
      }
      spki = createPublicKey(account.privateKeyPem).export({ type: "spki", format: "pem" })
        .toString();
    }
    this.#accounts.set(account.clientEmail, {
      key: await importSPKI(spki, "RS256"),
      keyId: account.privateKeyId ?? null,
    });
  }

  /** Answers purchases.subscriptionsv2.get for this package and token with `purchase`. */
  addSubscription(subscription: SimulatedSubscription): void {
    this.#purchases.set(
      subscriptionKey(subscription.packageName, subscription.purchaseToken),
      subscription.purchase,
    );
  }

  /** Answers purchases.products.get for this package, product and token with `purchase`. */
  addProduct(product: SimulatedProduct): void {
    this.#purchases.set(
      productKey(product.packageName, product.productId, product.purchaseToken),
      product.purchase,
    );
  }

  /**
   * Lists a voided purchase for its package (purchases.voidedpurchases.list), as of its `seenAt`.
   * Listing the same order id again replaces it.
   */
  addVoidedPurchase(voided: SimulatedVoidedPurchase): void {
    this.#voided = this.#voided.filter((v) =>
      !(v.packageName === voided.packageName &&
        v.voidedPurchase.orderId === voided.voidedPurchase.orderId)
    );
    this.#voided.push({
      packageName: voided.packageName,
      voidedPurchase: structuredClone(voided.voidedPurchase),
      type: voided.type ?? "product",
      seenAt: voided.seenAt ?? Number(voided.voidedPurchase.voidedTimeMillis),
    });
  }

  /** The subscription purchase held for this package and token, as the API would answer it. */
  subscription(packageName: string, purchaseToken: string): SubscriptionPurchaseV2 | undefined {
    const purchase = this.#purchases.get(subscriptionKey(packageName, purchaseToken));
    return purchase === undefined ? undefined : structuredClone(purchase as SubscriptionPurchaseV2);
  }

  /** The product purchase held for this package, product and token, as the API would answer it. */
  product(
    packageName: string,
    productId: string,
    purchaseToken: string,
  ): ProductPurchase | undefined {
    const purchase = this.#purchases.get(productKey(packageName, productId, purchaseToken));
    return purchase === undefined ? undefined : structuredClone(purchase as ProductPurchase);
  }

  /** Queues an answer for the next matching calls (see {@linkcode ScriptedAnswer}). */
  script(answer: ScriptedAnswer): void {
    this.#scripts.push({ ...answer, remaining: answer.times ?? 1 });
  }

  /** Forgets every script not used up yet. */
  clearScripts(): void {
    this.#scripts = [];
  }

  /** Revokes every access token issued so far: the API answers 401 to them. */
  revokeAccessTokens(): void {
    for (const token of this.#accessTokens.values()) token.revoked = true;
  }

  /** Stops the server; scripted waits in progress end at once. */
  async close(): Promise<void> {
    this.#closing.abort();
    await this.#server.shutdown();
  }

  async #handle(request: Request): Promise<Response> {
    const { pathname, search } = new URL(request.url);
    const endpoint = pathname === "/token"
      ? "token"
      : pathname.startsWith("/androidpublisher/")
      ? "api"
      : "other";
    const call = endpoint === "api" ? apiCallOf(request.method, pathname) : null;
    this.#requests.push({
      endpoint,
      method: request.method,
      pathname,
      operation: call?.operation ?? null,
      purchaseToken: endpoint === "api" ? call?.purchaseToken ?? purchaseTokenOf(pathname) : null,
      search,
      at: Date.now(),
    });
    if (endpoint === "other") return googleError(404, `no such endpoint: ${pathname}`);
    const script = this.#takeScript(endpoint, pathname, call);
    if (script?.applyWrite && call && isWrite(call)) this.#write(call);
    if (script?.delayMs) await this.#wait(script.delayMs);
    if (script?.reset) return droppedConnection();
    if (script?.status !== undefined) return scriptedResponse(endpoint, script);
    if (endpoint === "token") return await this.#token(request);
    if (script?.applyWrite && call && isWrite(call)) {
      // Already done above: the normal answer, without doing it twice.
      await request.body?.cancel();
      return this.#authorized(request) ?? new Response(null, { status: 200 });
    }
    return await this.#api(request, pathname, call);
  }

  #takeScript(
    endpoint: "api" | "token",
    pathname: string,
    call: ApiCall | null,
  ): ScriptedAnswer | undefined {
    const index = this.#scripts.findIndex((s) =>
      (s.endpoint ?? "api") === endpoint &&
      (s.purchaseToken === undefined ||
        (call?.purchaseToken ?? purchaseTokenOf(pathname)) === s.purchaseToken) &&
      (s.operation === undefined || call?.operation === s.operation)
    );
    if (index === -1) return undefined;
    const script = this.#scripts[index];
    if (--script.remaining <= 0) this.#scripts.splice(index, 1);
    return script;
  }

  /** The OAuth token endpoint: the JWT-bearer grant (RFC 7523) as Google runs it. */
  async #token(request: Request): Promise<Response> {
    if (request.method !== "POST") {
      return oauthError(405, "invalid_request", "the token endpoint takes POST");
    }
    const form = new URLSearchParams(await request.text());
    const grantType = form.get("grant_type");
    if (grantType !== JWT_BEARER_GRANT) {
      return oauthError(400, "unsupported_grant_type", `Invalid grant_type: ${grantType ?? ""}`);
    }
    const assertion = form.get("assertion");
    if (!assertion) {
      return oauthError(400, "invalid_request", "Missing required parameter: assertion");
    }
    let header, claims;
    try {
      header = decodeProtectedHeader(assertion);
      claims = decodeJwt(assertion);
    } catch {
      return oauthError(400, "invalid_grant", "Invalid JWT: malformed");
    }
    const account = typeof claims.iss === "string" ? this.#accounts.get(claims.iss) : undefined;
    if (header.alg !== "RS256") return oauthError(400, "invalid_grant", "Invalid JWT: alg");
    if (!account) return oauthError(400, "invalid_grant", "Invalid grant: account not found");
    if (header.kid !== undefined && account.keyId !== null && header.kid !== account.keyId) {
      return oauthError(400, "invalid_grant", "Invalid JWT Signature.");
    }
    try {
      await jwtVerify(assertion, account.key, {
        algorithms: ["RS256"],
        issuer: claims.iss,
        audience: this.tokenUrl,
        requiredClaims: ["iat", "exp"],
      });
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === "ERR_JWS_SIGNATURE_VERIFICATION_FAILED") {
        return oauthError(400, "invalid_grant", "Invalid JWT Signature.");
      }
      if (
        code === "ERR_JWT_CLAIM_VALIDATION_FAILED" && (error as { claim?: string }).claim === "aud"
      ) {
        return oauthError(400, "invalid_grant", "Invalid JWT: Failed audience check.");
      }
      return oauthError(400, "invalid_grant", shortLivedMessage());
    }
    const now = Math.floor(Date.now() / 1000);
    const { iat, exp } = claims as { iat: number; exp: number };
    if (iat > now + CLOCK_SKEW_SECONDS || exp <= now || exp - iat > 3600) {
      return oauthError(400, "invalid_grant", shortLivedMessage());
    }
    const scopes = typeof claims.scope === "string" ? claims.scope.split(" ") : [];
    if (!scopes.includes(ANDROIDPUBLISHER_SCOPE)) {
      return oauthError(400, "invalid_scope", "Invalid oauth scope or ID token audience provided.");
    }
    const accessToken = `ya29.sim_${randomToken()}`;
    this.#accessTokens.set(accessToken, {
      clientEmail: claims.iss as string,
      expiresAt: Date.now() + this.accessTokenLifetimeSeconds * 1000,
      revoked: false,
    });
    return json(200, {
      access_token: accessToken,
      expires_in: this.accessTokenLifetimeSeconds,
      token_type: "Bearer",
    });
  }

  /**
   * The Play Developer API: the two purchase lookups, purchases.subscriptions.acknowledge,
   * purchases.products.acknowledge and purchases.products.consume.
   */
  async #api(request: Request, pathname: string, call: ApiCall | null): Promise<Response> {
    if (!call) {
      await request.body?.cancel();
      return googleError(404, `no such method: ${request.method} ${pathname}`);
    }
    const refused = this.#authorized(request);
    if (refused) {
      await request.body?.cancel();
      return refused;
    }
    if (call.segments === null) return googleError(400, "Invalid Value");
    if (call.operation === "voided_purchases") {
      return this.#voidedPurchases(call.segments[0], new URL(request.url).searchParams);
    }
    if (call.operation === "get") {
      const purchase = this.#purchases.get(call.key!);
      if (!purchase) return googleError(404, "The purchase token was not found.");
      return json(200, purchase);
    }
    // Acknowledge takes an optional JSON object (developerPayload); consume takes no body.
    const body = await request.text();
    if (call.operation === "consume" && body !== "") {
      return googleError(400, "Invalid JSON payload received. The request body must be empty.");
    }
    if (call.operation === "acknowledge" && body !== "") {
      let parsed: unknown;
      try {
        parsed = JSON.parse(body);
      } catch {
        return googleError(400, "Invalid JSON payload received.");
      }
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
        return googleError(400, "Invalid JSON payload received. Expected an object.");
      }
    }
    return this.#write(call);
  }

  /**
   * purchases.voidedpurchases.list: the package's voided purchases seen from `startTime` (at most
   * 30 days ago; older ones are not listed) to `endTime` (not in the future), oldest first; with
   * `type=0` (the default) one-time products only; quantity-based partial refunds only with
   * `includeQuantityBasedPartialRefund=true`; `maxResults` a page (1000 by default and at most),
   * and a `token` for the next page, which carries the first page's query (the times are then
   * ignored, as Google does).
   */
  #voidedPurchases(packageName: string, params: URLSearchParams): Response {
    const now = Date.now();
    const digits = (name: string) => {
      const value = params.get(name);
      return value === null ? undefined : /^\d{1,16}$/.test(value) ? Number(value) : NaN;
    };
    let query: VoidedQuery;
    let offset = 0;
    const token = params.get("token");
    const maxResults = digits("maxResults") ?? VOIDED_MAX_RESULTS;
    if (Number.isNaN(maxResults) || maxResults < 1) {
      return googleError(400, "Invalid value for maxResults");
    }
    if (token !== null) {
      const read = readVoidedToken(token);
      if (read === null || read.query.packageName !== packageName) {
        return googleError(400, "Invalid pagination token.");
      }
      ({ query, offset } = read);
    } else {
      const startTime = digits("startTime") ?? now - VOIDED_DAYS * DAY_MS;
      const endTime = digits("endTime") ?? now;
      const type = params.get("type") ?? "0";
      const partial = params.get("includeQuantityBasedPartialRefund") ?? "false";
      if (Number.isNaN(startTime) || Number.isNaN(endTime)) {
        return googleError(400, "startTime and endTime are milliseconds since the epoch");
      }
      if (endTime > now) return googleError(400, "endTime cannot be in the future.");
      if (startTime > endTime) return googleError(400, "startTime is after endTime.");
      if (type !== "0" && type !== "1") return googleError(400, "Invalid value for type");
      if (partial !== "true" && partial !== "false") {
        return googleError(400, "Invalid value for includeQuantityBasedPartialRefund");
      }
      query = {
        packageName,
        startTime: Math.max(startTime, now - VOIDED_DAYS * DAY_MS),
        endTime,
        subscriptions: type === "1",
        partial: partial === "true",
      };
    }
    const matching = this.#voided
      .filter((v) =>
        v.packageName === query.packageName && v.seenAt >= query.startTime &&
        v.seenAt <= query.endTime && (query.subscriptions || v.type === "product") &&
        (query.partial || v.voidedPurchase.voidedQuantity === undefined)
      )
      .sort((a, b) =>
        a.seenAt - b.seenAt || a.voidedPurchase.orderId.localeCompare(b.voidedPurchase.orderId)
      );
    const page = matching.slice(offset, offset + Math.min(maxResults, VOIDED_MAX_RESULTS));
    const next = offset + page.length;
    return json(200, {
      pageInfo: { totalResults: matching.length, resultPerPage: page.length, startIndex: offset },
      ...(next < matching.length
        ? { tokenPagination: { nextPageToken: writeVoidedToken(query, next) } }
        : {}),
      // Google leaves an empty list out.
      ...(page.length > 0 ? { voidedPurchases: page.map((v) => v.voidedPurchase) } : {}),
    });
  }

  /** Carries out a write on the purchase it names, and answers as Google does. */
  #write(call: ApiCall): Response {
    const purchase = call.key === null ? undefined : this.#purchases.get(call.key);
    if (!purchase) return googleError(404, "The purchase token was not found.");
    if (call.type === "subscription") {
      const subscription = purchase as SubscriptionPurchaseV2;
      if (subscription.subscriptionState === "SUBSCRIPTION_STATE_PENDING") {
        return googleError(400, "The subscription purchase is pending.", {}, "FAILED_PRECONDITION");
      }
      this.#purchases.set(call.key!, {
        ...subscription,
        acknowledgementState: "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED",
      });
      return new Response(null, { status: 200 });
    }
    const product = purchase as ProductPurchase;
    if (product.purchaseState === 2) {
      return googleError(400, "The product purchase is pending.", {}, "FAILED_PRECONDITION");
    }
    this.#purchases.set(
      call.key!,
      call.operation === "consume"
        ? { ...product, consumptionState: 1, acknowledgementState: 1 }
        : { ...product, acknowledgementState: 1 },
    );
    return new Response(null, { status: 200 });
  }

  /** A 401 for a request without a live access token this simulator issued; else null. */
  #authorized(request: Request): Response | null {
    const bearer = /^Bearer (\S+)$/i.exec(request.headers.get("authorization") ?? "")?.[1];
    const issued = bearer === undefined ? undefined : this.#accessTokens.get(bearer);
    if (issued && !issued.revoked && issued.expiresAt > Date.now()) return null;
    return googleError(
      401,
      "Request had invalid authentication credentials. Expected OAuth 2 access token, login " +
        "cookie or other valid authentication credential.",
      {
        "www-authenticate": 'Bearer realm="https://accounts.google.com/", error="invalid_token"',
      },
    );
  }

  /** Sleeps `ms`, waking early when the simulator closes. */
  #wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#closing.signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#closing.signal.addEventListener("abort", done);
    });
  }
}

/**
 * A realistic SubscriptionPurchaseV2: an active, acknowledged, auto-renewing monthly plan at
 * USD 9.99 that started a day ago. `overrides` replace top-level fields.
 */
export function sampleSubscriptionPurchase(
  overrides: SubscriptionPurchaseV2 = {},
): SubscriptionPurchaseV2 {
  const now = Date.now();
  return {
    kind: "androidpublisher#subscriptionPurchaseV2",
    regionCode: "US",
    startTime: new Date(now - 86_400_000).toISOString(),
    subscriptionState: "SUBSCRIPTION_STATE_ACTIVE",
    latestOrderId: "GPA.3372-4150-9088-12345",
    acknowledgementState: "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED",
    externalAccountIdentifiers: {
      obfuscatedExternalAccountId: "3f1c2a9e-7b4d-4e21-9a5f-0c8e6d2b1a47",
    },
    lineItems: [{
      productId: "premium_monthly",
      expiryTime: new Date(now + 29 * 86_400_000).toISOString(),
      autoRenewingPlan: {
        autoRenewEnabled: true,
        recurringPrice: { currencyCode: "USD", units: "9", nanos: 990_000_000 },
      },
      offerDetails: { basePlanId: "monthly" },
      latestSuccessfulOrderId: "GPA.3372-4150-9088-12345",
    }],
    ...overrides,
  };
}

/**
 * A realistic ProductPurchase: a purchased, acknowledged, not yet consumed test purchase made a
 * minute ago. `overrides` replace top-level fields.
 */
export function sampleProductPurchase(overrides: ProductPurchase = {}): ProductPurchase {
  return {
    kind: "androidpublisher#productPurchase",
    purchaseTimeMillis: String(Date.now() - 60_000),
    purchaseState: 0,
    consumptionState: 0,
    developerPayload: "",
    orderId: "GPA.3301-2954-7711-54321",
    purchaseType: 0,
    acknowledgementState: 1,
    obfuscatedExternalAccountId: "8d0e4b52-16a3-4c7f-b9e1-5a2f3c6d7e80",
    regionCode: "US",
    ...overrides,
  };
}

function subscriptionKey(packageName: string, purchaseToken: string): string {
  return JSON.stringify(["subscription", packageName, purchaseToken]);
}

function productKey(packageName: string, productId: string, purchaseToken: string): string {
  return JSON.stringify(["product", packageName, productId, purchaseToken]);
}

/**
 * A realistic voided purchase: a one-time product bought two days ago and refunded at the user's
 * request an hour ago. `overrides` replace top-level fields.
 */
export function sampleVoidedPurchase(overrides: Partial<VoidedPurchase> = {}): VoidedPurchase {
  const now = Date.now();
  return {
    kind: "androidpublisher#voidedPurchase",
    purchaseToken: `voided.${randomToken()}`,
    purchaseTimeMillis: String(now - 2 * DAY_MS),
    voidedTimeMillis: String(now - 60 * 60_000),
    orderId: `GPA.${Math.floor(1000 + Math.random() * 9000)}-${
      Math.floor(1000 + Math.random() * 9000)
    }-${Math.floor(1000 + Math.random() * 9000)}-${Math.floor(10000 + Math.random() * 90000)}`,
    voidedSource: 0,
    voidedReason: 1,
    ...overrides,
  };
}

/** The query of a voided purchases list, which its page tokens carry. */
interface VoidedQuery {
  packageName: string;
  startTime: number;
  endTime: number;
  subscriptions: boolean;
  partial: boolean;
}

function writeVoidedToken(query: VoidedQuery, offset: number): string {
  return base64url(new TextEncoder().encode(JSON.stringify({ query, offset })));
}

function readVoidedToken(token: string): { query: VoidedQuery; offset: number } | null {
  try {
    const bytes = Uint8Array.fromBase64(token, { alphabet: "base64url" });
    const parsed = JSON.parse(new TextDecoder().decode(bytes));
    if (!Number.isInteger(parsed?.offset) || parsed.offset < 0) return null;
    const query = parsed.query;
    if (
      typeof query?.packageName !== "string" || !Number.isFinite(query.startTime) ||
      !Number.isFinite(query.endTime)
    ) return null;
    return { query, offset: parsed.offset };
  } catch {
    return null;
  }
}

function isWrite(call: ApiCall): boolean {
  return call.operation === "acknowledge" || call.operation === "consume";
}

/** A recognized API call: what it asks, about which purchase. */
interface ApiCall {
  operation: SimulatorOperation;
  type: "subscription" | "product";
  /** The decoded path segments (package, then product for a product, then token). */
  segments: string[] | null;
  /** The stored purchase's key; null when a segment does not decode. */
  key: string | null;
  purchaseToken: string | null;
}

/** What `method` on `pathname` asks of the API, or null for no method of the API. */
function apiCallOf(method: string, pathname: string): ApiCall | null {
  let operation: SimulatorOperation;
  let type: ApiCall["type"];
  let raw: string[];
  let match;
  if (method === "GET" && (match = pathname.match(SUBSCRIPTION_PATH))) {
    [operation, type, raw] = ["get", "subscription", [match[1], match[2]]];
  } else if (method === "GET" && (match = pathname.match(PRODUCT_PATH))) {
    [operation, type, raw] = ["get", "product", [match[1], match[2], match[3]]];
  } else if (method === "POST" && (match = pathname.match(SUBSCRIPTION_ACKNOWLEDGE_PATH))) {
    // The subscription id (match[2]) is not part of the purchase's key.
    [operation, type, raw] = ["acknowledge", "subscription", [match[1], match[3]]];
  } else if (method === "POST" && (match = pathname.match(PRODUCT_WRITE_PATH))) {
    operation = match[4] as "acknowledge" | "consume";
    [type, raw] = ["product", [match[1], match[2], match[3]]];
  } else if (method === "GET" && (match = pathname.match(VOIDED_PURCHASES_PATH))) {
    let packageName: string | null;
    try {
      packageName = decodeURIComponent(match[1]);
    } catch {
      packageName = null;
    }
    return {
      operation: "voided_purchases",
      type: "product",
      segments: packageName === null ? null : [packageName],
      key: null,
      purchaseToken: null,
    };
  } else {
    return null;
  }
  let segments: string[] | null;
  try {
    segments = raw.map(decodeURIComponent);
  } catch {
    segments = null;
  }
  const key = segments === null
    ? null
    : type === "subscription"
    ? subscriptionKey(segments[0], segments[1])
    : productKey(segments[0], segments[1], segments[2]);
  return { operation, type, segments, key, purchaseToken: segments?.at(-1) ?? null };
}

/** The decoded purchase token of an API path, whatever the method, or null. */
function purchaseTokenOf(pathname: string): string | null {
  const call = apiCallOf("POST", pathname) ?? apiCallOf("GET", pathname);
  return call?.purchaseToken ?? null;
}

function scriptedResponse(endpoint: "api" | "token", script: ScriptedAnswer): Response {
  const status = script.status!;
  if (script.rawBody !== undefined) {
    return new Response(script.rawBody, { status, headers: script.headers });
  }
  const body = script.body ??
    (endpoint === "token"
      ? { error: status === 400 ? "invalid_grant" : "internal_failure" }
      : googleErrorBody(status, "scripted answer"));
  return json(status, body, script.headers);
}

/** A response whose body stream fails: Deno then cuts the connection. */
function droppedConnection(): Response {
  const body = new ReadableStream({
    start(controller) {
      controller.error(new DOMException("scripted connection reset", "AbortError"));
    },
  });
  return new Response(body, { status: 200, headers: { "content-type": "application/json" } });
}

function googleErrorBody(
  status: number,
  message: string,
  googleStatus = GOOGLE_STATUS[status],
): Record<string, unknown> {
  const error: Record<string, unknown> = { code: status, message };
  if (googleStatus) error.status = googleStatus;
  return { error };
}

function googleError(
  status: number,
  message: string,
  headers?: Record<string, string>,
  googleStatus?: string,
): Response {
  return json(status, googleErrorBody(status, message, googleStatus), headers);
}

function oauthError(status: number, error: string, description: string): Response {
  return json(status, { error, error_description: description });
}

function shortLivedMessage(): string {
  return "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable " +
    "timeframe. Check your iat and exp values in the JWT claim.";
}

function json(status: number, body: unknown, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json; charset=UTF-8", ...headers },
  });
}

function randomToken(): string {
  return base64url(crypto.getRandomValues(new Uint8Array(32)));
}
