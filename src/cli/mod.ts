/**
 * The admin CLI: the command table and the dispatcher. Each row of {@linkcode COMMAND_GROUPS}
 * is one command (its words, summary, arguments, options, description and handler); the help
 * text and the reference in docs/operations.md ("Admin CLI") are made from it. Adding a command
 * is a row here, a handler in the module of its group, and a test.
 *
 * Exit codes: 0 success, 1 a failed command or a missing target, 2 bad usage. Output: one JSON
 * object on stdout, errors as `{"error", "message"}` on stderr, when piped; readable text on a
 * terminal or with `--pretty` (src/cli/output.ts).
 * @module
 */
import { ConfigError } from "../config.ts";
import { BUILD_VERSION } from "../version.ts";
import { errorCode } from "../errors.ts";
import {
  type GlobalFlags,
  parseCommandArgs,
  resolveCommand,
  type Resolved,
  unknownCommand,
} from "./args.ts";
import {
  type CliContext,
  CommandError,
  type CommandGroup,
  commandName,
  type CommandSpec,
  UsageError,
} from "./command.ts";
import { commandHelp, groupHelp, overviewHelp } from "./help.ts";
import {
  type ErrorReport,
  formatError,
  formatValue,
  type OutputStyle,
  outputStyles,
  type Terminals,
  usageReport,
  writeText,
} from "./output.ts";
import { WEBHOOK_SECRET_OPTIONS } from "./inputs.ts";
import { migrateDatabase, showVersion } from "./service.ts";
import {
  activateTenant,
  createTenant,
  deactivateTenant,
  listAllTenants,
  rotateSecret,
  setCallback,
  setEvents,
  setStateFetch,
  showTenant,
} from "./tenant.ts";
import { createKey, listKeys, revokeKey } from "./key.ts";
import { setStoreaCredentials, setStorebCredentials } from "./credentials.ts";
import { listAllDeliveries, retryDeliveries, showDelivery } from "./deliveries.ts";
import { testWebhook } from "./webhook.ts";
import { testStoreaNotification } from "./storea_test_notification.ts";
import { lookupAudit } from "./audit.ts";
import { triggerNotification } from "./trigger.ts";
import { recoverNotifications } from "./notifications.ts";
import { runRetention } from "./retention.ts";
import { rotateKey } from "./encryption.ts";

export type { CliContext } from "./command.ts";
export { CommandError, UsageError } from "./command.ts";
export { openForCli } from "./database.ts";

const DELIVERY_STATUSES = ["pending", "delivered", "failed"] as const;

/** Every command, by group, in the order help and the reference show them. */
export const COMMAND_GROUPS: readonly CommandGroup[] = [
  {
    title: "Service",
    commands: [
      {
        words: ["serve"],
        summary: "run the service: HTTP API, receivers, deliveries",
        description:
          "Applies pending migrations, then answers HTTP on HOST:PORT and sends deliveries, logging JSON lines on stdout, until SIGTERM or SIGINT. With `migrate`, the only command that changes the database schema. It must be named: with no command at all, the program prints the help.",
      },
      {
        words: ["migrate"],
        summary: "apply pending database migrations",
        description:
          "Applies the migration files of this version that the database lacks, in one transaction under an advisory lock, and seals the encryption canary of a new database. Prints `{applied, engine}`: the files this command applied (empty when there were none) and `postgresql` or `embedded`. Run it once per upgrade, before the new replicas start.",
        run: migrateDatabase,
      },
      {
        words: ["version"],
        summary: "print the version",
        description:
          "Prints `{version}`: `SERVICE_VERSION`, else the version stamped into the build. Opens no database.",
        run: showVersion,
      },
      {
        words: ["help"],
        summary: "show the commands, or one command's options",
        args: ["[WORD]", "[WORD]"],
        usage: ["[COMMAND]"],
        description:
          "Prints the list of commands, or the help of one command (`help tenant create`, the same as `tenant create --help`) or of a group (`help tenant`), as text on stdout.",
      },
    ],
  },
  {
    title: "Tenants",
    commands: [
      {
        words: ["tenant", "create"],
        summary: "create a tenant",
        options: {
          name: { value: "NAME", summary: "the tenant's name, for people", required: true },
          "callback-url": {
            value: "URL",
            summary: "where deliveries go; a webhook secret is set with it",
          },
          ...WEBHOOK_SECRET_OPTIONS,
        },
        description:
          "Prints `{id, name, active, callbackUrl, webhookSecret, createdAt}`; `webhookSecret` only with a callback URL, generated unless given. It is printed once, here: give it to the tenant.",
        run: createTenant,
      },
      {
        words: ["tenant", "list"],
        summary: "list the tenants",
        description: "Prints `{tenants: [...]}`.",
        run: listAllTenants,
      },
      {
        words: ["tenant", "show"],
        summary: "show a tenant and its store credentials",
        args: ["ID"],
        description:
          "Prints the tenant with its `storea` and `storeb` credential summaries; never a secret.",
        run: showTenant,
      },
      {
        words: ["tenant", "set-callback"],
        summary: "set a tenant's callback URLs (and webhook secret)",
        args: ["ID"],
        options: {
          url: { value: "URL", summary: "where deliveries go" },
          "sandbox-url": {
            value: "URL",
            summary: "where store A Sandbox notifications go instead; none removes it",
          },
          ...WEBHOOK_SECRET_OPTIONS,
        },
        description:
          'Sets `--url`, `--sandbox-url`, or both (at least one). Prints `{id, callbackUrl, sandboxCallbackUrl, webhookSecret, updatedAt}`; `webhookSecret` only when newly set: generated when the tenant has none, else the existing one is kept unless one is given. A given secret replaces the old one at once, with no grace period; `tenant rotate-secret` changes it without breaking the tenant\'s verification. Both URLs are checked alike and signed with the same secret (docs/configuration.md, "Routing deliveries").',
        run: setCallback,
      },
      {
        words: ["tenant", "set-events"],
        summary: "choose which events a tenant's callback gets",
        args: ["ID"],
        options: {
          events: {
            value: "LIST",
            summary: "event names and prefix.* patterns, comma-separated; all for every event",
            required: true,
          },
        },
        description:
          'Prints `{id, events, updatedAt}` (`events` null: every event). An event that matches none is still verified and stored, and its delivery stored failed without being sent; `deliveries retry` sends it anyway. A name or pattern that matches no event of the catalog is refused (`INVALID_EVENT_FILTER`) (docs/configuration.md, "Routing deliveries").',
        run: setEvents,
      },
      {
        words: ["tenant", "set-state-fetch"],
        summary: "turn the store B state on deliveries on or off",
        args: ["ID"],
        options: {
          storeb: {
            value: "on|off",
            summary: "fetch the purchase for each store B delivery",
            required: true,
          },
        },
        description:
          'Prints `{id, storebStateFetch, updatedAt}`. On (the default), each store B subscription or one-time notification costs one Play Developer API call, made before its first attempt, to put the purchase in the delivery\'s `state`; off, `state` is null (docs/deliveries.md, "State on every delivery").',
        run: setStateFetch,
      },
      {
        words: ["tenant", "rotate-secret"],
        summary: "replace a tenant's webhook secret, with a grace period",
        args: ["ID"],
        options: {
          grace: {
            value: "DURATION",
            summary: "how long the old secret keeps signing, such as 30m, 24h or 7d",
            default: "24h",
          },
        },
        description:
          "Prints `{id, webhookSecret, previousSecretValidUntil, updatedAt}`: a new secret, printed once. Until `previousSecretValidUntil` deliveries carry two `v1=` signatures, the new one first. Needs a callback URL (`NO_CALLBACK_URL`).",
        run: rotateSecret,
      },
      {
        words: ["tenant", "deactivate"],
        summary: "stop a tenant: keys refused, deliveries held",
        args: ["ID"],
        description:
          'Prints the tenant. Within a second every replica refuses its API keys (401) and its notifications (404), and its queued deliveries wait (docs/relay.md, "Inactive tenants").',
        run: deactivateTenant,
      },
      {
        words: ["tenant", "activate"],
        summary: "start a deactivated tenant again",
        args: ["ID"],
        description:
          "Prints the tenant. Its keys work again, and the running dispatchers are woken so that its waiting deliveries go out at once.",
        run: activateTenant,
      },
    ],
  },
  {
    title: "API keys",
    commands: [
      {
        words: ["key", "create"],
        summary: "create an API key for a tenant",
        args: ["TENANT_ID"],
        options: {
          env: {
            value: "live|test",
            summary: "the key's environment",
            choices: ["live", "test"],
            default: "live",
          },
          name: { value: "NAME", summary: "a label for people, such as staging-backend" },
        },
        description:
          "Prints `{id, tenantId, name, env, key, createdAt}`. The key is printed once, here.",
        run: createKey,
      },
      {
        words: ["key", "list"],
        summary: "list a tenant's API keys",
        args: ["TENANT_ID"],
        description:
          "Prints `{keys: [{id, name, env, prefix, createdAt, lastUsedAt, revokedAt}]}`; never the keys.",
        run: listKeys,
      },
      {
        words: ["key", "revoke"],
        summary: "revoke an API key",
        args: ["KEY_ID"],
        description:
          "Prints `{id, revokedAt}`. Every replica refuses the key within a second. Revoking again prints the first revocation's time.",
        run: revokeKey,
      },
    ],
  },
  {
    title: "Store credentials",
    commands: [
      {
        words: ["storea", "set-credentials"],
        summary: "set a tenant's store A (App Store) credentials",
        args: ["TENANT_ID"],
        options: {
          "bundle-id": { value: "ID", summary: "the app's bundle id", required: true },
          "key-id": { value: "KID", summary: "the In-App Purchase key's id", required: true },
          "issuer-id": {
            value: "UUID",
            summary: "the App Store Connect issuer id",
            required: true,
          },
          "private-key-file": {
            value: "PATH|-",
            summary: "the key's .p8 file (EC P-256), or `-` for standard input",
            required: true,
          },
          environment: {
            value: "auto|production|sandbox",
            summary: "which App Store environment to ask; auto tries production, then sandbox",
            choices: ["auto", "production", "sandbox"],
            default: "auto",
          },
          "app-id": { value: "NUMBER", summary: "the app's Apple id, checked in notifications" },
        },
        description:
          'Checks the key file before writing (`INVALID_PRIVATE_KEY`), seals it, and prints `{tenantId, storea}`: the summary `tenant show` prints, never the key. What each value is and where to find it: docs/configuration.md, "Store credentials".',
        run: setStoreaCredentials,
      },
      {
        words: ["storeb", "set-credentials"],
        summary: "set a tenant's store B (Google Play) credentials",
        args: ["TENANT_ID"],
        options: {
          "package-name": { value: "NAME", summary: "the app's package name", required: true },
          "service-account-file": {
            value: "PATH|-",
            summary: "the service account's JSON key file, or `-` for standard input",
            required: true,
          },
          "push-audience": {
            value: "AUDIENCE",
            summary: "the audience of the Pub/Sub push subscription's tokens",
            required: true,
          },
          "push-service-account": {
            value: "EMAIL",
            summary: "the service account the push subscription signs its tokens as",
            required: true,
          },
        },
        description:
          'Checks the file before writing (`INVALID_SERVICE_ACCOUNT`), seals it, and prints `{tenantId, storeb}`, never the key. The push service account is required: anyone can create a push subscription with any audience, so the token\'s account is what authenticates the sender (docs/configuration.md, "Store credentials").',
        run: setStorebCredentials,
      },
    ],
  },
  {
    title: "Deliveries",
    commands: [
      {
        words: ["deliveries", "list"],
        summary: "list deliveries, newest first",
        options: {
          tenant: { value: "ID", summary: "only this tenant's" },
          status: {
            value: "pending|delivered|failed",
            summary: "only those in this status",
            choices: DELIVERY_STATUSES,
          },
          limit: { value: "N", summary: "at most N, from 1 to 10000", default: "50" },
        },
        description: "Prints `{deliveries: [...]}`, newest first.",
        run: listAllDeliveries,
      },
      {
        words: ["deliveries", "show"],
        summary: "show a delivery with its payload and attempts",
        args: ["ID|EVENT_ID"],
        description:
          "Takes the delivery's id (`dlv_...`) or its event's id (`evt_...`, the `eventId` a tenant sees). Prints the delivery with its `payload` and `attemptLog` (every attempt: `attemptedAt`, `durationMs`, `responseCode`, `responseBody`, `error`).",
        run: showDelivery,
      },
      {
        words: ["deliveries", "retry"],
        summary: "send deliveries again now, with a fresh retry schedule",
        args: ["[ID|EVENT_ID]"],
        usage: ["ID|EVENT_ID", "--tenant ID --status pending|delivered|failed [--since TIME]"],
        options: {
          tenant: { value: "ID", summary: "every delivery of this tenant in --status" },
          status: {
            value: "pending|delivered|failed",
            summary: "with --tenant: the status of the deliveries to retry",
            choices: DELIVERY_STATUSES,
          },
          since: {
            value: "TIME",
            summary: "with --tenant: only those created at or after this ISO-8601 time",
          },
        },
        description:
          "Prints `{queued: [...]}`: the deliveries given an immediate attempt and a fresh retry schedule, one by id or event id, or every one of a tenant in a status. The running services' dispatchers are woken through the database; a delivery being sent at that moment is left alone (`DELIVERY_IN_FLIGHT` for one given by id).",
        run: retryDeliveries,
      },
      {
        words: ["webhook", "test"],
        summary: "send a signed test event to a tenant's callback URL",
        args: ["TENANT_ID"],
        description:
          "Sends a signed test event (`event` `test`, `platformEvent` `service.test`, `source` `service`) from the CLI straight to the callback URL, exactly as a delivery is sent, and stores nothing. Prints `{tenantId, callbackUrl, eventId, delivered, responseCode, responseBody, networkError, durationMs}`; when the answer is not 2xx it exits 1 with `WEBHOOK_TEST_FAILED` and the same fields, `networkError` saying why no answer came.",
        run: testWebhook,
      },
      {
        words: ["storea", "test-notification"],
        summary: "ask the App Store for a test notification, follow it",
        options: {
          tenant: { value: "ID", summary: "the tenant whose app is tested", required: true },
          environment: {
            value: "production|sandbox",
            summary: "the App Store environment; default the tenant's, production for auto",
            choices: ["production", "sandbox"],
          },
          wait: {
            value: "DURATION",
            summary: "how long to wait for the App Store's attempt, up to 10m",
            default: "60s",
          },
        },
        description:
          "Checks the whole chain, App Store -> service -> tenant: asks the App Store (Request a Test Notification, with the tenant's key) to send a TEST notification to the app's notification URL, polls its status until Apple reports an attempt (at most --wait), verifies the payload Apple reports, and looks for it in this service's events and for its delivery. Prints `{tenantId, environment, testNotificationToken, sendAttempts: [{attemptDate, sendAttemptResult}], received, eventId, delivery}`: `received` is true when this service stored that notification for the tenant, `delivery` its delivery's `{status, responseCode}` once the first attempt is recorded (null without a callback URL). Exits 0 when Apple reached the service and the delivery, if any, succeeded; otherwise 1 with the same fields, `failedHop` (`app_store_api`, `app_store`, `app_store_to_service`, `service` or `service_to_tenant`) and a code saying what failed (docs/configuration.md, \"Checking the notification chain\").",
        run: testStoreaNotification,
      },
    ],
  },
  {
    title: "Recovery",
    commands: [
      {
        words: ["notifications", "recover"],
        summary: "store and deliver what the stores failed to deliver",
        options: {
          tenant: {
            value: "ID",
            summary: "the tenant whose notifications to recover",
            required: true,
          },
          since: {
            value: "TIME",
            summary: "the window's start, an ISO-8601 time",
            required: true,
          },
          until: { value: "TIME", summary: "the window's end, an ISO-8601 time; default now" },
          store: {
            value: "storea|storeb",
            summary: "only this store; default every store the tenant has credentials for",
            choices: ["storea", "storeb"],
          },
          environment: {
            value: "production|sandbox",
            summary: "store A: only this environment; default the tenant's, both for auto",
            choices: ["production", "sandbox"],
          },
          all: {
            value: "",
            flag: true,
            summary:
              "store A: every notification of the window, not only those Apple failed to deliver",
          },
        },
        description:
          "Reads the stores' own records of the window, as the service does every `RECOVERY_INTERVAL` from its checkpoints: store A's notification history (only what Apple failed to deliver, unless `--all`) and store B's voided purchases. Each notification takes the receiver's path: verified, then stored and delivered like one the store posted when it is new; a known one changes nothing; an invalid one is counted and logged, never relayed. The running services' dispatchers are woken to send what was stored. The window may reach as far back as the store keeps (store A: 180 days in production, 30 in sandbox; store B: 30 days) and the service remembers what it stored (`EVENT_RETENTION_DAYS`). Prints one line per store, `{tenantId, store, checked, recovered, known, invalid, failedSendAttempts}`: the records read, the new ones stored, the known ones, the invalid ones, and Apple's failed attempts to post by `sendAttemptResult` (`{}` for store B). A store's failure exits 1 with its code and what was done until then (docs/recovery.md, \"Recovering missed notifications\").",
        run: recoverNotifications,
      },
    ],
  },
  {
    title: "Validation audit",
    commands: [
      {
        words: ["audit", "lookup"],
        summary: "find the audit rows of one transaction id or token",
        args: ["TENANT_ID"],
        options: {
          subject: {
            value: "TRANSACTION_ID_OR_TOKEN",
            summary: "the store A transaction id or store B purchase token",
            required: true,
          },
          limit: { value: "N", summary: "at most N rows, from 1 to 10000", default: "100" },
        },
        description:
          'Prints `{tenantId, subjectHash, entries}`, newest first. The audit keeps ids only as keyed hashes; the given one is hashed the same way (docs/configuration.md, "Validation audit").',
        run: lookupAudit,
      },
    ],
  },
  {
    title: "Maintenance",
    commands: [
      {
        words: ["retention", "run"],
        summary: "delete old events, deliveries, attempts and audit rows now",
        description:
          'Runs now the prunes the service runs every hour (events) and every day (audit), with this command\'s configuration: finished deliveries untouched for `EVENT_RETENTION_DAYS` with their attempts and events (an event a store may still send again keeps its key, emptied of its payload), and audit rows older than `VALIDATION_AUDIT_RETENTION_DAYS`; pending deliveries are never deleted. In small paced batches, safe beside running replicas. Prints `{eventRetentionDays, deliveries, attempts, events, eventKeysKept, auditRetentionDays, auditRows}`: the retention periods (`0` and `null` keep forever), the rows deleted, and the events emptied whose keys are kept (docs/relay.md, "Retention").',
        run: runRetention,
      },
      {
        words: ["encryption", "rotate-key"],
        summary: "seal every stored secret again with ENCRYPTION_KEY",
        description:
          'Opens every sealed value (store credentials, webhook secrets current and previous, the encryption canary, the audit hash key) and seals it again with `ENCRYPTION_KEY`, in one transaction; values sealed with another key must open with `ENCRYPTION_KEY_PREVIOUS`, or nothing is changed (`SECRETS_UNREADABLE`, with the `unreadable` values). Values already sealed with `ENCRYPTION_KEY` are left alone, so running it again is harmless. Safe while replicas run with `ENCRYPTION_KEY` and `ENCRYPTION_KEY_PREVIOUS` set as here. Prints `{keyId, previousKeyId, resealed, alreadyCurrent}`: the key ids (fingerprints, not keys) and the values sealed again, by kind. The procedure: docs/maintenance.md, "Rotating `ENCRYPTION_KEY`".',
        run: rotateKey,
      },
    ],
  },
  {
    title: "Development",
    commands: [
      {
        words: ["trigger"],
        summary: "have the store simulators send a notification (dev only)",
        args: ["STORE", "TYPE"],
        usage: [
          "storea NOTIFICATION_TYPE [--subtype SUBTYPE] [--lost yes|RESULT] --tenant ID",
          "storeb subscription.N|one_time_product.N|voided_purchase|test --tenant ID",
          "storeb voided_purchase --lost yes --tenant ID",
        ],
        options: {
          tenant: {
            value: "ID",
            summary: "the tenant whose receiver gets the notification",
            required: true,
          },
          subtype: {
            value: "SUBTYPE",
            summary:
              "store A: the subtype, such as VOLUNTARY; store B voided_purchase: full_refund (the default) or partial_refund",
          },
          lost: {
            value: "yes|RESULT",
            summary:
              "lose it on the way: the store keeps it (store A with a failed attempt, TIMED_OUT for yes or the RESULT given, such as NO_RESPONSE; store B voided_purchase only) and the service's recovery finds it",
          },
        },
        description:
          "Needs a running `deno task dev` on the same `DATA_DIR`: its store simulators make a notification of any type the event catalog names (docs/events.md), signed with keys only the service it started trusts, and the command posts it to that service's receiver for the tenant, as the store would. The service stores it and delivers it to the tenant's callback URL like any notification. Prints `{tenantId, store, type, subtype, receiverUrl, eventId, isNew, event, reason, platformEvent, subject, callbackUrl, delivery}`, `delivery` once its first attempt is recorded (`{id, status, attempts, responseCode, error, nextAttemptAt}`; null without a callback URL). Refused with `DEV_ONLY` when NODE_ENV is production and with `SIMULATORS_NOT_RUNNING` without `deno task dev`, before anything is signed (docs/testing.md, \"Testing locally\"). With `--lost`, nothing is posted: the store's simulator keeps the notification as one it failed to deliver (store A: in its notification history, with a failed attempt; store B: a voided purchase, in its list), and the command waits up to 90 s for the service's recovery to find it, then prints `{tenantId, store, type, subtype, lost, externalId, recovered, eventId, event, reason, platformEvent, subject, callbackUrl, delivery}` (`recovered` false, with a `hint`, when it was not found in time; docs/recovery.md, \"Recovering missed notifications\").",
        run: triggerNotification,
      },
    ],
  },
];

/** Every command, in table order. */
export const COMMANDS: readonly CommandSpec[] = COMMAND_GROUPS.flatMap((group) => group.commands);

const NO_FLAGS: GlobalFlags = { help: false, pretty: false, json: false };

/** Runs one admin command line; returns the exit code. */
export async function runCli(
  argv: string[],
  context: CliContext,
  terminals: Terminals = { stdout: Deno.stdout.isTerminal(), stderr: Deno.stderr.isTerminal() },
): Promise<number> {
  let styles = outputStyles(NO_FLAGS, terminals);
  let command: CommandSpec | null = null;
  try {
    const resolved = resolveCommand(argv, COMMANDS);
    if (!(resolved.flags.pretty && resolved.flags.json)) {
      styles = outputStyles(resolved.flags, terminals);
    }
    command = resolved.command;
    if (resolved.version) {
      if (command !== null || resolved.words.length > 0) {
        throw new UsageError("--version takes no command; use the version command");
      }
      await writeText(Deno.stdout, formatValue({ version: versionOf(context) }, styles.stdout));
      return 0;
    }
    const help = helpAsked(resolved, context);
    if (help !== null) {
      await writeText(Deno.stdout, help);
      return 0;
    }
    if (command === null) throw unknownCommand(resolved.words, COMMANDS);
    const { input, flags } = parseCommandArgs(command, resolved.rest);
    const merged = {
      help: flags.help,
      pretty: resolved.flags.pretty || flags.pretty,
      json: resolved.flags.json || flags.json,
    };
    if (merged.pretty && merged.json) throw new UsageError("give --pretty or --json, not both");
    styles = outputStyles(merged, terminals);
    if (merged.help) {
      await writeText(Deno.stdout, commandHelp(command));
      return 0;
    }
    if (command.words[0] === "help") {
      await writeText(Deno.stdout, helpOf(input.positionals, context));
      return 0;
    }
    if (!command.run) throw new UsageError(`${commandName(command)} takes no arguments or options`);
    const output = await command.run(input, context);
    await writeText(Deno.stdout, formatValue(output, styles.stdout));
    return 0;
  } catch (error) {
    return await reportError(error, command, styles.stderr);
  }
}

/** The help a command line asks for (no command at all, or `--help`); null to go on. */
function helpAsked(resolved: Resolved, context: CliContext): string | null {
  const { command, words, rest, flags } = resolved;
  if (command !== null) return flags.help ? commandHelp(command) : null;
  if (words.length === 0) return overviewHelp(COMMAND_GROUPS, versionOf(context));
  const group = words.length === 1 && COMMANDS.some((c) => c.words[0] === words[0]);
  if (group && (flags.help || rest.includes("--help") || rest.includes("-h"))) {
    return groupHelp(words[0], COMMANDS);
  }
  return null;
}

/** `help [COMMAND]`: the overview, a group's or a command's help. */
function helpOf(words: string[], context: CliContext): string {
  if (words.length === 0) return overviewHelp(COMMAND_GROUPS, versionOf(context));
  const name = words.join(" ");
  const command = COMMANDS.find((candidate) => commandName(candidate) === name);
  if (command) return commandHelp(command);
  if (words.length === 1 && COMMANDS.some((c) => c.words[0] === words[0])) {
    return groupHelp(words[0], COMMANDS);
  }
  throw unknownCommand(words, COMMANDS);
}

/** The version for help: the configured one, or the build's when the configuration is invalid. */
function versionOf(context: CliContext): string {
  try {
    return context.config.version;
  } catch (error) {
    if (error instanceof ConfigError) return BUILD_VERSION;
    throw error;
  }
}

/** Turns an error into its report on stderr and the exit code: the one place that does. */
async function reportError(
  error: unknown,
  command: CommandSpec | null,
  style: OutputStyle,
): Promise<number> {
  let report: ErrorReport;
  let exitCode = 1;
  if (error instanceof UsageError) {
    const about = error.command ?? command;
    const help = about ? `purchase-relay ${commandName(about)} --help` : "purchase-relay help";
    report = usageReport(error, help);
    exitCode = 2;
  } else if (error instanceof CommandError) {
    report = { error: error.code, message: error.message, details: error.details };
  } else {
    // Errors of the modules a command runs (database, configuration, files) keep their code.
    report = {
      error: errorCode(error, "COMMAND_FAILED"),
      message: error instanceof Error ? error.message : String(error),
    };
  }
  await writeText(Deno.stderr, formatError(report, style));
  return exitCode;
}
