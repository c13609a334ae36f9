/**
 * `trigger STORE TYPE --tenant ID [--subtype SUBTYPE]`, for development: a notification of any
 * type the event catalog names (docs/events.md), made and signed by the store simulators of a
 * running `deno task dev`, posted to that service's receiver for the tenant as the store would
 * post it; the service then delivers it to the tenant's callback URL like any other.
 *
 * A service trusts the simulators' keys (a test root certificate, a fake push-token issuer) only
 * when `deno task dev` starts it, and their private keys never leave that process: it signs over
 * loopback for whoever can read the file it keeps in its DATA_DIR while it runs
 * ({@linkcode DEV_SIGNER_FILE}). Without that file, or when NODE_ENV is production, the command is
 * refused before anything is signed.
 *
 * With `--lost`, the notification is lost on the way instead: the simulators keep it as the store
 * would (in the App Store's notification history with a failed send attempt; in Google Play's
 * voided purchases list) and nothing is posted; the command then waits for the service's
 * recovery to find it (docs/recovery.md, "Recovering missed notifications").
 * @module
 */
import { join } from "node:path";
import { classifyStorea, namedNotificationTypes } from "../events/catalog.ts";
import { voidedPurchaseKey } from "../events/store_events.ts";
import { decodeSegment } from "../storea/jws.ts";
import { describeCredentials } from "../db/credentials.ts";
import type { Database } from "../db/connect.ts";
import { type AttemptRecord, findDelivery } from "../delivery/queue.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import { mustFindTenant } from "./inputs.ts";

/** Where `deno task dev` says, while it runs, how to reach its signer: under DATA_DIR. */
export const DEV_SIGNER_FILE = "dev/signer.json";

/** The content of {@linkcode DEV_SIGNER_FILE}. */
export interface DevSignerFile {
  /** Where to POST a {@linkcode SignRequest}. */
  url: string;
  /** The bearer token the signer requires. */
  token: string;
  /** The service `deno task dev` started, which trusts the signer's keys. */
  serviceUrl: string;
}

/** A store B developer notification, by kind. */
export type StorebNotificationChoice =
  | { kind: "subscription" | "one_time_product"; notificationType: number }
  /** `refundType` 1 is a full refund, 2 a quantity-based partial one. */
  | { kind: "voided_purchase"; refundType: 1 | 2 }
  | { kind: "test" };

/**
 * A notification lost on the way: the store tried to post it and met `sendAttemptResult` (store
 * A); store B keeps only voided purchases, in its list, and reports no attempt (null).
 */
export interface LostNotification {
  sendAttemptResult: string | null;
}

/** What the command line asked for. */
export type TriggerChoice =
  & (
    | { store: "storea"; notificationType: string; subtype: string | null }
    | { store: "storeb"; notification: StorebNotificationChoice }
  )
  & { lost?: LostNotification };

/** What the signer is asked to make: the choice, and what the tenant's receiver checks. */
export type SignRequest =
  & (
    | {
      store: "storea";
      notificationType: string;
      subtype: string | null;
      bundleId: string;
      appId: number | null;
    }
    | {
      store: "storeb";
      notification: StorebNotificationChoice;
      packageName: string;
      pushAudience: string;
      pushServiceAccount: string;
    }
  )
  & {
    /** Keep it at the store as lost on the way (and say so with `recorded`), not for posting. */
    lost?: LostNotification;
  };

/** The signer's answer: the request to send to the receiver, as the store would send it. */
export interface SignedRequest {
  headers: Record<string, string>;
  body: string;
  /** For a `lost` request: the store's simulator keeps it (and nothing is to be posted). */
  recorded?: boolean;
}

/** Apple's `sendAttemptResult` values of a failed attempt. */
export const FAILED_SEND_ATTEMPT_RESULTS = [
  "TIMED_OUT",
  "TLS_ISSUE",
  "CIRCULAR_REDIRECT",
  "NO_RESPONSE",
  "SOCKET_ISSUE",
  "UNSUPPORTED_CHARSET",
  "INVALID_RESPONSE",
  "PREMATURE_CLOSE",
  "UNSUCCESSFUL_HTTP_RESPONSE_CODE",
  "OTHER",
] as const;

const SIGNER_TIMEOUT_MS = 10_000;
const RECEIVER_TIMEOUT_MS = 15_000;
/** How long a lost notification is waited for: a few runs of the dev loop's recovery. */
const RECOVERY_WAIT_MS = 90_000;
const POLL_INTERVAL_MS = 100;
const REFUND_TYPES: Record<string, 1 | 2> = { full_refund: 1, partial_refund: 2 };

/**
 * Reads STORE, TYPE and `--subtype`: a store A notificationType the catalog names (any case);
 * for store B `subscription.N` or `one_time_product.N` with a number the catalog names,
 * `voided_purchase` (or `voided`, with `--subtype full_refund|partial_refund`) or `test`.
 * @throws {UsageError} for anything else, naming what is accepted.
 */
export function parseTriggerChoice(
  store: string,
  type: string,
  options: { subtype?: string; lost?: string } = {},
): TriggerChoice {
  const choice = parseNotificationChoice(store, type, options);
  if (options.lost === undefined) return choice;
  const lost = options.lost.toUpperCase();
  if (choice.store === "storeb") {
    if (choice.notification.kind !== "voided_purchase") {
      throw new UsageError(
        "store B keeps no record of a notification it failed to deliver, except of a voided " +
          "purchase: --lost is for voided_purchase",
      );
    }
    if (lost !== "YES") throw new UsageError("--lost for store B is yes");
    return { ...choice, lost: { sendAttemptResult: null } };
  }
  const result = lost === "YES" ? "TIMED_OUT" : lost;
  if (!(FAILED_SEND_ATTEMPT_RESULTS as readonly string[]).includes(result)) {
    throw new UsageError(
      `--lost is yes or what the App Store met: ${FAILED_SEND_ATTEMPT_RESULTS.join(", ")}`,
    );
  }
  return { ...choice, lost: { sendAttemptResult: result } };
}

function parseNotificationChoice(
  store: string,
  type: string,
  options: { subtype?: string },
): TriggerChoice {
  const subtype = options.subtype;
  const named = namedNotificationTypes();
  if (store === "storea") {
    const notificationType = type.toUpperCase();
    if (!named.storea.includes(notificationType)) {
      throw new UsageError(
        `store A has no notification type ${type} in the event catalog; one of: ${
          named.storea.join(", ")
        } (docs/events.md)`,
      );
    }
    const sub = subtype === undefined ? null : subtype.toUpperCase();
    if (sub !== null && !/^[A-Z][A-Z0-9_]{0,63}$/.test(sub)) {
      throw new UsageError(`--subtype ${subtype} is not a subtype such as VOLUNTARY`);
    }
    if (classifyStorea({ notificationType, subtype: sub }, null).event === "unknown") {
      throw new UsageError(
        `${notificationType}${
          sub === null ? " without a subtype" : ` with subtype ${sub}`
        } is not an event of the catalog: give --subtype AUTO_RENEW_DISABLED or AUTO_RENEW_ENABLED (docs/events.md)`,
      );
    }
    return { store, notificationType, subtype: sub };
  }
  if (store !== "storeb") throw new UsageError(`STORE is storea or storeb, not ${store}`);
  const lower = type.toLowerCase();
  const numbered = /^(subscription|one_time_product)\.(\d{1,3})$/.exec(lower);
  const storebTypes = [
    ...named.storebSubscription.map((n) => `subscription.${n}`),
    ...named.storebOneTimeProduct.map((n) => `one_time_product.${n}`),
    "voided_purchase",
    "test",
  ];
  if (lower === "voided_purchase" || lower === "voided") {
    const refund = (subtype ?? "full_refund").toLowerCase();
    if (!Object.hasOwn(REFUND_TYPES, refund)) {
      throw new UsageError("--subtype of voided_purchase is full_refund or partial_refund");
    }
    return {
      store,
      notification: { kind: "voided_purchase", refundType: REFUND_TYPES[refund] },
    };
  }
  if (subtype !== undefined) {
    throw new UsageError("--subtype is for store A types and store B voided_purchase only");
  }
  if (lower === "test") return { store, notification: { kind: "test" } };
  if (numbered && storebTypes.includes(lower)) {
    const kind = numbered[1] as "subscription" | "one_time_product";
    return { store, notification: { kind, notificationType: Number(numbered[2]) } };
  }
  throw new UsageError(
    `store B has no notification ${type} in the event catalog; one of: ${
      storebTypes.join(", ")
    } (docs/events.md)`,
  );
}

/** `trigger STORE TYPE --tenant ID [--subtype SUBTYPE]` */
export async function triggerNotification(
  { positionals: [store, type], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  // First, before any file is read or anything signed.
  if (context.config.env === "production") {
    throw new CommandError(
      "DEV_ONLY",
      "trigger makes notifications with the store simulators' test keys: it is refused when NODE_ENV is production",
    );
  }
  const choice = parseTriggerChoice(store, type, {
    subtype: options.subtype,
    lost: options.lost,
  });
  const signer = await readSignerFile(context.config.dataDir);
  const tenantId = options.tenant!;
  const { db } = await context.open();
  const tenant = await mustFindTenant(db, tenantId);
  const request = await signRequestFor(db, tenantId, choice);
  const signed = await askSigner(signer, request);
  if (choice.lost !== undefined) {
    return await lostAndRecovered(
      db,
      { tenantId, choice, signed, callbackUrl: tenant.callbackUrl },
      context,
    );
  }

  const receiverUrl = `${signer.serviceUrl}/v1/webhooks/${choice.store}/${
    encodeURIComponent(tenantId)
  }`;
  const receipt = await postToReceiver(receiverUrl, signed);
  const event = await eventOf(db, receipt.eventId);
  const delivery = receipt.enqueuedDelivery
    ? await firstAttempt(db, receipt.eventId, context.config.deliveryTimeoutMs + 5_000)
    : null;
  return {
    tenantId,
    store: choice.store,
    type: choice.store === "storea" ? choice.notificationType : storebTypeName(choice),
    subtype: subtypeOf(choice),
    receiverUrl,
    eventId: receipt.eventId,
    isNew: receipt.isNew,
    ...event,
    callbackUrl: tenant.callbackUrl,
    delivery,
  };
}

/**
 * A notification the simulators kept as lost: its id, then the event the service's recovery made
 * of it and its delivery, once found (`recovered` false when the wait ran out).
 */
async function lostAndRecovered(
  db: Database,
  lost: {
    tenantId: string;
    choice: TriggerChoice;
    signed: SignedRequest;
    callbackUrl: string | null;
  },
  context: CliContext,
): Promise<CommandOutput> {
  const { tenantId, choice, signed } = lost;
  if (signed.recorded !== true) {
    throw new CommandError(
      "SIMULATORS_CANNOT_LOSE",
      "the running `deno task dev` cannot keep a lost notification: restart it with this version",
    );
  }
  const externalId = lostNotificationId(choice, signed.body);
  const head = {
    tenantId,
    store: choice.store,
    type: choice.store === "storea" ? choice.notificationType : storebTypeName(choice),
    subtype: subtypeOf(choice),
    lost: choice.lost,
    externalId,
  };
  const deadline = Date.now() + RECOVERY_WAIT_MS;
  for (;;) {
    const [row] = await db.sql`
      SELECT id FROM events
      WHERE tenant_id = ${tenantId} AND source = ${choice.store} AND external_id = ${externalId}`;
    if (row) {
      const delivery = await firstAttempt(db, row.id, context.config.deliveryTimeoutMs + 5_000);
      return {
        ...head,
        recovered: true,
        eventId: row.id,
        ...await eventOf(db, row.id),
        callbackUrl: lost.callbackUrl,
        delivery,
      };
    }
    if (Date.now() >= deadline) {
      return {
        ...head,
        recovered: false,
        hint: "not found by the service's recovery yet: it reads the stores every " +
          "RECOVERY_INTERVAL; run notifications recover for this tenant to read them now",
      };
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** The key a lost notification is stored under: its notificationUUID, or `voided:<orderId>`. */
function lostNotificationId(choice: TriggerChoice, body: string): string {
  const parsed = JSON.parse(body);
  if (choice.store === "storea") {
    return String(decodeSegment(parsed.signedPayload.split(".")[1], "payload").notificationUUID);
  }
  const data = Uint8Array.fromBase64(parsed.message.data);
  const notification = JSON.parse(new TextDecoder().decode(data));
  return voidedPurchaseKey(notification.voidedPurchaseNotification.orderId);
}

/** The signer file of a running `deno task dev` on `dataDir`; SIMULATORS_NOT_RUNNING without. */
async function readSignerFile(dataDir: string): Promise<DevSignerFile> {
  const path = join(dataDir, DEV_SIGNER_FILE);
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch {
    throw notRunning(dataDir, `there is no ${path}`);
  }
  let file: Partial<DevSignerFile>;
  try {
    file = JSON.parse(text);
  } catch {
    throw notRunning(dataDir, `${path} is not JSON`);
  }
  if (
    typeof file?.url !== "string" || typeof file.token !== "string" ||
    typeof file.serviceUrl !== "string"
  ) {
    throw notRunning(dataDir, `${path} lacks url, token or serviceUrl`);
  }
  return file as DevSignerFile;
}

function notRunning(dataDir: string, why: string): CommandError {
  return new CommandError(
    "SIMULATORS_NOT_RUNNING",
    `${why}: no \`deno task dev\` is running with DATA_DIR=${dataDir}, and only the service it starts trusts the store simulators' keys. Start it, or set DATA_DIR to its directory (./data-dev by default)`,
  );
}

/** The request for the signer, with what the tenant's receiver will check. */
async function signRequestFor(
  db: Database,
  tenantId: string,
  choice: TriggerChoice,
): Promise<SignRequest> {
  const credentials = await describeCredentials(db.sql, tenantId);
  if (choice.store === "storea") {
    const storea = credentials.storea as { bundleId: string; appId: number | null } | null;
    if (storea === null) throw credentialsMissing(tenantId, "storea");
    return {
      store: "storea",
      notificationType: choice.notificationType,
      subtype: choice.subtype,
      bundleId: storea.bundleId,
      appId: storea.appId,
      ...(choice.lost === undefined ? {} : { lost: choice.lost }),
    };
  }
  const storeb = credentials.storeb as {
    packageName: string;
    pushAudience: string;
    pushServiceAccount: string | null;
  } | null;
  if (storeb === null || storeb.pushServiceAccount === null) {
    throw credentialsMissing(tenantId, "storeb");
  }
  return {
    store: "storeb",
    notification: choice.notification,
    packageName: storeb.packageName,
    pushAudience: storeb.pushAudience,
    pushServiceAccount: storeb.pushServiceAccount,
    ...(choice.lost === undefined ? {} : { lost: choice.lost }),
  };
}

function credentialsMissing(tenantId: string, store: "storea" | "storeb"): CommandError {
  return new CommandError(
    "CREDENTIALS_MISSING",
    `tenant ${tenantId} has no ${store} credentials (with a push service account, for storeb): its receiver would refuse the notification; run ${store} set-credentials first`,
  );
}

async function askSigner(signer: DevSignerFile, request: SignRequest): Promise<SignedRequest> {
  let response: Response;
  try {
    response = await fetch(signer.url, {
      method: "POST",
      headers: { authorization: `Bearer ${signer.token}`, "content-type": "application/json" },
      body: JSON.stringify(request),
      signal: AbortSignal.timeout(SIGNER_TIMEOUT_MS),
    });
  } catch (error) {
    throw new CommandError(
      "SIMULATORS_NOT_RUNNING",
      `the simulators of \`deno task dev\` did not answer at ${signer.url} (${
        (error as Error).name
      }): it is not running any more; start it again`,
    );
  }
  const answer = await response.json().catch(() => null);
  if (
    !response.ok || typeof answer?.body !== "string" || typeof answer?.headers !== "object"
  ) {
    throw new CommandError(
      "SIMULATORS_NOT_RUNNING",
      `the simulators of \`deno task dev\` refused to sign (${response.status}): ${
        typeof answer?.message === "string" ? answer.message : "no reason given"
      }`,
    );
  }
  return answer as SignedRequest;
}

/** The receipt of the service's receiver; NOTIFICATION_REFUSED when it is not a 200. */
async function postToReceiver(
  url: string,
  signed: SignedRequest,
): Promise<{ eventId: string; isNew: boolean; enqueuedDelivery: boolean }> {
  let response: Response;
  try {
    response = await fetch(url, {
      method: "POST",
      headers: signed.headers,
      body: signed.body,
      signal: AbortSignal.timeout(RECEIVER_TIMEOUT_MS),
    });
  } catch (error) {
    throw new CommandError(
      "NOTIFICATION_REFUSED",
      `the service did not answer at ${url} (${(error as Error).name})`,
    );
  }
  const answer = await response.json().catch(() => null);
  if (response.status !== 200 || typeof answer?.eventId !== "string") {
    const code = typeof answer?.error === "string" ? ` ${answer.error}` : "";
    const message = typeof answer?.message === "string" ? answer.message : "no receipt";
    throw new CommandError(
      "NOTIFICATION_REFUSED",
      `the service's receiver answered ${response.status}${code}: ${message}`,
      { status: response.status, answer },
    );
  }
  return answer;
}

/** What the catalog made of the event: its unified name, reason, platform event and subject. */
async function eventOf(db: Database, eventId: string): Promise<Record<string, unknown>> {
  const [row] = await db.sql`SELECT payload FROM events WHERE id = ${eventId}`;
  if (!row) return {};
  const payload = JSON.parse(row.payload);
  return {
    event: payload.event,
    reason: payload.reason,
    platformEvent: payload.platformEvent,
    subject: payload.subject,
  };
}

/** The delivery once its first attempt is recorded, or as it is after `timeoutMs`. */
async function firstAttempt(
  db: Database,
  eventId: string,
  timeoutMs: number,
): Promise<Record<string, unknown> | null> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const [row] = await db.sql`SELECT id FROM deliveries WHERE event_id = ${eventId}`;
    const delivery = row ? await findDelivery(db.sql, row.id) : null;
    if (delivery !== null && (delivery.attempts > 0 || Date.now() >= deadline)) {
      const first: AttemptRecord | undefined = delivery.attemptLog[0];
      return {
        id: delivery.id,
        status: delivery.status,
        attempts: delivery.attempts,
        responseCode: first?.responseCode ?? null,
        error: first?.error ?? null,
        nextAttemptAt: delivery.nextAttemptAt,
      };
    }
    if (Date.now() >= deadline) return null;
    await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
  }
}

function subtypeOf(choice: TriggerChoice): string | null {
  if (choice.store === "storea") return choice.subtype;
  const notification = choice.notification;
  if (notification.kind !== "voided_purchase") return null;
  return notification.refundType === 1 ? "full_refund" : "partial_refund";
}

function storebTypeName(choice: { notification: StorebNotificationChoice }): string {
  const notification = choice.notification;
  return "notificationType" in notification
    ? `${notification.kind}.${notification.notificationType}`
    : notification.kind;
}
