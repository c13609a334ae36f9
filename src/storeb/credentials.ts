/**
 * A tenant's store B credentials: a Google Cloud service account for the Play Developer API and
 * the push subscription's audience and account (docs/configuration.md, "Store credentials").
 * Stored sealed by `db/credentials.ts`.
 */

/** Store B (Play Developer API and push) credentials. */
export interface StorebCredentials {
  packageName: string;
  clientEmail: string;
  /** The service-account JSON file, as text. */
  serviceAccountJson: string;
  pushAudience: string;
  /**
   * The service account the push subscription authenticates as. Null only for tenants stored by
   * versions that did not require it: their push notifications are refused until it is set.
   */
  pushServiceAccount: string | null;
}

/** Store B credentials as they are stored now: the push service account is required. */
export interface NewStorebCredentials extends StorebCredentials {
  pushServiceAccount: string;
}
