/** PEM text of DER bytes, as key and certificate files hold them. */

/** `der` as PEM with `label` (`CERTIFICATE`, `PRIVATE KEY`, `PUBLIC KEY`), 64 characters a line. */
export function derToPem(der: Uint8Array, label = "CERTIFICATE"): string {
  const lines = der.toBase64().match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join("\n")}\n-----END ${label}-----\n`;
}
