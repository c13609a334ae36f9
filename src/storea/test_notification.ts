/**
 * Asking the App Store for a test notification (docs/configuration.md, "Checking the notification
 * chain"): Request a Test Notification, then Get Test Notification Status. The request is a POST
 * that makes Apple send one more notification each time, so it is never retried; the status is a
 * read, retried like any other (docs/architecture.md, "Retrying store A calls").
 */
import { ServiceError } from "../errors.ts";
import { timeoutSignal } from "../lib/abort.ts";
import { isJsonObject } from "../lib/json.ts";
import type { StoreaCredentials } from "./credentials.ts";
import type { StoreaAnswer, StoreaApiClient, StoreaEnvironmentName } from "./api_client.ts";
import { keyRefused, malformedAnswer } from "./lookup.ts";

/** One attempt of the App Store to post the notification. */
export interface SendAttempt {
  /** ISO-8601 (Apple sends epoch ms). */
  attemptDate: string | null;
  /** `SUCCESS`, or the failure Apple met, such as `NO_RESPONSE` or `TIMED_OUT`. */
  sendAttemptResult: string;
}

/** What Get Test Notification Status answered. */
export interface TestNotificationStatus {
  signedPayload: string;
  sendAttempts: SendAttempt[];
}

/** The App Store has no notification URL for the app in this environment. */
export class NotificationUrlMissingError extends ServiceError {
  constructor(environment: StoreaEnvironmentName) {
    super(
      "APPLE_API_ERROR",
      `the App Store has no notification URL for this app in ${environment}: set the ` +
        "App Store Server Notifications URL in App Store Connect",
      { details: { status: 404, upstreamCode: 4040007 } },
    );
  }
}

/**
 * Asks Apple to send a TEST notification to the app's notification URL in `environment`.
 * Returns its `testNotificationToken`.
 * @throws {NotificationUrlMissingError} when the app has no notification URL there; the errors
 * of every store A call otherwise.
 */
export async function requestTestNotification(
  client: StoreaApiClient,
  credentials: StoreaCredentials,
  options: { environment: StoreaEnvironmentName; timeoutMs: number },
): Promise<string> {
  const answer = await withDeadline(options.timeoutMs, (signal) =>
    client.send(credentials, {
      operation: "test_notification",
      method: "POST",
      path: "/inApps/v1/notifications/test",
      idempotent: false,
    }, { environment: options.environment, signal }));
  if (answer.kind === "not_found") throw new NotificationUrlMissingError(options.environment);
  const body = ok(answer, options.environment);
  if (typeof body?.testNotificationToken !== "string" || body.testNotificationToken === "") {
    throw malformedAnswer("without a testNotificationToken");
  }
  return body.testNotificationToken;
}

/**
 * What became of the test notification of `token`: its signed payload and Apple's attempts so
 * far, or null while Apple does not know the token yet.
 */
export async function testNotificationStatus(
  client: StoreaApiClient,
  credentials: StoreaCredentials,
  token: string,
  options: { environment: StoreaEnvironmentName; timeoutMs: number },
): Promise<TestNotificationStatus | null> {
  const answer = await withDeadline(options.timeoutMs, (signal) =>
    client.send(credentials, {
      operation: "test_notification_status",
      method: "GET",
      path: `/inApps/v1/notifications/test/${encodeURIComponent(token)}`,
      idempotent: true,
    }, { environment: options.environment, signal }));
  if (answer.kind === "not_found") return null;
  const body = ok(answer, options.environment);
  if (typeof body?.signedPayload !== "string" || !Array.isArray(body.sendAttempts)) {
    throw malformedAnswer("a test notification status without signedPayload or sendAttempts");
  }
  return {
    signedPayload: body.signedPayload,
    sendAttempts: body.sendAttempts.filter(isJsonObject).map((attempt) => ({
      attemptDate: typeof attempt.attemptDate === "number" && Number.isFinite(attempt.attemptDate)
        ? new Date(attempt.attemptDate).toISOString()
        : null,
      sendAttemptResult: typeof attempt.sendAttemptResult === "string"
        ? attempt.sendAttemptResult
        : "OTHER",
    })),
  };
}

/** The body of a 2xx answer; a 401 is the tenant's key, which the operator must fix. */
function ok(
  answer: StoreaAnswer,
  environment: StoreaEnvironmentName,
): Record<string, unknown> | null {
  if (answer.kind === "ok") return answer.body;
  if (answer.kind === "unauthorized") {
    throw keyRefused(environment);
  }
  throw new ServiceError("APPLE_API_ERROR", "the App Store refused the request (400)", {
    details: {
      status: 400,
      upstreamCode: answer.kind === "bad_request" ? answer.upstreamCode : null,
    },
  });
}

async function withDeadline<T>(ms: number, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const { signal, clear } = timeoutSignal(ms);
  try {
    return await work(signal);
  } finally {
    clear();
  }
}
