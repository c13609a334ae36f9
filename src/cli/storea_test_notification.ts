/**
 * `storea test-notification --tenant ID [--environment production|sandbox] [--wait DURATION]`:
 * checks the whole notification chain, App Store -> service -> tenant, in one command
 * (docs/configuration.md, "Checking the notification chain"). It asks the App Store to send a TEST
 * notification to the app's notification URL, waits for Apple's attempt, then looks in the
 * database for that notification (by the UUID of the payload Apple reports, once verified) and
 * for its delivery to the tenant's callback URL.
 * @module
 */
import { ConfigError, parseDuration } from "../config.ts";
import { RelayError, ServiceError } from "../errors.ts";
import type { Database } from "../db/connect.ts";
import { loadCredentials } from "../db/credentials.ts";
import type { StoreaCredentials } from "../storea/credentials.ts";
import { NO_CALLBACK_ERROR } from "../delivery/enqueue.ts";
import { selectEs256Engine } from "../crypto/es256.ts";
import { StoreaApiClient, type StoreaEnvironmentName } from "../storea/api_client.ts";
import { StoreaTokenSigner } from "../storea/api_token.ts";
import { readRootCertificates, StoreaJwsVerifier } from "../storea/jws.ts";
import { verifyStoreaNotification } from "../storea/notification.ts";
import {
  requestTestNotification,
  type SendAttempt,
  type TestNotificationStatus,
  testNotificationStatus,
} from "../storea/test_notification.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import { mustFindTenant } from "./inputs.ts";

/** How often Apple is asked whether it has sent the notification yet. */
const POLL_INTERVAL_MS = 500;
/** How often the database is asked whether the delivery's first attempt is recorded. */
const DELIVERY_POLL_MS = 100;
/** The longest `--wait`: Apple attempts within seconds, or not at all in this command's life. */
const MAX_WAIT_MS = 10 * 60_000;

/** The hop of the chain that failed, as the error output names it. */
export type FailedHop =
  /** The App Store API refused or failed the request itself. */
  | "app_store_api"
  /** Apple made no attempt to send within the wait. */
  | "app_store"
  /** Apple's attempt did not succeed: the service did not answer it 2xx. */
  | "app_store_to_service"
  /** Apple was answered 2xx, but not by this service for this tenant. */
  | "service"
  /** The service's delivery to the tenant's callback URL failed. */
  | "service_to_tenant";

/** The command's output. */
interface ChainReport extends Record<string, unknown> {
  tenantId: string;
  environment: StoreaEnvironmentName;
  testNotificationToken: string | null;
  sendAttempts: SendAttempt[];
  received: boolean;
  eventId: string | null;
  delivery: { status: string; responseCode: number | null } | null;
}

/** `storea test-notification --tenant ID [--environment E] [--wait DURATION]` */
export async function testStoreaNotification(
  { options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const tenantId = options.tenant!;
  const waitMs = parseDuration(options.wait!);
  if (waitMs === null || waitMs <= 0 || waitMs > MAX_WAIT_MS) {
    throw new UsageError("--wait must be a duration from 1ms to 10m, such as 60s");
  }
  const config = context.config;
  const { db, box } = await context.open();
  await mustFindTenant(db, tenantId);
  const credentials = (await loadCredentials(db.sql, box, tenantId)).storea;
  if (credentials === null) {
    throw new CommandError(
      "CREDENTIALS_MISSING",
      `tenant ${tenantId} has no storea credentials; run storea set-credentials first`,
    );
  }
  const environment = (options.environment as StoreaEnvironmentName | undefined) ??
    (credentials.environment === "auto" ? "production" : credentials.environment);
  const report: ChainReport = {
    tenantId,
    environment,
    testNotificationToken: null,
    sendAttempts: [],
    received: false,
    eventId: null,
    delivery: null,
  };
  // Before Apple is asked to send anything: a root or engine that cannot be used stops here.
  const jws = await payloadVerifier(config.storeaRootCerts, config.cryptoEngine);
  const client = new StoreaApiClient({
    productionUrl: config.storeaApiUrlProduction,
    sandboxUrl: config.storeaApiUrlSandbox,
    tokens: new StoreaTokenSigner(),
  });
  const call = { environment, timeoutMs: config.upstreamTimeoutMs };

  report.testNotificationToken = await apiStep(
    report,
    () => requestTestNotification(client, credentials, call),
  );
  const status = await apiStep(
    report,
    () =>
      waitForAttempt(
        () => testNotificationStatus(client, credentials, report.testNotificationToken!, call),
        waitMs,
      ),
  );
  report.sendAttempts = status?.sendAttempts ?? [];
  if (report.sendAttempts.length === 0) {
    throw failed(
      report,
      "app_store",
      "TEST_NOTIFICATION_NOT_SENT",
      `the App Store made no attempt to send the test notification within ${options.wait}`,
    );
  }
  const uuid = await apiStep(report, () => notificationUuid(jws, status!, credentials));
  report.eventId = await storedEvent(db, tenantId, uuid);
  report.received = report.eventId !== null;
  if (!report.sendAttempts.some((a) => a.sendAttemptResult === "SUCCESS")) {
    const results = report.sendAttempts.map((a) => a.sendAttemptResult).join(", ");
    throw failed(
      report,
      "app_store_to_service",
      "TEST_NOTIFICATION_NOT_RECEIVED",
      `the App Store could not deliver the test notification to its notification URL (${results}): ` +
        "check the URL set in App Store Connect, that it reaches this service's store A receiver " +
        "for the tenant, and the service's logs",
    );
  }
  if (!report.received) {
    throw failed(
      report,
      "service",
      "TEST_NOTIFICATION_NOT_STORED",
      "the App Store's notification URL answered 2xx, but this service stored no such TEST " +
        "notification for the tenant: the URL points to another service, database or tenant",
    );
  }
  const delivery = await firstAttempt(db, report.eventId!, config.deliveryTimeoutMs + 5_000);
  report.delivery = delivery === null
    ? null
    : { status: delivery.status, responseCode: delivery.responseCode };
  if (delivery !== null && delivery.status !== "delivered") {
    const why = delivery.error ??
      (delivery.responseCode === null
        ? "no attempt was recorded in time"
        : `the callback answered ${delivery.responseCode}`);
    throw failed(
      report,
      "service_to_tenant",
      "TEST_DELIVERY_FAILED",
      `the service received the test notification, but its delivery to the tenant's callback URL failed: ${why}`,
    );
  }
  return report;
}

/** Runs a step that asks the App Store; its failure names the hop and keeps the report. */
async function apiStep<T>(report: ChainReport, step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (error) {
    if (!(error instanceof RelayError)) throw error;
    const details = error instanceof ServiceError ? error.details : undefined;
    throw new CommandError(error.code, `asking the App Store failed: ${error.message}`, {
      ...report,
      failedHop: "app_store_api",
      ...(details === undefined ? {} : { upstream: details }),
    });
  }
}

function failed(report: ChainReport, hop: FailedHop, code: string, message: string): CommandError {
  return new CommandError(code, message, { ...report, failedHop: hop });
}

/** Polls the status until Apple reports an attempt, or `waitMs` is over (the last status). */
async function waitForAttempt(
  poll: () => Promise<TestNotificationStatus | null>,
  waitMs: number,
): Promise<TestNotificationStatus | null> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const status = await poll();
    if ((status !== null && status.sendAttempts.length > 0) || Date.now() >= deadline) {
      return status;
    }
    await new Promise((resolve) =>
      setTimeout(resolve, Math.min(POLL_INTERVAL_MS, Math.max(0, deadline - Date.now())))
    );
  }
}

/**
 * The verifier of the payload Apple reports: the roots and engine the service uses
 * (`STOREA_ROOT_CERTS`, `CRYPTO_ENGINE`), so that it verifies as the receiver does.
 * @throws {ConfigError} when `STOREA_ROOT_CERTS` cannot be read, as the service refuses to boot.
 */
export async function payloadVerifier(
  rootPaths: string[],
  engine: Parameters<typeof selectEs256Engine>[0],
): Promise<StoreaJwsVerifier> {
  let rootCertificates: Uint8Array[] = [];
  if (rootPaths.length > 0) {
    try {
      rootCertificates = await readRootCertificates(rootPaths);
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      throw new ConfigError("STOREA_ROOT_CERTS", `cannot be used: ${reason}`);
    }
  }
  return new StoreaJwsVerifier({ rootCertificates, engine: await selectEs256Engine(engine) });
}

/**
 * The `notificationUUID` of the TEST notification Apple reports, once its signature, chain and
 * bundle verified as the receiver verifies them: it is the `external_id` the receiver stored.
 */
async function notificationUuid(
  jws: StoreaJwsVerifier,
  status: TestNotificationStatus,
  credentials: StoreaCredentials,
): Promise<string> {
  try {
    const verified = await verifyStoreaNotification(jws, status.signedPayload, credentials, {
      via: "store-history",
    });
    return verified.notificationUUID;
  } catch (error) {
    if (!(error instanceof ServiceError)) throw error;
    throw new ServiceError(
      "APPLE_API_ERROR",
      `the test notification the App Store reports did not verify: ${error.message}`,
      { details: { status: 200, upstreamCode: null }, cause: error },
    );
  }
}

/** The id of the store A event the tenant's receiver stored for `uuid`, or null. */
async function storedEvent(db: Database, tenantId: string, uuid: string): Promise<string | null> {
  const [row] = await db.sql`
    SELECT id FROM events
    WHERE tenant_id = ${tenantId} AND source = 'storea' AND external_id = ${uuid}`;
  return row ? row.id : null;
}

/**
 * The event's delivery once its first attempt is recorded (or as it is after `timeoutMs`); null
 * when none was made because the tenant had no callback URL.
 */
async function firstAttempt(
  db: Database,
  eventId: string,
  timeoutMs: number,
): Promise<{ status: string; responseCode: number | null; error: string | null } | null> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const [row] = await db.sql`
      SELECT status, attempts, last_response_code, last_error FROM deliveries
      WHERE event_id = ${eventId}`;
    if (!row) return null;
    if (row.status === "failed" && row.attempts === 0 && row.last_error === NO_CALLBACK_ERROR) {
      return null;
    }
    if (row.attempts > 0 || Date.now() >= deadline) {
      return {
        status: row.status,
        responseCode: row.last_response_code,
        error: row.last_error,
      };
    }
    await new Promise((resolve) => setTimeout(resolve, DELIVERY_POLL_MS));
  }
}
