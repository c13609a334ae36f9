/**
 * Store B notifications (Real-time developer notifications over Pub/Sub push): the push envelope is
 * validated and its `message.data` decoded into the developer notification, which must name the
 * tenant's package.
 */
import { z } from "zod";
import { invalidRequest } from "../errors.ts";
import { decodeUtf8Strict, isJsonObject, MAX_JSON_DEPTH, nestsDeeperThan } from "../lib/json.ts";

/**
 * The push envelope. Unknown fields are kept (Pub/Sub adds some over time, e.g.
 * `deliveryAttempt`), since the envelope is forwarded unchanged as the delivery's `raw`.
 */
export const pushEnvelopeSchema = z.looseObject({
  message: z.looseObject({
    data: z.string().min(1),
    // Pub/Sub sends both spellings; either one is enough.
    messageId: z.string().min(1).max(200).optional(),
    message_id: z.string().min(1).max(200).optional(),
    publishTime: z.string().optional(),
    attributes: z.record(z.string(), z.string()).optional(),
  }),
  subscription: z.string().optional(),
}).refine((envelope) => envelope.message.messageId ?? envelope.message.message_id, {
  message: "message.messageId is required",
  path: ["message", "messageId"],
});

/** A valid push envelope. */
export type PushEnvelope = z.infer<typeof pushEnvelopeSchema>;

/** A decoded notification for the tenant's package. */
export interface DecodedStorebNotification {
  messageId: string;
  /** The developer notification, unchanged. */
  notification: Record<string, unknown>;
}

/**
 * Decodes the developer notification of `envelope` and checks its package.
 * @throws {ServiceError} 400 `INVALID_REQUEST` when the data is not base64 JSON of a notification,
 * nests too deep, or names another package.
 */
export function decodeStorebNotification(
  envelope: PushEnvelope,
  packageName: string,
): DecodedStorebNotification {
  const messageId = (envelope.message.messageId ?? envelope.message.message_id)!;
  let notification: unknown;
  try {
    const base64 = envelope.message.data.replaceAll("-", "+").replaceAll("_", "/");
    notification = JSON.parse(decodeUtf8Strict(Uint8Array.fromBase64(base64)));
  } catch {
    throw invalidRequest("message.data is not base64 of a JSON developer notification");
  }
  if (!isJsonObject(notification)) {
    throw invalidRequest("message.data is not a developer notification object");
  }
  // Stored and delivered as `data`: as deep as a request body may be (see MAX_JSON_DEPTH).
  if (nestsDeeperThan(notification, MAX_JSON_DEPTH)) {
    throw invalidRequest(`message.data nests deeper than ${MAX_JSON_DEPTH} levels`);
  }
  const record = notification as Record<string, unknown>;
  if (typeof record.packageName !== "string") {
    throw invalidRequest("the developer notification has no packageName");
  }
  if (record.packageName !== packageName) {
    throw invalidRequest(
      `the notification's packageName is not the tenant's (${packageName})`,
      { packageName: record.packageName },
    );
  }
  return { messageId, notification: record };
}
