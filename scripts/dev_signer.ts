/**
 * The signer of `deno task dev`: on a loopback port, it makes and signs store notifications with
 * the running simulators for `purchase-relay trigger` (src/cli/trigger.ts), so that the
 * simulators' private keys never leave this process. It answers only a request that carries its
 * bearer token, which only a reader of `DATA_DIR/dev/signer.json` (mode 0600) has, and only for
 * the notification types the event catalog names.
 *
 * @module
 */
import { timingSafeEqual } from "node:crypto";
import { namedNotificationTypes } from "../src/events/catalog.ts";
import {
  FAILED_SEND_ATTEMPT_RESULTS,
  type LostNotification,
  type SignedRequest,
  type SignRequest,
  type StorebNotificationChoice,
} from "../src/cli/trigger.ts";
import type { StoreaSendAttemptResult } from "../simulators/storea_api.ts";
import { storeaNotification, storebPush } from "../simulators/store_notifications.ts";
import {
  SIMULATED_APP,
  type SimulatedPurchases,
  type SimulatedStores,
} from "./simulated_stores.ts";

/** A sign request is a few hundred bytes; anything much larger is refused unread. */
const MAX_REQUEST_BYTES = 16 * 1024;
const MAX_FIELD_CHARS = 2048;

/** A running signer. */
export interface DevSigner {
  /** Where to POST a sign request: `http://127.0.0.1:<port>/sign`. */
  url: string;
  /** The bearer token it requires. */
  token: string;
  close(): Promise<void>;
}

/** Starts the signer on 127.0.0.1 on a free port, signing about `purchases`. */
export function startDevSigner(
  stores: SimulatedStores,
  purchases: SimulatedPurchases,
): Promise<DevSigner> {
  const token = crypto.getRandomValues(new Uint8Array(32)).toBase64({
    alphabet: "base64url",
    omitPadding: true,
  });
  const expected = new TextEncoder().encode(`Bearer ${token}`);
  const listening = Promise.withResolvers<number>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: ({ port }) => listening.resolve(port),
  }, async (request) => {
    const url = new URL(request.url);
    if (url.pathname !== "/sign") return answer(404, { error: "NOT_FOUND" });
    if (request.method !== "POST") return answer(405, { error: "METHOD_NOT_ALLOWED" });
    const given = new TextEncoder().encode(request.headers.get("authorization") ?? "");
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      return answer(401, { error: "UNAUTHENTICATED", message: "no or wrong bearer token" });
    }
    const length = request.headers.get("content-length");
    if (length === null) {
      return answer(411, { error: "LENGTH_REQUIRED", message: "send a Content-Length" });
    }
    if (!(Number(length) <= MAX_REQUEST_BYTES)) {
      return answer(413, { error: "TOO_LARGE", message: "a sign request is at most 16 KiB" });
    }
    let signRequest: SignRequest;
    try {
      signRequest = checkedSignRequest(JSON.parse(await request.text()));
    } catch (error) {
      return answer(400, { error: "INVALID_REQUEST", message: (error as Error).message });
    }
    return answer(200, await sign(stores, purchases, signRequest));
  });
  return listening.promise.then((port) => ({
    url: `http://127.0.0.1:${port}/sign`,
    token,
    close: () => server.shutdown(),
  }));
}

async function sign(
  stores: SimulatedStores,
  purchases: SimulatedPurchases,
  request: SignRequest,
): Promise<SignedRequest> {
  if (request.store === "storea") {
    const { body } = await storeaNotification(stores.signer, {
      notificationType: request.notificationType,
      subtype: request.subtype ?? undefined,
      bundleId: request.bundleId,
      appAppleId: request.appId ?? undefined,
      originalTransactionId: purchases.storeaTransactionId,
      productId: SIMULATED_APP.storeaProductId,
    });
    const signed = { headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
    if (request.lost === undefined) return signed;
    // Lost on the way: the App Store keeps it in its history with the failed attempt.
    stores.storeaApi.recordNotification(body.signedPayload, {
      sendAttempts: [{
        attemptDate: Date.now(),
        sendAttemptResult: request.lost.sendAttemptResult as StoreaSendAttemptResult,
      }],
    });
    return { ...signed, recorded: true };
  }
  const push = await storebPush(stores.issuer, {
    notification: request.notification,
    packageName: request.packageName,
    purchaseToken: purchases.storebPurchaseToken,
    productId: SIMULATED_APP.storebProductId,
    audience: request.pushAudience,
    pushServiceAccount: request.pushServiceAccount,
  });
  const signed = {
    headers: { authorization: `Bearer ${push.token}`, "content-type": "application/json" },
    body: JSON.stringify(push.body),
  };
  const voided = push.notification.voidedPurchaseNotification as
    | { purchaseToken: string; orderId: string; refundType: number }
    | undefined;
  if (request.lost === undefined || voided === undefined) return signed;
  // Lost on the way: Google lists the voided purchase (a little after it voided it).
  stores.play.addVoidedPurchase({
    packageName: request.packageName,
    voidedPurchase: {
      kind: "androidpublisher#voidedPurchase",
      purchaseToken: voided.purchaseToken,
      purchaseTimeMillis: String(Date.now() - 86_400_000),
      voidedTimeMillis: String(Date.now() - 2 * 60_000),
      orderId: voided.orderId,
      voidedSource: 0,
      voidedReason: 1,
      ...(voided.refundType === 2 ? { voidedQuantity: 1 } : {}),
    },
    type: "subscription",
  });
  return { ...signed, recorded: true };
}

/** The request, if it asks for a type the catalog names with fields of sane sizes. */
function checkedSignRequest(value: unknown): SignRequest {
  const request = value as Record<string, unknown>;
  const text = (name: string) => {
    const field = request?.[name];
    if (typeof field !== "string" || field === "" || field.length > MAX_FIELD_CHARS) {
      throw new Error(`${name} must be a string of 1 to ${MAX_FIELD_CHARS} characters`);
    }
    return field;
  };
  const named = namedNotificationTypes();
  if (request?.store === "storea") {
    const notificationType = text("notificationType");
    if (!named.storea.includes(notificationType)) {
      throw new Error(`${notificationType} is not a store A type the catalog names`);
    }
    const subtype = request.subtype === null ? null : text("subtype");
    if (subtype !== null && !/^[A-Z][A-Z0-9_]{0,63}$/.test(subtype)) {
      throw new Error("subtype must be upper-case letters, digits and _");
    }
    const appId = request.appId;
    if (appId !== null && !Number.isSafeInteger(appId)) throw new Error("appId must be an integer");
    return {
      store: "storea",
      notificationType,
      subtype,
      bundleId: text("bundleId"),
      appId: appId as number | null,
      ...checkedLost(request.lost, "storea"),
    };
  }
  if (request?.store === "storeb") {
    const notification = checkedStorebNotification(request.notification);
    const lost = checkedLost(request.lost, "storeb");
    if (lost.lost !== undefined && notification.kind !== "voided_purchase") {
      throw new Error("only a voided purchase can be lost: Google lists no other");
    }
    return {
      store: "storeb",
      notification,
      packageName: text("packageName"),
      pushAudience: text("pushAudience"),
      pushServiceAccount: text("pushServiceAccount"),
      ...lost,
    };
  }
  throw new Error("store must be storea or storeb");
}

/** `lost`, if asked for: store A's with a failed send attempt result Apple names, store B's none. */
function checkedLost(value: unknown, store: "storea" | "storeb"): { lost?: LostNotification } {
  if (value === undefined) return {};
  const result = (value as Record<string, unknown> | null)?.sendAttemptResult;
  if (store === "storeb") {
    if (result !== null) throw new Error("lost.sendAttemptResult must be null for store B");
    return { lost: { sendAttemptResult: null } };
  }
  if (!(FAILED_SEND_ATTEMPT_RESULTS as readonly unknown[]).includes(result)) {
    throw new Error("lost.sendAttemptResult must be a failed sendAttemptResult");
  }
  return { lost: { sendAttemptResult: result as string } };
}

function checkedStorebNotification(value: unknown): StorebNotificationChoice {
  const notification = value as Record<string, unknown>;
  const named = namedNotificationTypes();
  const type = notification?.notificationType as number;
  switch (notification?.kind) {
    case "subscription":
      if (named.storebSubscription.includes(type)) {
        return { kind: "subscription", notificationType: type };
      }
      break;
    case "one_time_product":
      if (named.storebOneTimeProduct.includes(type)) {
        return { kind: "one_time_product", notificationType: type };
      }
      break;
    case "voided_purchase":
      if (notification.refundType === 1 || notification.refundType === 2) {
        return { kind: "voided_purchase", refundType: notification.refundType };
      }
      break;
    case "test":
      return { kind: "test" };
  }
  throw new Error("notification is not a store B notification the catalog names");
}

function answer(status: number, body: unknown): Response {
  return Response.json(body, { status, headers: { "cache-control": "no-store" } });
}
