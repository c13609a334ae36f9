/**
 * Store A's notification history read back (docs/recovery.md, "Recovering missed
 * notifications"): Get Notification History, page by page, and each notification it lists taken
 * through the receiver's path: the same JWS, chain and bundle checks (as read from Apple, so
 * without the receiver's age limit), the same event, the same ingest with dedup on
 * `notificationUUID`. A new one is stored and delivered like one Apple posted; a known one changes
 * nothing; an invalid one is counted and logged, never relayed. Apple's failed attempts to post
 * are collected for the caller to report.
 */
import { ServiceError } from "../errors.ts";
import { timeoutSignal } from "../lib/abort.ts";
import type { StoreaCredentials } from "../storea/credentials.ts";
import {
  getNotificationHistory,
  type NotificationSendAttempt,
  type StoreaApiClient,
  type StoreaEnvironmentName,
} from "../storea/api_client.ts";
import type { StoreaJwsVerifier } from "../storea/jws.ts";
import { verifyStoreaNotification } from "../storea/notification.ts";
import { keyRefused } from "../storea/lookup.ts";
import { storeaEvent } from "../events/store_events.ts";
import { unstorableColumn } from "../events/ingest.ts";
import {
  PageTokenRefused,
  type RecoveryStoring,
  type RecoveryTally,
  type RecoveryWindow,
  storeRecovered,
  type WindowEnd,
} from "./window.ts";

/** Apple's errorCodes for a pagination token it does not take (invalid, expired). */
const PAGINATION_TOKEN_REFUSALS = new Set([4000014, 4000017]);

/** What reading store A's history needs. */
export interface StoreaRecoveryContext extends RecoveryStoring {
  client: StoreaApiClient;
  jws: StoreaJwsVerifier;
  /** One call's deadline, its retry included (`UPSTREAM_TIMEOUT`). */
  timeoutMs: number;
}

/** A window of one tenant's store A history, in one environment. */
export interface StoreaWindow extends RecoveryWindow {
  credentials: StoreaCredentials;
  environment: StoreaEnvironmentName;
  /** Only what Apple failed to deliver (`onlyFailures`), or every notification. */
  onlyFailures: boolean;
}

/** How a store A window's reading ended. */
export interface StoreaWindowEnd extends WindowEnd {
  /**
   * Production answered 401 while the tenant's setting is `auto`: an app not released there has
   * no production history. Nothing was read.
   */
  notReleased: boolean;
}

/**
 * Reads `window` of the tenant's notification history, at most `window.maxPages` pages, adding
 * what it found to `tally` (as it goes, so a run that fails still says what it did) and each failed
 * send attempt to `failedAttempts`.
 * @throws {ServiceError} the client's errors (429 `RATE_LIMITED`, 502 `APPLE_API_ERROR`), and 502
 * for a 401 or a refusal other than of the page token.
 * @throws {PageTokenRefused} when Apple no longer takes `window.pageToken` or a later one.
 */
export async function readStoreaHistory(
  context: StoreaRecoveryContext,
  window: StoreaWindow,
  tally: RecoveryTally,
  failedAttempts: NotificationSendAttempt[],
): Promise<StoreaWindowEnd> {
  const query = {
    startDate: window.startMs,
    endDate: window.endMs,
    ...(window.onlyFailures ? { onlyFailures: true } : {}),
  };
  let token = window.pageToken;
  for (let page = 0; page < window.maxPages; page++) {
    window.signal.throwIfAborted();
    const deadline = timeoutSignal(context.timeoutMs);
    tally.storeCalls++;
    let answer;
    try {
      answer = await getNotificationHistory(context.client, window.credentials, query, {
        environment: window.environment,
        signal: AbortSignal.any([deadline.signal, window.signal]),
        ...(token === null ? {} : { paginationToken: token }),
      });
    } finally {
      deadline.clear();
    }
    if (answer.kind === "unauthorized") {
      if (window.environment === "production" && window.credentials.environment === "auto") {
        return { nextPageToken: null, notReleased: true };
      }
      throw keyRefused(window.environment);
    }
    if (answer.kind === "refused") {
      if (token !== null && PAGINATION_TOKEN_REFUSALS.has(answer.upstreamCode ?? 0)) {
        throw new PageTokenRefused(
          `the App Store no longer takes the page token (errorCode ${answer.upstreamCode})`,
        );
      }
      throw new ServiceError(
        "APPLE_API_ERROR",
        `the App Store refused the history request${
          answer.errorMessage === null ? "" : `: ${answer.errorMessage}`
        }`,
        { details: { status: 400, upstreamCode: answer.upstreamCode } },
      );
    }
    if (answer.hasMore && answer.paginationToken === null) {
      throw new ServiceError("APPLE_API_ERROR", "the App Store said hasMore without a token", {
        details: { status: 200, upstreamCode: null },
      });
    }
    tally.pages++;
    for (const record of answer.records) {
      window.signal.throwIfAborted();
      tally.checked++;
      for (const attempt of record.sendAttempts) {
        if (attempt.sendAttemptResult === "SUCCESS") continue;
        failedAttempts.push(attempt);
        const result = attempt.sendAttemptResult;
        tally.failedSendAttempts[result] = (tally.failedSendAttempts[result] ?? 0) + 1;
      }
      await recoverOne(context, window, record.signedPayload, tally);
    }
    token = answer.hasMore ? answer.paginationToken : null;
    await window.afterPage?.(token);
    if (token === null) return { nextPageToken: null, notReleased: false };
  }
  return { nextPageToken: token, notReleased: false };
}

/** Takes one listed notification through the receiver's path. */
async function recoverOne(
  context: StoreaRecoveryContext,
  window: StoreaWindow,
  signedPayload: unknown,
  tally: RecoveryTally,
): Promise<void> {
  const { tenantId, environment } = window;
  const refuse = (error: string, message: string) => {
    tally.invalid++;
    context.log.warn("recovery_notification_invalid", {
      tenantId,
      store: "storea",
      environment,
      via: context.via,
      error,
      message,
    });
  };
  if (typeof signedPayload !== "string" || signedPayload === "") {
    refuse("SIGNATURE_INVALID", "the history record has no signedPayload");
    return;
  }
  let verified;
  try {
    verified = await verifyStoreaNotification(context.jws, signedPayload, window.credentials, {
      via: "store-history",
    });
  } catch (error) {
    // What the receiver answers 4xx to; anything else (the engine failing) ends the run.
    if (!(error instanceof ServiceError) || error.status >= 500) throw error;
    refuse(error.code, error.message);
    return;
  }
  const event = storeaEvent(tenantId, verified);
  const unstorable = unstorableColumn(event);
  if (unstorable !== null) {
    refuse("INVALID_REQUEST", unstorable);
    return;
  }
  await storeRecovered(context, event, tally, { source: "storea", environment });
}
