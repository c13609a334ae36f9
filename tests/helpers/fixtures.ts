/** Credential files made fresh for each test run: no key material is checked in. */
import { generateKeyPairSync } from "node:crypto";
import { join } from "node:path";

/** Writes a store A `.p8` (EC P-256 PKCS#8 PEM) and returns its path. */
export async function writeStoreaKeyFile(dir: string): Promise<string> {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "prime256v1" });
  const path = join(dir, "AuthKey_TEST123456.p8");
  await Deno.writeTextFile(path, privateKey.export({ type: "pkcs8", format: "pem" }) as string);
  return path;
}

/** Writes a store B service-account JSON and returns its path and client email. */
export async function writeServiceAccountFile(
  dir: string,
): Promise<{ path: string; clientEmail: string }> {
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const clientEmail = "relay@test-project.iam.gserviceaccount.com";
  const path = join(dir, "service-account.json");
  await Deno.writeTextFile(
    path,
    JSON.stringify({
      type: "service_account",
      project_id: "test-project",
      private_key_id: "0123456789abcdef",
      private_key: privateKey.export({ type: "pkcs8", format: "pem" }),
      client_email: clientEmail,
      token_uri: "https://oauth2.googleapis.com/token",
    }),
  );
  return { path, clientEmail };
}

/** An App Store Connect issuer id for tests. */
export const TEST_ISSUER_ID = "57246542-96fe-1a63-e053-0824d011072a";

/** Arguments of `storea set-credentials` for `tenantId` with the test bundle and key ids. */
export function storeaCredentialArgs(tenantId: string, keyFile: string): string[] {
  return [
    "storea",
    "set-credentials",
    tenantId,
    "--bundle-id",
    "com.example.app",
    "--key-id",
    "ABC123DEFG",
    "--issuer-id",
    TEST_ISSUER_ID,
    "--private-key-file",
    keyFile,
  ];
}

/** The push service account `storebCredentialArgs` configures unless told another. */
export const TEST_PUSH_SERVICE_ACCOUNT = "push@example-project.iam.gserviceaccount.com";

/**
 * Arguments of `storeb set-credentials` for `tenantId` with the test package, audience and push
 * service account.
 */
export function storebCredentialArgs(
  tenantId: string,
  accountFile: string,
  pushServiceAccount = TEST_PUSH_SERVICE_ACCOUNT,
): string[] {
  return [
    "storeb",
    "set-credentials",
    tenantId,
    "--package-name",
    "com.example.app",
    "--service-account-file",
    accountFile,
    "--push-audience",
    "https://relay.example.com/push",
    "--push-service-account",
    pushServiceAccount,
  ];
}
