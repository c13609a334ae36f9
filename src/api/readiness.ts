/**
 * The readiness of this process for `/ready` (docs/deploy.md, "Health checks"). `/ready`
 * needs no key, so a failing database is reported without detail: the database's own error text
 * (which names hosts, users and databases) goes to the log only, once per outage and then at most
 * once a minute. From the moment the process starts to drain, it is not ready, so that load
 * balancers stop sending it requests while it finishes those in flight.
 */
import { withDeadline } from "../lib/deadline.ts";
import type { Database } from "../db/connect.ts";
import { sealedKeyId, type SecretBox } from "../crypto/secrets.ts";
import { canaryOpens, readEncryptionCanary } from "../db/settings.ts";
import type { Logger } from "../observability/log.ts";
import type { EncryptionKeyName, ReadinessReport } from "./health.ts";

/** How long `/ready` waits for the database before reporting it failed. */
const READY_DB_TIMEOUT_MS = 2_000;
/**
 * How long one check's answer serves later probes. `/ready` needs no key: without this, each
 * probe was a query, and a flood of probes queued the receivers' statements behind its own.
 */
const READY_REUSE_MS = 500;
/** While the database stays down, its failure is logged at most this often, not per probe. */
const READY_FAILURE_LOG_INTERVAL_MS = 60_000;
/** The database check when it fails; the reason is in the `readiness_db_failed` log line. */
const READY_DB_FAILED = "fail: database unavailable, see the log";

/** The `/ready` checks of one process. */
export class Readiness {
  #db: Database;
  #box: SecretBox;
  #log: Logger;
  /** The last encryption verdict, kept for when the database cannot be asked. */
  #encryption = "fail: not checked yet";
  /** The key that opened the canary at the last check; null when none did. */
  #canaryOpensWith: EncryptionKeyName | null = null;
  /** Which key opens each sealed canary seen (it changes only when a rotation re-seals it). */
  #verdicts = new Map<string, EncryptionKeyName | null>();
  /** When the current outage was last logged (null while the database answers). */
  #failureLoggedAt: number | null = null;
  /** Probes that failed in the current outage. */
  #failedProbes = 0;
  #draining = false;
  /** The check under way, which every probe meanwhile shares. */
  #running: Promise<Omit<ReadinessReport, "draining">> | null = null;
  /** The last check's answer and when it came, reused for {@linkcode READY_REUSE_MS}. */
  #last: { report: Omit<ReadinessReport, "draining">; at: number } | null = null;

  constructor(db: Database, box: SecretBox, log: Logger) {
    this.#db = db;
    this.#box = box;
    this.#log = log;
  }

  /** From now on the process is not ready: it is shutting down. */
  startDraining(): void {
    this.#draining = true;
  }

  /**
   * The checks, and whether the process is draining (always as of now). One check runs at a time,
   * and its answer serves the probes of the next {@linkcode READY_REUSE_MS}.
   */
  async check(): Promise<ReadinessReport> {
    // A monotonic clock: a wall clock stepped back would stretch the reuse by the step.
    const fresh = this.#last !== null && performance.now() - this.#last.at < READY_REUSE_MS;
    const shared = fresh || this.#running !== null;
    if (!shared) {
      this.#running = this.#checkNow().then((report) => {
        this.#last = { report, at: performance.now() };
        return report;
      }).finally(() => this.#running = null);
    }
    const report = fresh ? this.#last!.report : await this.#running!;
    // A probe answered by another's check counts as a failed probe too (the check counted its own).
    if (shared && report.checks.db === READY_DB_FAILED) this.#failedProbes++;
    return { ...report, draining: this.#draining };
  }

  async #checkNow(): Promise<Omit<ReadinessReport, "draining">> {
    try {
      const encryption = await withDeadline(this.encryptionCheck(), READY_DB_TIMEOUT_MS);
      if (this.#failureLoggedAt !== null) {
        this.#log.info("readiness_db_recovered", { failedProbes: this.#failedProbes });
        this.#failureLoggedAt = null;
        this.#failedProbes = 0;
      }
      return { checks: { db: "ok", encryption }, ...this.#rotation() };
    } catch (error) {
      this.#logFailure(error);
      return { checks: { db: READY_DB_FAILED, encryption: this.#encryption }, ...this.#rotation() };
    }
  }

  /**
   * The key that opened the canary at the last check (`ENCRYPTION_KEY`, or
   * `ENCRYPTION_KEY_PREVIOUS` until `encryption rotate-key` has run); null when none did.
   */
  get canaryOpensWith(): EncryptionKeyName | null {
    return this.#canaryOpensWith;
  }

  /** During a rotation (`ENCRYPTION_KEY_PREVIOUS` set), which key opens the canary. */
  #rotation(): Pick<ReadinessReport, "encryptionKey"> {
    if (this.#box.previous === null || this.#canaryOpensWith === null) return {};
    return { encryptionKey: this.#canaryOpensWith };
  }

  #logFailure(error: unknown): void {
    this.#failedProbes++;
    const now = Date.now();
    const lastLogged = this.#failureLoggedAt;
    if (lastLogged !== null && now - lastLogged < READY_FAILURE_LOG_INTERVAL_MS) return;
    // The reason is logged in production too: the query is fixed, so its error text can only
    // describe the database and the way to it, which is what the operator needs.
    const code = (error as { code?: unknown })?.code;
    this.#log.warn("readiness_db_failed", {
      reason: error instanceof Error ? error.message : String(error),
      ...(typeof code === "string" ? { code } : {}),
      failedProbes: this.#failedProbes,
      errorClass: error instanceof Error ? error.constructor.name : typeof error,
    });
    this.#failureLoggedAt = now;
  }

  /** Reads the canary (which also proves the database answers) and opens it with our keys. */
  async encryptionCheck(): Promise<string> {
    const sealed = await readEncryptionCanary(this.#db.sql);
    if (sealed === null) {
      this.#encryption = "fail: the database has no encryption canary";
      return this.#encryption;
    }
    let opensWith = this.#verdicts.get(sealed);
    if (opensWith === undefined) {
      opensWith = await this.#keyOpening(sealed);
      this.#verdicts.set(sealed, opensWith);
    }
    this.#canaryOpensWith = opensWith;
    if (opensWith !== null) {
      this.#encryption = "ok";
    } else if (this.#box.previous === null) {
      this.#encryption = "fail: ENCRYPTION_KEY is not the key this database was set up with";
    } else {
      this.#encryption = "fail: neither ENCRYPTION_KEY nor ENCRYPTION_KEY_PREVIOUS is the key " +
        "this database was set up with";
    }
    return this.#encryption;
  }

  /** The key that opens the sealed canary, or null when neither does. */
  async #keyOpening(sealed: string): Promise<EncryptionKeyName | null> {
    if (!await canaryOpens(this.#box, sealed)) return null;
    return sealedKeyId(sealed) === this.#box.keyId ? "ENCRYPTION_KEY" : "ENCRYPTION_KEY_PREVIOUS";
  }
}
