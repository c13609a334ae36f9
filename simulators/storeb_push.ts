/**
 * Store B push, simulated for tests, the demo and tenant developers: a fake Google OIDC issuer
 * (a JWKS on loopback and RS256 ID tokens shaped like the ones Cloud Pub/Sub push attaches to
 * its requests), and builders for the push envelope and the Real-time developer notifications it
 * carries.
 *
 * ```ts
 * const issuer = await startPushTokenIssuer();
 * // run the service with issuer.serviceEnv (STOREB_OIDC_CERTS_URL)
 * const token = await issuer.mint({
 *   audience: "https://relay.example.com/v1/webhooks/storeb/tenant_01",
 *   email: "pubsub-push@example-project.iam.gserviceaccount.com",
 * });
 * const body = pushEnvelope(
 *   subscriptionNotification("com.example.app", { notificationType: 4, purchaseToken: "tok" }),
 * );
 * await fetch(receiverUrl, {
 *   method: "POST",
 *   headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
 *   body: JSON.stringify(body),
 * });
 * await issuer.close();
 * ```
 *
 * Like Google, the issuer signs for any `email`: a token for a stranger's service account with
 * the tenant's audience is what someone else's push subscription would carry, and a verifier must
 * refuse it by its `email` alone (docs/configuration.md, "Store B: Google Play Real-time developer
 * notifications").
 *
 * The JWKS runs on `node:http` and closes every connection after its answer: Deno's fetch
 * silently retries a request on a pooled connection that was reset, which would hide a failure.
 *
 * @module
 */
import http from "node:http";
import { answerAndClose, closeServer, listenOnLoopback } from "./loopback_http.ts";
import { exportJWK, generateKeyPair, type JWK, SignJWT } from "jose";

/** Where the simulated issuer publishes its keys, as Google does. */
const CERTS_PATH = "/oauth2/v3/certs";
/** The `iss` of Google's ID tokens. */
const GOOGLE_ISSUER = "https://accounts.google.com";

/** Options of {@linkcode startPushTokenIssuer}. */
export interface PushTokenIssuerOptions {
  /** `Cache-Control` of JWKS answers. Default `public, max-age=3600`. */
  cacheControl?: string;
}

/** The claims of one minted push token; the defaults give a token a verifier accepts. */
export interface PushTokenClaimsInput {
  /** `aud`: the audience configured on the push subscription. */
  audience: string;
  /** `email`: the service account the push subscription authenticates as; any account. */
  email: string;
  /**
   * `email_verified`. Default `true`. A string is signed as given: Google sends the boolean, and
   * a verifier must refuse the string `"true"`.
   */
  emailVerified?: boolean | string;
  /** `iss`. Default `https://accounts.google.com`. */
  issuer?: string;
  /** `exp` - `iat`, in seconds. Default 3600; negative gives a token that has already expired. */
  expiresInSeconds?: number;
  /** `iat`, epoch seconds. Default now. */
  issuedAt?: number;
  /** Sign with a key the JWKS does not publish (unknown kid). */
  unknownKey?: boolean;
  /** Sign with a published kid but a different private key (bad signature). */
  wrongKey?: boolean;
  /** Claims to leave out of the token. */
  omit?: ("email" | "email_verified" | "aud" | "iss" | "exp")[];
}

/** A running fake Google OIDC issuer. */
export interface PushTokenIssuer {
  /** URL of the JWKS (`http://127.0.0.1:PORT/oauth2/v3/certs`), for `STOREB_OIDC_CERTS_URL`. */
  readonly certsUrl: string;
  /** The service's variable that points it at this issuer (`STOREB_OIDC_CERTS_URL`). */
  readonly serviceEnv: Record<string, string>;
  /** The default `iss` of minted tokens: `https://accounts.google.com`. */
  readonly issuer: string;
  /**
   * An RS256 JWT with a `kid`, like Google's push tokens: `aud`, `azp`, `email`,
   * `email_verified`, `exp`, `iat`, `iss`, `sub` (`azp` and `sub` are a numeric id derived from
   * the email, as Google gives each service account one).
   */
  mint(claims: PushTokenClaimsInput): Promise<string>;
  /** Makes a new signing key and kid; from then on the JWKS publishes only the new key. */
  rotateKeys(): Promise<void>;
  /** How many requests the JWKS received, answered or failed. */
  readonly certsRequests: number;
  /** Sets the `Cache-Control` of later JWKS answers; an empty string sends none. */
  setCacheControl(value: string): void;
  /** Answers the next `times` JWKS requests with 503. */
  failJwks(times: number): void;
  /** Stops listening and drops open connections. */
  close(): Promise<void>;
}

/** Starts a fake Google OIDC issuer on 127.0.0.1 on a free port. */
export async function startPushTokenIssuer(
  options: PushTokenIssuerOptions = {},
): Promise<PushTokenIssuer> {
  const issuer = new OidcIssuer(options.cacheControl ?? "public, max-age=3600");
  await issuer.listen();
  return issuer;
}

/** The body Cloud Pub/Sub push POSTs for one message. */
export interface PushEnvelope {
  message: {
    /** Base64 of the developer notification's JSON. */
    data: string;
    messageId: string;
    /** The same id again: Pub/Sub sends both spellings. */
    message_id: string;
    /** RFC 3339 with milliseconds. */
    publishTime: string;
    /** The same time again: Pub/Sub sends both spellings. */
    publish_time: string;
    attributes?: Record<string, string>;
  };
  /** `projects/<project>/subscriptions/<name>`. */
  subscription: string;
}

/** Options of {@linkcode pushEnvelope}. */
export interface PushEnvelopeOptions {
  /** Default: a random numeric id, like Pub/Sub's. */
  messageId?: string;
  /** Default: now. */
  publishTime?: string;
  /** Default: `projects/demo-project/subscriptions/play-rtdn`. */
  subscription?: string;
}

/** Wraps a developer notification (any object) as Pub/Sub push does: base64 JSON in message.data. */
export function pushEnvelope(
  notification: unknown,
  options: PushEnvelopeOptions = {},
): PushEnvelope {
  const messageId = options.messageId ?? randomMessageId();
  const publishTime = options.publishTime ?? new Date().toISOString();
  return {
    message: {
      data: new TextEncoder().encode(JSON.stringify(notification)).toBase64(),
      messageId,
      message_id: messageId,
      publishTime,
      publish_time: publishTime,
    },
    subscription: options.subscription ?? "projects/demo-project/subscriptions/play-rtdn",
  };
}

/** Fields of a {@linkcode subscriptionNotification}. */
export interface SubscriptionNotificationFields {
  /** Google's subscription notification type, 1 (recovered) to 20. */
  notificationType: number;
  purchaseToken: string;
  /** Only sent by Google for older integrations; left out when absent. */
  subscriptionId?: string;
}

/** Fields of a {@linkcode oneTimeProductNotification}. */
export interface OneTimeProductNotificationFields {
  /** 1 purchased, 2 canceled. */
  notificationType: number;
  purchaseToken: string;
  sku: string;
}

/** Fields of a {@linkcode voidedPurchaseNotification}. */
export interface VoidedPurchaseNotificationFields {
  purchaseToken: string;
  orderId: string;
  /** 1 subscription, 2 one-time product. */
  productType: 1 | 2;
  /** 1 full refund, 2 quantity-based partial refund. */
  refundType: 1 | 2;
}

/** A developer notification carrying a `subscriptionNotification`. */
export function subscriptionNotification(
  packageName: string,
  fields: SubscriptionNotificationFields,
): Record<string, unknown> {
  return developerNotification(packageName, "subscriptionNotification", {
    version: "1.0",
    notificationType: fields.notificationType,
    purchaseToken: fields.purchaseToken,
    ...(fields.subscriptionId === undefined ? {} : { subscriptionId: fields.subscriptionId }),
  });
}

/** A developer notification carrying a `oneTimeProductNotification`. */
export function oneTimeProductNotification(
  packageName: string,
  fields: OneTimeProductNotificationFields,
): Record<string, unknown> {
  return developerNotification(packageName, "oneTimeProductNotification", {
    version: "1.0",
    notificationType: fields.notificationType,
    purchaseToken: fields.purchaseToken,
    sku: fields.sku,
  });
}

/** A developer notification carrying a `voidedPurchaseNotification` (it has no version). */
export function voidedPurchaseNotification(
  packageName: string,
  fields: VoidedPurchaseNotificationFields,
): Record<string, unknown> {
  return developerNotification(packageName, "voidedPurchaseNotification", {
    purchaseToken: fields.purchaseToken,
    orderId: fields.orderId,
    productType: fields.productType,
    refundType: fields.refundType,
  });
}

/** The developer notification the Play Console sends with "Send test notification". */
export function testNotification(packageName: string): Record<string, unknown> {
  return developerNotification(packageName, "testNotification", { version: "1.0" });
}

/** The common shape: version, package, event time as a string of milliseconds, one payload. */
function developerNotification(
  packageName: string,
  kind: string,
  payload: Record<string, unknown>,
): Record<string, unknown> {
  return {
    version: "1.0",
    packageName,
    eventTimeMillis: String(Date.now()),
    [kind]: payload,
  };
}

interface SigningKey {
  kid: string;
  privateKey: CryptoKey;
  publicJwk: JWK;
}

class OidcIssuer implements PushTokenIssuer {
  certsUrl = "";
  get serviceEnv(): Record<string, string> {
    return { STOREB_OIDC_CERTS_URL: this.certsUrl };
  }
  readonly issuer = GOOGLE_ISSUER;
  certsRequests = 0;
  #cacheControl: string;
  #failuresLeft = 0;
  #current: SigningKey | null = null;
  /** Signs the `unknownKey` and `wrongKey` tokens; never published. Made on first use. */
  #stray: SigningKey | null = null;
  readonly #server = http.createServer((req, res) => this.#handle(req, res));

  constructor(cacheControl: string) {
    this.#cacheControl = cacheControl;
  }

  async listen(): Promise<void> {
    this.#current = await newSigningKey();
    const port = await listenOnLoopback(this.#server);
    this.certsUrl = `http://127.0.0.1:${port}${CERTS_PATH}`;
  }

  async mint(claims: PushTokenClaimsInput): Promise<string> {
    const current = this.#current!;
    let privateKey = current.privateKey;
    let kid = current.kid;
    if (claims.unknownKey || claims.wrongKey) {
      this.#stray ??= await newSigningKey();
      privateKey = this.#stray.privateKey;
      if (claims.unknownKey) kid = this.#stray.kid;
    }
    const iat = claims.issuedAt ?? Math.floor(Date.now() / 1000);
    const accountId = await numericAccountId(claims.email);
    const payload: Record<string, unknown> = {
      aud: claims.audience,
      azp: accountId,
      email: claims.email,
      email_verified: claims.emailVerified ?? true,
      exp: iat + (claims.expiresInSeconds ?? 3600),
      iat,
      iss: claims.issuer ?? GOOGLE_ISSUER,
      sub: accountId,
    };
    for (const claim of claims.omit ?? []) delete payload[claim];
    return await new SignJWT(payload)
      .setProtectedHeader({ alg: "RS256", kid, typ: "JWT" })
      .sign(privateKey);
  }

  async rotateKeys(): Promise<void> {
    this.#current = await newSigningKey();
  }

  setCacheControl(value: string): void {
    this.#cacheControl = value;
  }

  failJwks(times: number): void {
    this.#failuresLeft = times;
  }

  close(): Promise<void> {
    return closeServer(this.#server);
  }

  #handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const { pathname } = new URL(req.url ?? "/", "http://localhost");
    if (pathname !== CERTS_PATH) {
      send(res, 404, { error: "not_found" });
      return;
    }
    this.certsRequests++;
    if (req.method !== "GET") {
      send(res, 405, { error: "method_not_allowed" });
      return;
    }
    if (this.#failuresLeft > 0) {
      this.#failuresLeft--;
      send(res, 503, { error: "unavailable" });
      return;
    }
    const headers: Record<string, string> = {};
    if (this.#cacheControl !== "") headers["Cache-Control"] = this.#cacheControl;
    send(res, 200, { keys: [this.#current!.publicJwk] }, headers);
  }
}

/** A fresh RSA 2048 key pair with a 40-hex-digit kid, as Google's kids look. */
async function newSigningKey(): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair("RS256", { extractable: true });
  const kid = Array.from(crypto.getRandomValues(new Uint8Array(20)))
    .map((byte) => byte.toString(16).padStart(2, "0")).join("");
  const publicJwk = { ...await exportJWK(publicKey), kid, alg: "RS256", use: "sig" };
  return { kid, privateKey, publicJwk };
}

/** A stable 21-digit id for a service account, shaped like Google's numeric `sub`. */
async function numericAccountId(email: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(email));
  const value = new DataView(digest).getBigUint64(0) % 10n ** 20n;
  return `1${value.toString().padStart(20, "0")}`;
}

/** A Pub/Sub-like message id: 16 digits, no leading zero. */
function randomMessageId(): string {
  const digits = Array.from(crypto.getRandomValues(new Uint8Array(16)), (byte) => byte % 10);
  digits[0] = 1 + (digits[0] % 9);
  return digits.join("");
}

function send(
  res: http.ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const type = { "Content-Type": "application/json; charset=UTF-8", ...headers };
  answerAndClose(res, status, JSON.stringify(body), type);
}
