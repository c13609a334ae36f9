/**
 * TLS to PostgreSQL: what `sslmode` in a database URL asks for, the CA file that
 * `sslmode=verify-full` checks the server's certificate against, and a clear error when that
 * check fails (docs/postgresql.md, "TLS to PostgreSQL").
 */
import { ConfigError } from "../config.ts";
import { RelayError } from "../errors.ts";

/** The modes of `sslmode` that the service accepts. */
const UNVERIFIED_MODES = ["disable", "allow", "prefer", "require"];

/** What `npm:postgres` takes as its `ssl` option. */
export type PostgresSsl =
  | false
  | "allow"
  | "prefer"
  | "require"
  | { rejectUnauthorized: true; host: string; ca?: string };

/** The TLS settings of one database URL. */
export interface PostgresTls {
  /** The `ssl` option of `npm:postgres`. */
  ssl: PostgresSsl;
  /** The variable that holds the URL, named in errors. */
  variable: string;
  /** `host:port` of the URL, named in errors. */
  address: string;
  /** The CA file in use, named in errors; `null` for the runtime's CAs or no verification. */
  caFile: string | null;
}

/**
 * Reads the TLS settings of `url` (held in `variable`). `sslmode=verify-full` checks that the
 * server's certificate chains to a CA of `ca` (the PEM text of `caFile`; the runtime's CAs when
 * `null`) and names the URL's host. Throws a {@linkcode ConfigError} for a mode the service cannot
 * honour, never quoting the URL (it may hold a password).
 */
export function postgresTls(
  url: string,
  variable: string,
  ca: { file: string; pem: string } | null,
): PostgresTls {
  const parsed = new URL(url);
  const mode = parsed.searchParams.get("sslmode");
  if (parsed.searchParams.has("sslrootcert")) {
    throw new ConfigError(
      variable,
      "sslrootcert is not read from the URL: give the CA file in DATABASE_CA_FILE and use " +
        "sslmode=verify-full",
    );
  }
  for (const name of ["sslcert", "sslkey", "channel_binding"]) {
    // npm:postgres would pass these libpq settings to the server as session settings.
    if (parsed.searchParams.has(name)) {
      throw new ConfigError(
        variable,
        `${name} is a libpq setting that the service's PostgreSQL client does not support: ` +
          "remove it from the URL",
      );
    }
  }
  const address = `${parsed.hostname}:${parsed.port || "5432"}`;
  if (mode === "verify-full") {
    return {
      // `host` is what the certificate must name; npm:postgres sends SNI only for host names.
      ssl: {
        rejectUnauthorized: true,
        host: parsed.hostname.replace(/^\[(.*)\]$/, "$1"),
        ...(ca ? { ca: ca.pem } : {}),
      },
      variable,
      address,
      caFile: ca?.file ?? null,
    };
  }
  if (mode === "verify-ca") {
    throw new ConfigError(
      variable,
      "sslmode=verify-ca is not supported: use sslmode=verify-full (the certificate must also " +
        "name the host of the URL)",
    );
  }
  if (mode !== null && !UNVERIFIED_MODES.includes(mode)) {
    throw new ConfigError(
      variable,
      `sslmode=${mode} is not one of disable, allow, prefer, require, verify-full`,
    );
  }
  if (ca) {
    // A CA file with a mode that checks nothing would look safe and be not.
    throw new ConfigError(
      "DATABASE_CA_FILE",
      `is set, but ${variable} has sslmode=${mode ?? "(none)"}, which does not check the ` +
        "certificate: add sslmode=verify-full",
    );
  }
  return {
    ssl: mode === null || mode === "disable" ? false : mode as "allow" | "prefer" | "require",
    variable,
    address,
    caFile: null,
  };
}

/** Reads `DATABASE_CA_FILE`: PEM text holding at least one certificate. */
export async function readCaFile(path: string): Promise<{ file: string; pem: string }> {
  let pem: string;
  try {
    pem = await Deno.readTextFile(path);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new ConfigError("DATABASE_CA_FILE", `cannot be read: ${reason}`);
  }
  if (!pem.includes("-----BEGIN CERTIFICATE-----")) {
    throw new ConfigError("DATABASE_CA_FILE", `${path} holds no PEM certificate`);
  }
  return { file: path, pem };
}

/** The server's certificate did not pass `sslmode=verify-full`; retrying will not help. */
export class DatabaseCertificateError extends RelayError {
  constructor(message: string, options?: ErrorOptions) {
    super("DATABASE_CERT_MISMATCH", message, options);
  }
}

/** Codes of a certificate that does not chain to a trusted CA. */
const UNTRUSTED_CODES = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_UNTRUSTED",
  "CERT_SIGNATURE_FAILURE",
  "CERT_REJECTED",
]);

/**
 * Turns a failed TLS handshake into a {@linkcode DatabaseCertificateError} that says what did not
 * match; returns `null` for any other error. The message names the variables and the address,
 * never the URL.
 */
export function certificateError(
  error: unknown,
  tls: PostgresTls,
): DatabaseCertificateError | null {
  const code = (error as { code?: unknown })?.code;
  const message = error instanceof Error ? error.message : String(error);
  const trusted = tls.caFile === null
    ? "a CA the runtime trusts (set DATABASE_CA_FILE to the provider's CA bundle)"
    : `a CA of DATABASE_CA_FILE (${tls.caFile})`;
  let why: string;
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    why = `it does not name ${tls.address.replace(/:\d+$/, "")}, the host of ${tls.variable}` +
      " (use the host name the certificate was issued for)";
  } else if (typeof code === "string" && UNTRUSTED_CODES.has(code)) {
    why = `it is not signed by ${trusted}`;
  } else if (code === "CERT_HAS_EXPIRED" || code === "CERT_NOT_YET_VALID") {
    why = code === "CERT_HAS_EXPIRED" ? "it has expired" : "it is not valid yet";
  } else if (/certificate/i.test(message) && !("severity" in Object(error))) {
    // Another verification failure of the TLS stack (a PostgreSQL error has a severity).
    why = message;
  } else {
    return null;
  }
  return new DatabaseCertificateError(
    `the certificate of PostgreSQL at ${tls.address} (${tls.variable}, sslmode=verify-full) did ` +
      `not match: ${why}`,
    { cause: error },
  );
}

/**
 * The host of `databaseUrl` when it is another machine and the URL says nothing of TLS (no
 * `sslmode`): the password and every tenant's sealed secrets would cross the network as the
 * server allows, in the clear by default. Null for no URL, a loopback host, a Unix socket, or
 * any `sslmode`, `disable` included (then the operator said the network is trusted).
 */
export function remoteHostWithoutTls(databaseUrl: string | null): string | null {
  if (databaseUrl === null) return null;
  const url = new URL(databaseUrl);
  if (url.searchParams.has("sslmode")) return null;
  // libpq's host parameter wins over the URL's host; a path is a Unix socket.
  const host = (url.searchParams.get("host") ?? url.hostname).replace(/^\[|\]$/g, "");
  const loopback = host === "" || host.startsWith("/") || host === "localhost" ||
    host === "::1" || /^127\./.test(host);
  return loopback ? null : host;
}
