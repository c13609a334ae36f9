/**
 * `storea set-credentials` and `storeb set-credentials`: the tenant's store credentials, checked
 * before anything is written and never printed (docs/configuration.md, "Store credentials").
 * @module
 */
import { createPrivateKey } from "node:crypto";
import {
  describeCredentials,
  saveStoreaCredentials,
  saveStorebCredentials,
} from "../db/credentials.ts";
import type { StoreaEnvironment } from "../storea/credentials.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import { mustFindTenant, readSecretInput } from "./inputs.ts";

/** `storea set-credentials TENANT_ID --bundle-id ID --key-id KID --issuer-id UUID ...` */
export async function setStoreaCredentials(
  { positionals: [tenantId], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const issuerId = options["issuer-id"]!;
  const keyId = options["key-id"]!;
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(issuerId)) {
    throw new UsageError("--issuer-id must be a UUID");
  }
  if (!/^[A-Za-z0-9]{1,64}$/.test(keyId)) throw new UsageError("--key-id must be alphanumeric");
  let appId: number | null = null;
  if (options["app-id"] !== undefined) {
    if (!/^\d{1,15}$/.test(options["app-id"])) throw new UsageError("--app-id must be a number");
    appId = Number(options["app-id"]);
  }
  const privateKeyPem = await readSecretInput(options["private-key-file"]!);
  checkStoreaKey(privateKeyPem);
  const { db, box } = await context.open();
  await mustFindTenant(db, tenantId);
  await saveStoreaCredentials(db.sql, box, tenantId, {
    bundleId: options["bundle-id"]!,
    keyId,
    issuerId,
    privateKeyPem,
    environment: options.environment as StoreaEnvironment,
    appId,
  });
  return { tenantId, storea: (await describeCredentials(db.sql, tenantId)).storea };
}

/** `storeb set-credentials TENANT_ID --package-name NAME --service-account-file PATH ...` */
export async function setStorebCredentials(
  { positionals: [tenantId], options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  // Required: any Google project can mint a push token for our audience; only the account
  // ties a token to the tenant's own subscription (docs/operations.md).
  const pushServiceAccount = options["push-service-account"]!;
  if (!/^[^@\s]+@[^@\s]+$/.test(pushServiceAccount)) {
    throw new UsageError("--push-service-account must be an email address");
  }
  const serviceAccountJson = await readSecretInput(options["service-account-file"]!);
  const clientEmail = checkServiceAccount(serviceAccountJson);
  const { db, box } = await context.open();
  await mustFindTenant(db, tenantId);
  await saveStorebCredentials(db.sql, box, tenantId, {
    packageName: options["package-name"]!,
    clientEmail,
    serviceAccountJson,
    pushAudience: options["push-audience"]!,
    pushServiceAccount,
  });
  return { tenantId, storeb: (await describeCredentials(db.sql, tenantId)).storeb };
}

/** A store A key file must hold an EC P-256 private key (the .p8 App Store Connect issues). */
function checkStoreaKey(pem: string): void {
  let ok = false;
  try {
    const key = createPrivateKey(pem);
    ok = key.asymmetricKeyType === "ec" && key.asymmetricKeyDetails?.namedCurve === "prime256v1";
  } catch {
    ok = false;
  }
  // Never echo the file: it is a secret.
  if (!ok) {
    throw new CommandError(
      "INVALID_PRIVATE_KEY",
      "the key file does not hold an EC P-256 private key",
    );
  }
}

/** A store B file must be a service_account JSON with client_email and an RSA private_key. */
function checkServiceAccount(text: string): string {
  let account: Record<string, unknown>;
  try {
    account = JSON.parse(text);
  } catch {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the service-account file is not JSON");
  }
  if (account?.type !== "service_account") {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", 'the file\'s "type" is not service_account');
  }
  if (typeof account.client_email !== "string" || !account.client_email.includes("@")) {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the file has no client_email");
  }
  let keyOk = false;
  try {
    keyOk = typeof account.private_key === "string" &&
      createPrivateKey(account.private_key).asymmetricKeyType === "rsa";
  } catch {
    keyOk = false;
  }
  if (!keyOk) {
    throw new CommandError("INVALID_SERVICE_ACCOUNT", "the file has no RSA private_key");
  }
  return account.client_email;
}
