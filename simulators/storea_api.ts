/**
 * A fake App Store Server API on loopback, for tests, the demo and tenant developers: Get
 * Transaction Info, Get All Subscription Statuses, Get Transaction History (v2, in pages), Send
 * Consumption Information (v2), Request a Test Notification (which really posts a signed TEST
 * notification to the app's notification URL), Get Test Notification Status, and Get Notification
 * History: every notification it posted ({@linkcode StoreaApiSimulator.sendNotification}, test
 * notifications included) or was told it failed to deliver
 * ({@linkcode StoreaApiSimulator.recordNotification}), with its send attempts. It checks the
 * bearer JWT as Apple does, answers from registered transactions, validates what it is sent as
 * Apple documents it, and can be scripted to fail the way Apple fails: 429 with a Retry-After in
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
  decodeJwt,
  decodeProtectedHeader,
  exportJWK,
  importJWK,
  importPKCS8,
  importSPKI,
} from "jose";
import type {
  StoreaEnvironmentName,
  StoreaRenewalInfoPayload,
  StoreaSigner,
  StoreaTransactionPayload,
} from "./storea_signer.ts";

/** One of the two App Store Server API environments, as the service names them. */
export type StoreaApiEnvironment = "production" | "sandbox";

/** The calls the simulator answers. */
export type StoreaApiOperation =
  /** `GET /inApps/v1/transactions/{transactionId}` (Get Transaction Info). */
  | "transaction"
  /** `GET /inApps/v1/subscriptions/{transactionId}` (Get All Subscription Statuses). */
  | "subscriptions"
  /** `GET /inApps/v2/history/{transactionId}` (Get Transaction History v2). */
  | "history"
  /** `PUT /inApps/v2/transactions/consumption/{transactionId}` (Send Consumption Information). */
  | "consumption"
  /** `POST /inApps/v1/notifications/test` (Request a Test Notification). */
  | "test_notification"
  /** `GET /inApps/v1/notifications/test/{testNotificationToken}` (Get Test Notification Status). */
  | "test_notification_status"
  /** `POST /inApps/v1/notifications/history` (Get Notification History). */
  | "notification_history";

/** Error bodies exactly as the App Store Server API sends them. */
export const STOREA_API_ERRORS = {
  generalBadRequest: { errorCode: 4000000, errorMessage: "Invalid request." },
  invalidRequestRevision: { errorCode: 4000005, errorMessage: "Invalid request revision." },
  invalidTransactionId: { errorCode: 4000006, errorMessage: "Invalid transaction id." },
  startDateAfterEndDate: {
    errorCode: 4000013,
    errorMessage:
      "Invalid request. The end date precedes the start date or the dates are the same.",
  },
  invalidStartDate: {
    errorCode: 4000015,
    errorMessage: "Invalid request. The start date is invalid.",
  },
  invalidEndDate: { errorCode: 4000016, errorMessage: "Invalid request. The end date is invalid." },
  invalidSort: {
    errorCode: 4000021,
    errorMessage: "Invalid request. The sort parameter is invalid.",
  },
  invalidProductType: {
    errorCode: 4000022,
    errorMessage: "Invalid request. The product type parameter is invalid.",
  },
  invalidInAppOwnershipType: {
    errorCode: 4000026,
    errorMessage: "Invalid request. The in-app ownership type parameter is invalid.",
  },
  invalidRevoked: {
    errorCode: 4000030,
    errorMessage: "Invalid request. The revoked parameter is invalid.",
  },
  invalidStatus: {
    errorCode: 4000031,
    errorMessage: "Invalid request. The status parameter is invalid.",
  },
  invalidCustomerConsented: {
    errorCode: 4000035,
    errorMessage:
      "Invalid request. The customer consented field is required and must indicate the customer consented.",
  },
  invalidDeliveryStatus: {
    errorCode: 4000036,
    errorMessage: "Invalid request. The delivery status field is invalid.",
  },
  invalidSampleContentProvided: {
    errorCode: 4000041,
    errorMessage: "Invalid request. The sample content provided field is invalid.",
  },
  invalidRefundPreference: {
    errorCode: 4000044,
    errorMessage: "Invalid request. The refund preference field is invalid.",
  },
  consumptionPercentageAutoRenewableSubscription: {
    errorCode: 4000209,
    errorMessage:
      "Invalid request. The consumption percentage field is not supported for auto-renewable subscription transactions.",
  },
  /**
   * Apple names this error (ConsumptionPercentageOutOfRangeError) without a code this simulator
   * knows: it answers the general bad-request code.
   */
  consumptionPercentageOutOfRange: {
    errorCode: 4000000,
    errorMessage: "Invalid request. The consumption percentage is out of range.",
  },
  /** Likewise (UndeliveredConsumptionPercentageNonZeroError). */
  undeliveredConsumptionPercentageNonZero: {
    errorCode: 4000000,
    errorMessage:
      "Invalid request. The consumption percentage must be zero for the provided delivery status.",
  },
  startDateTooFarInPast: {
    errorCode: 4000012,
    errorMessage: "Invalid request. The start date is earlier than the allowed start date.",
  },
  invalidPaginationToken: {
    errorCode: 4000014,
    errorMessage: "Invalid request. The pagination token is invalid.",
  },
  paginationTokenExpired: {
    errorCode: 4000017,
    errorMessage: "Invalid request. The pagination token is expired.",
  },
  invalidNotificationType: {
    errorCode: 4000018,
    errorMessage: "Invalid request. The notification type or subtype is invalid.",
  },
  multipleFiltersSupplied: {
    errorCode: 4000019,
    errorMessage:
      "Invalid request. Supply either a transaction id or a notification type, but not both.",
  },
  transactionIdNotFound: { errorCode: 4040010, errorMessage: "Transaction id not found." },
  serverNotificationUrlNotFound: {
    errorCode: 4040007,
    errorMessage:
      "No App Store Server Notification URL found for provided app. Check that a URL is configured in App Store Connect for this environment.",
  },
  testNotificationNotFound: {
    errorCode: 4040008,
    errorMessage:
      "Either the test notification token is expired or the notification and status are not yet available.",
  },
  rateLimitExceeded: { errorCode: 4290000, errorMessage: "Rate limit exceeded." },
  generalInternal: { errorCode: 5000000, errorMessage: "An unknown error occurred." },
  generalInternalRetryable: {
    errorCode: 5000001,
    errorMessage: "An unknown error occurred. Please try again.",
  },
} as const;

/** Audience every App Store Server API token must carry. */
export const STOREA_API_AUDIENCE = "appstoreconnect-v1";

/** Transactions per page of Get Transaction History, as Apple sends them. */
export const STOREA_HISTORY_PAGE_SIZE = 20;
/** Records per page of Get Notification History, as Apple sends them. */
export const STOREA_NOTIFICATION_HISTORY_PAGE_SIZE = 20;
/** How far back Get Notification History reaches: 180 days in production, 30 in sandbox. */
export const STOREA_NOTIFICATION_HISTORY_DAYS = { production: 180, sandbox: 30 } as const;

/**
 * What the App Store met when it posted a notification (Apple's `sendAttemptResult`): `SUCCESS`
 * for a 2xx answer, else the failure.
 */
export type StoreaSendAttemptResult =
  | "SUCCESS"
  | "TIMED_OUT"
  | "TLS_ISSUE"
  | "CIRCULAR_REDIRECT"
  | "NO_RESPONSE"
  | "SOCKET_ISSUE"
  | "UNSUPPORTED_CHARSET"
  | "INVALID_RESPONSE"
  | "PREMATURE_CLOSE"
  | "UNSUCCESSFUL_HTTP_RESPONSE_CODE"
  | "OTHER";

/** One attempt to post a notification, as Get Test Notification Status lists it. */
export interface StoreaSendAttempt {
  /** Epoch milliseconds. */
  attemptDate: number;
  sendAttemptResult: StoreaSendAttemptResult;
}

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
 * Where the App Store posts an app's notifications (App Store Connect's "App Store Server
 * Notifications" URLs, one per environment).
 */
export interface StoreaNotificationUrl {
  bundleId: string;
  /** The URL; null removes it. */
  url: string | null;
  /** Default: both environments. */
  environment?: StoreaApiEnvironment;
  /** `data.appAppleId` of what is posted in production; none when absent. */
  appAppleId?: number;
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
  /** Only calls of this operation take it; by default the next call of any. */
  operation?: StoreaApiOperation;
}

/** One call the simulator received. */
export interface StoreaApiRequestRecord {
  environment: StoreaApiEnvironment;
  operation: StoreaApiOperation;
  method: string;
  /** The transaction id of the path; the token for test notification status, else "". */
  transactionId: string;
  /** The query parameters in order (a name may repeat). */
  query: [string, string][];
  /** Status answered; `null` when no answer was sent (scripted reset, or the client left). */
  status: number | null;
  /** Why the bearer token was refused, when it was (status 401). */
  authFailure?: string;
  /** The JSON body of a notification history request, as sent. */
  body?: Record<string, unknown>;
  /** Arrival time, epoch milliseconds. */
  at: number;
  /** When the answer was sent (or the call dropped), epoch milliseconds. */
  answeredAt: number;
}

/** Consumption information the simulator accepted (answered 202). */
export interface StoreaConsumptionRecord {
  environment: StoreaApiEnvironment;
  transactionId: string;
  /** The ConsumptionRequest as sent. */
  body: Record<string, unknown>;
  at: number;
}

/** A notification the simulator posted, and what came of it. */
export interface StoreaSentNotification {
  environment: StoreaApiEnvironment;
  url: string;
  notificationUUID: string;
  signedPayload: string;
  attempt: StoreaSendAttempt;
  /** The receiver's HTTP status, or null when none came. */
  responseStatus: number | null;
}

/** A notification in the App Store's notification history, with its attempts so far. */
export interface StoreaHistoryRecord {
  environment: StoreaApiEnvironment;
  bundleId: string;
  notificationUUID: string;
  /** `notificationType` and `subtype`, for the history's filters. */
  notificationType: string;
  subtype: string | null;
  /** The original transaction id of the notification's transaction, if any. */
  originalTransactionId: string | null;
  /** When the history dates it (its `signedDate`), epoch milliseconds. */
  date: number;
  signedPayload: string;
  /** Every attempt to post it, oldest first (Apple lists at most six). */
  sendAttempts: StoreaSendAttempt[];
}

/** What a subscription's status lookup answers for one original transaction. */
export interface StoreaSubscriptionState {
  /** `1` active, `2` expired, `3` billing retry, `4` grace period, `5` revoked. */
  status?: number;
  /**
   * The renewal info to sign, or null to send none. Absent: one made to match the status and the
   * latest transaction.
   */
  renewalInfo?: StoreaRenewalInfoPayload | null;
}

/** Options of {@link startStoreaApiSimulator}. */
export interface StoreaApiSimulatorOptions {
  /** Signs the `signedTransactionInfo` of every answer. */
  signer: StoreaSigner;
  /** Answer 401 to every production call, as Apple does for apps never released. */
  productionUnauthorized?: boolean;
  /** How far in the future a token's `iat` may be. Default 10 seconds. */
  clockToleranceSeconds?: number;
  /** Where each app's notifications are posted; see {@link StoreaApiSimulator.setNotificationUrl}. */
  notificationUrls?: StoreaNotificationUrl[];
  /** How long a posted notification may take to be answered. Default 5 seconds. */
  notificationTimeoutMs?: number;
  /** Transactions per history page. Default {@link STOREA_HISTORY_PAGE_SIZE}. */
  historyPageSize?: number;
  /**
   * Records per notification history page. Default
   * {@link STOREA_NOTIFICATION_HISTORY_PAGE_SIZE}.
   */
  notificationHistoryPageSize?: number;
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
  /** Consumption information accepted, in order. Tests may clear it. */
  readonly consumptionRequests: StoreaConsumptionRecord[];
  /** Notifications posted, in order, once each attempt ended. Tests may clear it. */
  readonly sentNotifications: StoreaSentNotification[];
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
   *
   * `customer` names the App Store account it belongs to: subscription statuses and history
   * answer every transaction of the customer of the transaction asked about. Default: its
   * `originalTransactionId`, one customer per purchase.
   */
  addTransaction(
    environment: StoreaApiEnvironment,
    payload: StoreaTransactionPayload,
    options?: { customer?: string },
  ): Promise<string>;
  /**
   * Sets what Get All Subscription Statuses answers for an original transaction: its status and
   * renewal info. Without it the status follows the latest transaction (revoked, expired or
   * active) and a renewal info is made to match. Returns the signed renewal info, or null.
   */
  setSubscriptionState(
    environment: StoreaApiEnvironment,
    originalTransactionId: string,
    state: StoreaSubscriptionState,
  ): Promise<string | null>;
  /** Sets (or, with `url: null`, removes) where an app's notifications are posted. */
  setNotificationUrl(config: StoreaNotificationUrl): void;
  /**
   * Every notification the App Store posted or tried to, oldest first, as Get Notification
   * History lists them (one record per notification, with all its attempts). Tests may clear it.
   */
  readonly notificationHistory: StoreaHistoryRecord[];
  /**
   * Posts a signed notification to its app's notification URL for its environment (both read from
   * the payload), once, as the App Store does, and keeps it in the notification history with the
   * attempt: `SUCCESS` for a 2xx answer, else what failed (`TIMED_OUT`, `NO_RESPONSE`...). Without
   * a URL for the app, the attempt is `NO_RESPONSE` and nothing is posted. Sending the same
   * notification again adds an attempt, as Apple's retries do.
   */
  sendNotification(signedPayload: string): Promise<StoreaSendAttempt>;
  /**
   * Keeps a notification in the history as if the App Store had tried to post it and failed,
   * without posting anything: a notification lost on the way. Default: one `TIMED_OUT` attempt
   * now. Returns the record.
   */
  recordNotification(
    signedPayload: string,
    options?: { sendAttempts?: StoreaSendAttempt[] },
  ): StoreaHistoryRecord;
  /** Queues an answer for the next call(s) to `environment`, after earlier queued ones. */
  script(environment: StoreaApiEnvironment, answer: StoreaScriptedAnswer): void;
  /** Drops the answers still queued for `environment`, or for both when omitted. */
  clearScripts(environment?: StoreaApiEnvironment): void;
  /** Stops listening, drops open connections, cuts scripted delays short and stops posting. */
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
 * api.setNotificationUrl({ bundleId: "com.example.app", url: `${serviceUrl}/v1/webhooks/storea/${tenantId}` });
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
  options: { retryAt?: number; times?: number; operation?: StoreaApiOperation } = {},
): StoreaScriptedAnswer {
  const retryAt = options.retryAt ?? Date.now() + 1000;
  return {
    status: 429,
    headers: { "Retry-After": String(retryAt) },
    body: STOREA_API_ERRORS.rateLimitExceeded,
    times: options.times,
    operation: options.operation,
  };
}

const ROUTES: { pattern: RegExp; method: string; operation: StoreaApiOperation }[] = [
  {
    pattern: /^\/(production|sandbox)\/inApps\/v1\/transactions\/([^/?#]+)$/,
    method: "GET",
    operation: "transaction",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v1\/subscriptions\/([^/?#]+)$/,
    method: "GET",
    operation: "subscriptions",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v2\/history\/([^/?#]+)$/,
    method: "GET",
    operation: "history",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v2\/transactions\/consumption\/([^/?#]+)$/,
    method: "PUT",
    operation: "consumption",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v1\/notifications\/test()$/,
    method: "POST",
    operation: "test_notification",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v1\/notifications\/test\/([^/?#]+)$/,
    method: "GET",
    operation: "test_notification_status",
  },
  {
    pattern: /^\/(production|sandbox)\/inApps\/v1\/notifications\/history()$/,
    method: "POST",
    operation: "notification_history",
  },
];
const MAX_TOKEN_LIFETIME_SECONDS = 3600;
const MAX_REQUEST_BODY_BYTES = 64 * 1024;
const DAY_MS = 86_400_000;
const PRODUCT_TYPES: Record<string, string> = {
  AUTO_RENEWABLE: "Auto-Renewable Subscription",
  NON_RENEWABLE: "Non-Renewing Subscription",
  CONSUMABLE: "Consumable",
  NON_CONSUMABLE: "Non-Consumable",
};
const DELIVERY_STATUSES = [
  "DELIVERED",
  "UNDELIVERED_QUALITY_ISSUE",
  "UNDELIVERED_WRONG_ITEM",
  "UNDELIVERED_SERVER_OUTAGE",
  "UNDELIVERED_OTHER",
];
const REFUND_PREFERENCES = ["DECLINE", "GRANT_FULL", "GRANT_PRORATED"];

interface RegisteredKey {
  issuerId: string;
  bundleId: string;
  publicKey: CryptoKey;
}

interface StoredTransaction {
  payload: StoreaTransactionPayload;
  jws: string;
  customer: string;
}

interface StoredState {
  status?: number;
  /** The signed renewal info, null for none, undefined to make one. */
  signedRenewalInfo?: string | null;
}

interface TestNotification {
  environment: StoreaApiEnvironment;
  bundleId: string;
  signedPayload: string;
  sendAttempts: StoreaSendAttempt[];
}

/** What the history keeps of a notification, read from its (unverified) payload. */
interface NotificationFacts {
  environment: StoreaApiEnvironment;
  bundleId: string;
  notificationUUID: string;
  notificationType: string;
  subtype: string | null;
  originalTransactionId: string | null;
  date: number;
}

interface Answer {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
}

/** A call, authenticated: what every operation gets. */
interface Call {
  environment: StoreaApiEnvironment;
  /** The path's id (transaction id or token), decoded. */
  id: string;
  query: URLSearchParams;
  /** The token's `bid`. */
  bundleId: string;
  body: string;
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
  readonly consumptionRequests: StoreaConsumptionRecord[] = [];
  readonly sentNotifications: StoreaSentNotification[] = [];
  readonly notificationHistory: StoreaHistoryRecord[] = [];
  productionUnauthorized: boolean;
  readonly #signer: StoreaSigner;
  readonly #toleranceSeconds: number;
  readonly #notificationTimeoutMs: number;
  readonly #historyPageSize: number;
  readonly #notificationHistoryPageSize: number;
  readonly #keys = new Map<string, RegisteredKey>();
  readonly #transactions = {
    production: new Map<string, StoredTransaction>(),
    sandbox: new Map<string, StoredTransaction>(),
  };
  readonly #states = {
    production: new Map<string, StoredState>(),
    sandbox: new Map<string, StoredState>(),
  };
  /** Notification URLs by environment, then bundle id. */
  readonly #notificationUrls = {
    production: new Map<string, { url: string; appAppleId?: number }>(),
    sandbox: new Map<string, { url: string; appAppleId?: number }>(),
  };
  readonly #testNotifications = new Map<string, TestNotification>();
  readonly #posting = new Set<Promise<void>>();
  readonly #closing = new AbortController();
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
    this.#notificationTimeoutMs = options.notificationTimeoutMs ?? 5_000;
    this.#historyPageSize = options.historyPageSize ?? STOREA_HISTORY_PAGE_SIZE;
    this.#notificationHistoryPageSize = options.notificationHistoryPageSize ??
      STOREA_NOTIFICATION_HISTORY_PAGE_SIZE;
    this.productionUnauthorized = options.productionUnauthorized ?? false;
    for (const config of options.notificationUrls ?? []) this.setNotificationUrl(config);
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
    options: { customer?: string } = {},
  ): Promise<string> {
    if (!/^\d+$/.test(payload.transactionId)) {
      throw new TypeError(
        `transactionId must be numeric, as Apple's are: ${payload.transactionId}`,
      );
    }
    const signed = { ...payload, environment: environmentName(environment) };
    const jws = await this.#signer.signTransaction(signed);
    this.#transactions[environment].set(payload.transactionId, {
      payload: signed,
      jws,
      customer: options.customer ?? payload.originalTransactionId,
    });
    return jws;
  }

  async setSubscriptionState(
    environment: StoreaApiEnvironment,
    originalTransactionId: string,
    state: StoreaSubscriptionState,
  ): Promise<string | null> {
    const signedRenewalInfo = state.renewalInfo === undefined
      ? undefined
      : state.renewalInfo === null
      ? null
      : await this.#signer.signRenewalInfo({
        ...state.renewalInfo,
        environment: environmentName(environment),
      });
    this.#states[environment].set(originalTransactionId, {
      status: state.status,
      signedRenewalInfo,
    });
    return signedRenewalInfo ?? null;
  }

  setNotificationUrl(config: StoreaNotificationUrl): void {
    const environments = config.environment
      ? [config.environment]
      : (["production", "sandbox"] as const);
    for (const environment of environments) {
      if (config.url === null) this.#notificationUrls[environment].delete(config.bundleId);
      else {
        this.#notificationUrls[environment].set(config.bundleId, {
          url: config.url,
          appAppleId: config.appAppleId,
        });
      }
    }
  }

  async sendNotification(signedPayload: string): Promise<StoreaSendAttempt> {
    const facts = notificationFacts(signedPayload);
    const target = this.#notificationUrls[facts.environment].get(facts.bundleId);
    if (target === undefined) {
      throw new TypeError(
        `no notification URL for ${facts.bundleId} in ${facts.environment}: setNotificationUrl first`,
      );
    }
    const record = this.#historyRecord(facts, signedPayload);
    const posting = this.#post(
      facts.environment,
      target.url,
      facts.notificationUUID,
      signedPayload,
    );
    const tracked = posting.then(() => {});
    this.#posting.add(tracked);
    tracked.finally(() => this.#posting.delete(tracked));
    const attempt = await posting;
    record.sendAttempts.push(attempt);
    return attempt;
  }

  recordNotification(
    signedPayload: string,
    options: { sendAttempts?: StoreaSendAttempt[] } = {},
  ): StoreaHistoryRecord {
    const record = this.#historyRecord(notificationFacts(signedPayload), signedPayload);
    record.sendAttempts.push(
      ...(options.sendAttempts ?? [{ attemptDate: Date.now(), sendAttemptResult: "TIMED_OUT" }]),
    );
    return record;
  }

  /** The history's record of a notification, made on its first attempt. */
  #historyRecord(facts: NotificationFacts, signedPayload: string): StoreaHistoryRecord {
    const known = this.notificationHistory.find((record) =>
      record.notificationUUID === facts.notificationUUID &&
      record.environment === facts.environment
    );
    if (known !== undefined) return known;
    const record = { ...facts, signedPayload, sendAttempts: [] };
    this.notificationHistory.push(record);
    return record;
  }

  script(environment: StoreaApiEnvironment, answer: StoreaScriptedAnswer): void {
    this.#scripts[environment].push({ ...answer, times: answer.times ?? 1 });
  }

  clearScripts(environment?: StoreaApiEnvironment): void {
    for (const name of environment ? [environment] : (["production", "sandbox"] as const)) {
      this.#scripts[name].length = 0;
    }
  }

  async close(): Promise<void> {
    this.#closing.abort();
    await Promise.allSettled([...this.#posting]);
    await closeServer(this.#server);
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const at = Date.now();
    const url = new URL(req.url ?? "/", "http://localhost");
    const route = ROUTES.map((r) => ({ ...r, match: r.pattern.exec(url.pathname) }))
      .find((r) => r.match !== null);
    if (!route) {
      send(res, { status: 404 });
      return;
    }
    const environment = route.match![1] as StoreaApiEnvironment;
    const id = decodeURIComponent(route.match![2]);
    const query = [...url.searchParams.entries()];
    let sentBody: Record<string, unknown> | undefined;
    const record = (status: number | null, authFailure?: string) => {
      this.requests.push({
        environment,
        operation: route.operation,
        method: req.method ?? "",
        transactionId: id,
        query,
        status,
        at,
        answeredAt: Date.now(),
        ...(authFailure ? { authFailure } : {}),
        ...(sentBody ? { body: sentBody } : {}),
      });
    };
    if (req.method !== route.method) {
      record(405);
      send(res, { status: 405 });
      return;
    }

    const auth = await this.#authenticate(req.headers.authorization);
    // Apple answers 401 with an empty body, whatever was wrong with the token.
    if ("failure" in auth) {
      record(401, auth.failure);
      send(res, { status: 401 });
      return;
    }
    if (environment === "production" && this.productionUnauthorized) {
      record(401);
      send(res, { status: 401 });
      return;
    }
    const body = await readBody(req);
    if (body === null) {
      record(413);
      send(res, { status: 413 });
      return;
    }
    if (route.operation === "notification_history") sentBody = parseJsonObject(body) ?? undefined;

    const scripted = this.#nextScripted(environment, route.operation);
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
    const call: Call = { environment, id, query: url.searchParams, bundleId: auth.bundleId, body };
    const answer = scripted?.status !== undefined
      ? { status: scripted.status, body: scripted.body, headers: scripted.headers }
      : await this.#answer(route.operation, call);
    record(answer.status);
    send(res, answer);
  }

  #answer(operation: StoreaApiOperation, call: Call): Answer | Promise<Answer> {
    switch (operation) {
      case "transaction":
        return this.#lookup(call);
      case "subscriptions":
        return this.#subscriptions(call);
      case "history":
        return this.#history(call);
      case "consumption":
        return this.#consumption(call);
      case "test_notification":
        return this.#requestTestNotification(call);
      case "test_notification_status":
        return this.#testNotificationStatus(call);
      case "notification_history":
        return this.#notificationHistoryPage(call);
    }
  }

  /**
   * Get Notification History: the app's notifications of the environment dated in
   * [startDate, endDate) (an endDate in the future is now), oldest first, checked and filtered as
   * Apple documents it (`onlyFailures`: those never answered 2xx; `transactionId`: the customer's;
   * `notificationType` and `notificationSubtype`), in pages with a pagination token made for the
   * same request body.
   */
  #notificationHistoryPage(call: Call): Answer {
    const errors = STOREA_API_ERRORS;
    const request = parseJsonObject(call.body);
    if (request === null) return { status: 400, body: errors.generalBadRequest };
    const { startDate, endDate, onlyFailures, transactionId, notificationType } = request;
    const subtype = request.notificationSubtype;
    if (!Number.isSafeInteger(startDate) || (startDate as number) < 0) {
      return { status: 400, body: errors.invalidStartDate };
    }
    if (!Number.isSafeInteger(endDate) || (endDate as number) < 0) {
      return { status: 400, body: errors.invalidEndDate };
    }
    const start = startDate as number;
    const end = endDate as number;
    if (start >= end) return { status: 400, body: errors.startDateAfterEndDate };
    const now = Date.now();
    if (start < now - STOREA_NOTIFICATION_HISTORY_DAYS[call.environment] * DAY_MS) {
      return { status: 400, body: errors.startDateTooFarInPast };
    }
    if (onlyFailures !== undefined && typeof onlyFailures !== "boolean") {
      return { status: 400, body: errors.generalBadRequest };
    }
    if (transactionId !== undefined && notificationType !== undefined) {
      return { status: 400, body: errors.multipleFiltersSupplied };
    }
    if (
      (notificationType !== undefined && typeof notificationType !== "string") ||
      (subtype !== undefined && (typeof subtype !== "string" || notificationType === undefined))
    ) return { status: 400, body: errors.invalidNotificationType };
    let customer: Set<string> | null = null;
    if (transactionId !== undefined) {
      if (typeof transactionId !== "string") {
        return { status: 400, body: errors.invalidTransactionId };
      }
      const found = this.#find({ ...call, id: transactionId });
      if ("status" in found) return found;
      customer = new Set(
        this.#customerTransactions(call.environment, found).map((t) =>
          t.payload.originalTransactionId
        ),
      );
    }
    const fingerprint = JSON.stringify([
      start,
      end,
      onlyFailures ?? null,
      transactionId ?? null,
      notificationType ?? null,
      subtype ?? null,
    ]);
    let offset = 0;
    const token = call.query.get("paginationToken");
    if (token !== null) {
      const position = readRevision(token, fingerprint);
      if (position === null) return { status: 400, body: errors.invalidPaginationToken };
      offset = position;
    }
    const until = Math.min(end, now);
    const matching = this.notificationHistory
      .filter((record) =>
        record.environment === call.environment && record.bundleId === call.bundleId &&
        record.date >= start && record.date < until &&
        (onlyFailures !== true ||
          !record.sendAttempts.some((attempt) => attempt.sendAttemptResult === "SUCCESS")) &&
        (notificationType === undefined || record.notificationType === notificationType) &&
        (subtype === undefined || record.subtype === subtype) &&
        (customer === null ||
          (record.originalTransactionId !== null && customer.has(record.originalTransactionId)))
      )
      .sort((a, b) => a.date - b.date || a.notificationUUID.localeCompare(b.notificationUUID));
    const page = matching.slice(offset, offset + this.#notificationHistoryPageSize);
    const next = offset + page.length;
    return {
      status: 200,
      body: {
        notificationHistory: page.map((record) => ({
          signedPayload: record.signedPayload,
          // Apple lists at most six attempts of a notification.
          sendAttempts: record.sendAttempts.slice(-6),
        })),
        hasMore: next < matching.length,
        paginationToken: writeRevision(next, fingerprint),
      },
    };
  }

  #lookup(call: Call): Answer {
    const found = this.#find(call);
    if ("status" in found) return found;
    return { status: 200, body: { signedTransactionInfo: found.jws } };
  }

  /** The transaction of the path, or Apple's 400 or 404 answer. */
  #find(call: Call): StoredTransaction | Answer {
    const stored = this.#transactions[call.environment].get(call.id);
    if (stored !== undefined) return stored;
    if (!/^\d+$/.test(call.id)) {
      return { status: 400, body: STOREA_API_ERRORS.invalidTransactionId };
    }
    return { status: 404, body: STOREA_API_ERRORS.transactionIdNotFound };
  }

  /** Every transaction of the customer of `stored`, in `environment`. */
  #customerTransactions(
    environment: StoreaApiEnvironment,
    stored: StoredTransaction,
  ): StoredTransaction[] {
    return [...this.#transactions[environment].values()].filter((t) =>
      t.customer === stored.customer
    );
  }

  /**
   * Get All Subscription Statuses: the latest transaction of each original transaction of each
   * auto-renewable subscription of the customer, grouped by subscription group, with its status
   * and signed renewal info. `status` query parameters (1 to 5, repeatable) filter.
   */
  async #subscriptions(call: Call): Promise<Answer> {
    const found = this.#find(call);
    if ("status" in found) return found;
    const wanted = call.query.getAll("status");
    if (wanted.some((s) => !/^[1-5]$/.test(s))) {
      return { status: 400, body: STOREA_API_ERRORS.invalidStatus };
    }
    const latest = new Map<string, StoredTransaction>();
    for (const t of this.#customerTransactions(call.environment, found)) {
      if (t.payload.type !== "Auto-Renewable Subscription") continue;
      const current = latest.get(t.payload.originalTransactionId);
      if (current === undefined || t.payload.purchaseDate > current.payload.purchaseDate) {
        latest.set(t.payload.originalTransactionId, t);
      }
    }
    const groups = new Map<string, Record<string, unknown>[]>();
    for (const [originalTransactionId, t] of latest) {
      const { status, signedRenewalInfo } = await this.#stateOf(
        call.environment,
        originalTransactionId,
        t,
      );
      if (wanted.length > 0 && !wanted.includes(String(status))) continue;
      const group = t.payload.subscriptionGroupIdentifier ?? "";
      const items = groups.get(group) ?? [];
      items.push({
        status,
        originalTransactionId,
        signedTransactionInfo: t.jws,
        ...(signedRenewalInfo === null ? {} : { signedRenewalInfo }),
      });
      groups.set(group, items);
    }
    return {
      status: 200,
      body: {
        environment: environmentName(call.environment),
        bundleId: call.bundleId,
        ...this.#appAppleIdOf(call),
        data: [...groups].map(([subscriptionGroupIdentifier, lastTransactions]) => ({
          subscriptionGroupIdentifier,
          lastTransactions,
        })),
      },
    };
  }

  /** The status and signed renewal info of an original transaction whose latest is `latest`. */
  async #stateOf(
    environment: StoreaApiEnvironment,
    originalTransactionId: string,
    latest: StoredTransaction,
  ): Promise<{ status: number; signedRenewalInfo: string | null }> {
    const states = this.#states[environment];
    const state = states.get(originalTransactionId) ?? {};
    const payload = latest.payload;
    const status = state.status ??
      (payload.revocationDate !== undefined
        ? 5
        : payload.expiresDate !== undefined && payload.expiresDate <= Date.now()
        ? 2
        : 1);
    if (state.signedRenewalInfo === undefined) {
      state.signedRenewalInfo = await this.#signer.signRenewalInfo(
        sampleRenewalFor(this.#signer, payload, status, environment),
      );
      states.set(originalTransactionId, state);
    }
    return { status, signedRenewalInfo: state.signedRenewalInfo };
  }

  /**
   * Get Transaction History v2: the customer's transactions filtered and sorted as asked, in
   * pages; `revision` is where the next page starts, valid only with the same filters.
   */
  #history(call: Call): Answer {
    const query = call.query;
    const sort = query.get("sort") ?? "ASCENDING";
    if (sort !== "ASCENDING" && sort !== "DESCENDING") {
      return { status: 400, body: STOREA_API_ERRORS.invalidSort };
    }
    const startDate = query.get("startDate");
    const endDate = query.get("endDate");
    if (startDate !== null && !/^\d{1,15}$/.test(startDate)) {
      return { status: 400, body: STOREA_API_ERRORS.invalidStartDate };
    }
    if (endDate !== null && !/^\d{1,15}$/.test(endDate)) {
      return { status: 400, body: STOREA_API_ERRORS.invalidEndDate };
    }
    if (startDate !== null && endDate !== null && Number(startDate) >= Number(endDate)) {
      return { status: 400, body: STOREA_API_ERRORS.startDateAfterEndDate };
    }
    const productTypes = query.getAll("productType");
    if (productTypes.some((type) => !Object.hasOwn(PRODUCT_TYPES, type))) {
      return { status: 400, body: STOREA_API_ERRORS.invalidProductType };
    }
    const ownership = query.get("inAppOwnershipType");
    if (ownership !== null && ownership !== "FAMILY_SHARED" && ownership !== "PURCHASED") {
      return { status: 400, body: STOREA_API_ERRORS.invalidInAppOwnershipType };
    }
    const revoked = query.get("revoked");
    if (revoked !== null && revoked !== "true" && revoked !== "false") {
      return { status: 400, body: STOREA_API_ERRORS.invalidRevoked };
    }
    const filters = [...query.entries()].filter(([name]) => name !== "revision");
    const fingerprint = JSON.stringify([call.environment, call.id, filters]);
    let offset = 0;
    const revision = query.get("revision");
    if (revision !== null) {
      const position = readRevision(revision, fingerprint);
      if (position === null) return { status: 400, body: STOREA_API_ERRORS.invalidRequestRevision };
      offset = position;
    }
    const found = this.#find(call);
    if ("status" in found) return found;

    const productIds = query.getAll("productId");
    const groups = query.getAll("subscriptionGroupIdentifier");
    const types = productTypes.map((type) => PRODUCT_TYPES[type]);
    const matching = this.#customerTransactions(call.environment, found)
      .filter(({ payload }) =>
        (startDate === null || payload.purchaseDate >= Number(startDate)) &&
        (endDate === null || payload.purchaseDate < Number(endDate)) &&
        (productIds.length === 0 || productIds.includes(payload.productId)) &&
        (types.length === 0 || types.includes(payload.type)) &&
        (groups.length === 0 ||
          groups.includes(payload.subscriptionGroupIdentifier ?? "")) &&
        (ownership === null || payload.inAppOwnershipType === ownership) &&
        (revoked === null || (payload.revocationDate !== undefined) === (revoked === "true"))
      )
      .sort((a, b) =>
        (a.payload.purchaseDate - b.payload.purchaseDate ||
          a.payload.transactionId.localeCompare(b.payload.transactionId)) *
        (sort === "ASCENDING" ? 1 : -1)
      );
    const page = matching.slice(offset, offset + this.#historyPageSize);
    const next = offset + page.length;
    return {
      status: 200,
      body: {
        revision: writeRevision(next, fingerprint),
        hasMore: next < matching.length,
        bundleId: call.bundleId,
        ...this.#appAppleIdOf(call),
        environment: environmentName(call.environment),
        signedTransactions: page.map((t) => t.jws),
      },
    };
  }

  /**
   * Send Consumption Information v2: the ConsumptionRequest checked as Apple documents it,
   * recorded, and answered 202 with no body.
   */
  #consumption(call: Call): Answer {
    if (!/^\d+$/.test(call.id)) {
      return { status: 400, body: STOREA_API_ERRORS.invalidTransactionId };
    }
    let body: unknown;
    try {
      body = JSON.parse(call.body);
    } catch {
      // "If there's no error code, the request is malformed."
      return { status: 400 };
    }
    if (typeof body !== "object" || body === null || Array.isArray(body)) return { status: 400 };
    const request = body as Record<string, unknown>;
    const errors = STOREA_API_ERRORS;
    if (request.customerConsented !== true) {
      return { status: 400, body: errors.invalidCustomerConsented };
    }
    if (!DELIVERY_STATUSES.includes(request.deliveryStatus as string)) {
      return { status: 400, body: errors.invalidDeliveryStatus };
    }
    if (typeof request.sampleContentProvided !== "boolean") {
      return { status: 400, body: errors.invalidSampleContentProvided };
    }
    if (
      request.refundPreference !== undefined &&
      !REFUND_PREFERENCES.includes(request.refundPreference as string)
    ) return { status: 400, body: errors.invalidRefundPreference };
    const percentage = request.consumptionPercentage;
    if (
      percentage !== undefined &&
      (!Number.isInteger(percentage) || (percentage as number) < 0 ||
        (percentage as number) > 100_000)
    ) return { status: 400, body: errors.consumptionPercentageOutOfRange };
    const found = this.#find(call);
    if ("status" in found) return found;
    if (percentage !== undefined) {
      if (found.payload.type === "Auto-Renewable Subscription") {
        return { status: 400, body: errors.consumptionPercentageAutoRenewableSubscription };
      }
      if (request.deliveryStatus !== "DELIVERED" && percentage !== 0) {
        return { status: 400, body: errors.undeliveredConsumptionPercentageNonZero };
      }
      if (
        request.refundPreference === "GRANT_PRORATED" &&
        ((percentage as number) <= 0 || (percentage as number) >= 100_000)
      ) return { status: 400, body: errors.consumptionPercentageOutOfRange };
    }
    this.consumptionRequests.push({
      environment: call.environment,
      transactionId: call.id,
      body: request,
      at: Date.now(),
    });
    return { status: 202 };
  }

  /**
   * Request a Test Notification: answers a token at once, and posts a signed TEST notification
   * to the app's notification URL for this environment (404 when it has none).
   */
  async #requestTestNotification(call: Call): Promise<Answer> {
    const target = this.#notificationUrls[call.environment].get(call.bundleId);
    if (target === undefined) {
      return { status: 404, body: STOREA_API_ERRORS.serverNotificationUrlNotFound };
    }
    const token = `${crypto.randomUUID()}_${Date.now()}`;
    const payload = await this.#signer.notificationPayload({
      notificationType: "TEST",
      bundleId: call.bundleId,
      environment: environmentName(call.environment),
      ...(call.environment === "production" && target.appAppleId !== undefined
        ? { appAppleId: target.appAppleId }
        : {}),
    });
    const signedPayload = await this.#signer.signNotification(payload);
    const test: TestNotification = {
      environment: call.environment,
      bundleId: call.bundleId,
      signedPayload,
      sendAttempts: [],
    };
    this.#testNotifications.set(token, test);
    const history = this.#historyRecord(notificationFacts(signedPayload), signedPayload);
    const posting = this.#post(
      call.environment,
      target.url,
      payload.notificationUUID,
      signedPayload,
    )
      .then((attempt) => {
        test.sendAttempts.push(attempt);
        history.sendAttempts.push(attempt);
      });
    this.#posting.add(posting);
    posting.finally(() => this.#posting.delete(posting));
    return { status: 200, body: { testNotificationToken: token } };
  }

  /** Get Test Notification Status: the signed payload and the attempts so far. */
  #testNotificationStatus(call: Call): Answer {
    const test = this.#testNotifications.get(call.id);
    if (
      test === undefined || test.environment !== call.environment || test.bundleId !== call.bundleId
    ) {
      return { status: 404, body: STOREA_API_ERRORS.testNotificationNotFound };
    }
    return {
      status: 200,
      body: { signedPayload: test.signedPayload, sendAttempts: [...test.sendAttempts] },
    };
  }

  /** Posts `{signedPayload}` as the App Store does, once, and says what it met. */
  async #post(
    environment: StoreaApiEnvironment,
    url: string,
    notificationUUID: string,
    signedPayload: string,
  ): Promise<StoreaSendAttempt> {
    const attemptDate = Date.now();
    let result: StoreaSendAttemptResult;
    let responseStatus: number | null = null;
    const signal = AbortSignal.any([
      AbortSignal.timeout(this.#notificationTimeoutMs),
      this.#closing.signal,
    ]);
    try {
      const response = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ signedPayload }),
        redirect: "manual",
        signal,
      });
      responseStatus = response.status;
      await response.body?.cancel();
      result = response.status >= 200 && response.status < 300
        ? "SUCCESS"
        : "UNSUCCESSFUL_HTTP_RESPONSE_CODE";
    } catch (error) {
      result = sendFailure(error, signal);
    }
    const attempt = { attemptDate, sendAttemptResult: result };
    this.sentNotifications.push({
      environment,
      url,
      notificationUUID,
      signedPayload,
      attempt,
      responseStatus,
    });
    return attempt;
  }

  #appAppleIdOf(call: Call): { appAppleId?: number } {
    const appAppleId = this.#notificationUrls[call.environment].get(call.bundleId)?.appAppleId;
    return appAppleId === undefined ? {} : { appAppleId };
  }

  #nextScripted(
    environment: StoreaApiEnvironment,
    operation: StoreaApiOperation,
  ): StoreaScriptedAnswer | undefined {
    const queue = this.#scripts[environment];
    const index = queue.findIndex((s) => s.operation === undefined || s.operation === operation);
    if (index === -1) return undefined;
    const next = queue[index];
    next.times = (next.times ?? 1) - 1;
    if (next.times <= 0) queue.splice(index, 1);
    return next;
  }

  /**
   * Checks the token as Apple documents it ("Generating JSON Web Tokens for API requests"):
   * ES256, typ JWT, a known kid; iss, aud, bid of that key; iat not in the future; exp in
   * the future and at most 60 minutes after iat. Returns why it is refused, or its bundle id.
   */
  async #authenticate(
    authorization: string | undefined,
  ): Promise<{ failure: string } | { bundleId: string }> {
    const refuse = (failure: string) => ({ failure });
    const token = /^Bearer (\S+)$/.exec(authorization ?? "")?.[1];
    if (token === undefined) return refuse("missing bearer token");
    this.#tokens.add(token);

    let header;
    try {
      header = decodeProtectedHeader(token);
    } catch {
      return refuse("malformed token");
    }
    if (header.alg !== "ES256") return refuse(`alg ${header.alg} is not ES256`);
    if (header.typ !== "JWT") return refuse(`typ ${header.typ} is not JWT`);
    const key = typeof header.kid === "string" ? this.#keys.get(header.kid) : undefined;
    if (key === undefined) return refuse(`unknown kid ${header.kid}`);

    let claims: Record<string, unknown>;
    try {
      const { payload } = await compactVerify(token, key.publicKey, { algorithms: ["ES256"] });
      claims = JSON.parse(new TextDecoder().decode(payload));
    } catch {
      return refuse("signature does not verify with the key of kid");
    }
    const now = Math.floor(Date.now() / 1000);
    const { iss, aud, bid, iat, exp } = claims;
    if (iss !== key.issuerId) return refuse(`iss ${iss} is not the key's issuer`);
    if (aud !== STOREA_API_AUDIENCE) return refuse(`aud ${aud} is not ${STOREA_API_AUDIENCE}`);
    if (bid !== key.bundleId) return refuse(`bid ${bid} is not the key's bundle`);
    if (typeof iat !== "number" || typeof exp !== "number") return refuse("iat or exp missing");
    if (iat > now + this.#toleranceSeconds) return refuse("iat is in the future");
    if (exp <= now) return refuse("token expired");
    if (exp - iat > MAX_TOKEN_LIFETIME_SECONDS) {
      return refuse("exp is more than 60 minutes after iat");
    }
    return { bundleId: key.bundleId };
  }
}

/** `Production` or `Sandbox`, as Apple's payloads spell the environment. */
function environmentName(environment: StoreaApiEnvironment): StoreaEnvironmentName {
  return environment === "production" ? "Production" : "Sandbox";
}

/** A renewal info that matches a subscription's status and its latest transaction. */
function sampleRenewalFor(
  signer: StoreaSigner,
  latest: StoreaTransactionPayload,
  status: number,
  environment: StoreaApiEnvironment,
): StoreaRenewalInfoPayload {
  const expires = latest.expiresDate;
  const base = {
    originalTransactionId: latest.originalTransactionId,
    productId: latest.productId,
    autoRenewProductId: latest.productId,
    environment: environmentName(environment),
    recentSubscriptionStartDate: latest.originalPurchaseDate,
  };
  switch (status) {
    case 1:
      return signer.sampleRenewalInfo({ ...base, autoRenewStatus: 1, renewalDate: expires });
    case 3:
      return signer.sampleRenewalInfo({
        ...base,
        autoRenewStatus: 1,
        expirationIntent: 2,
        isInBillingRetryPeriod: true,
        renewalDate: undefined,
      });
    case 4:
      return signer.sampleRenewalInfo({
        ...base,
        autoRenewStatus: 1,
        expirationIntent: 2,
        isInBillingRetryPeriod: true,
        gracePeriodExpiresDate: (expires ?? Date.now()) + 16 * DAY_MS,
        renewalDate: undefined,
      });
    default:
      // Expired (2) or revoked (5): nothing renews.
      return signer.sampleRenewalInfo({
        ...base,
        autoRenewStatus: 0,
        ...(status === 2 ? { expirationIntent: 1 } : {}),
        renewalDate: undefined,
      });
  }
}

/** A revision token: where the next page starts, for one query. */
function writeRevision(offset: number, fingerprint: string): string {
  const json = JSON.stringify({ offset, fingerprint });
  return new TextEncoder().encode(json).toBase64({ alphabet: "base64url", omitPadding: true });
}

/** The offset of a revision made for `fingerprint`, or null. */
function readRevision(revision: string, fingerprint: string): number | null {
  try {
    const bytes = Uint8Array.fromBase64(revision, { alphabet: "base64url" });
    const parsed = JSON.parse(new TextDecoder().decode(bytes));
    if (parsed?.fingerprint !== fingerprint || !Number.isInteger(parsed.offset)) return null;
    return parsed.offset >= 0 ? parsed.offset : null;
  } catch {
    return null;
  }
}

/** Apple's name for why a post got no answer. */
function sendFailure(error: unknown, signal: AbortSignal): StoreaSendAttemptResult {
  if (signal.aborted) return "TIMED_OUT";
  const text = String((error as Error)?.cause ?? error);
  if (/connection refused|tcp connect error/i.test(text)) return "NO_RESPONSE";
  if (/closed before message completed|connection reset|broken pipe/i.test(text)) {
    return "PREMATURE_CLOSE";
  }
  if (/certificate|tls|ssl|handshake/i.test(text)) return "TLS_ISSUE";
  if (/dns|lookup|resolve/i.test(text)) return "OTHER";
  return "SOCKET_ISSUE";
}

/** A JSON object, or null for anything else. */
function parseJsonObject(text: string): Record<string, unknown> | null {
  try {
    const value = JSON.parse(text);
    return typeof value === "object" && value !== null && !Array.isArray(value) ? value : null;
  } catch {
    return null;
  }
}

/** What the notification history keeps of a signed notification, read without verifying it. */
function notificationFacts(signedPayload: string): NotificationFacts {
  const payload = decodeJwt(signedPayload) as Record<string, unknown>;
  const data = (payload.data ?? payload.summary ?? {}) as Record<string, unknown>;
  const bundleId = data.bundleId;
  const uuid = payload.notificationUUID;
  if (typeof bundleId !== "string" || typeof uuid !== "string") {
    throw new TypeError("the notification has no bundleId or notificationUUID");
  }
  let originalTransactionId: string | null = null;
  if (typeof data.signedTransactionInfo === "string") {
    const transaction = decodeJwt(data.signedTransactionInfo);
    if (typeof transaction.originalTransactionId === "string") {
      originalTransactionId = transaction.originalTransactionId;
    }
  }
  return {
    environment: data.environment === "Sandbox" ? "sandbox" : "production",
    bundleId,
    notificationUUID: uuid,
    notificationType: String(payload.notificationType ?? ""),
    subtype: typeof payload.subtype === "string" ? payload.subtype : null,
    originalTransactionId,
    date: typeof payload.signedDate === "number" ? payload.signedDate : Date.now(),
  };
}

/** The request body as text, or null past {@linkcode MAX_REQUEST_BODY_BYTES}. */
async function readBody(req: http.IncomingMessage): Promise<string | null> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Uint8Array).length;
    if (size > MAX_REQUEST_BODY_BYTES) return null;
    chunks.push(chunk as Uint8Array);
  }
  const bytes = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.length;
  }
  return new TextDecoder().decode(bytes);
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
