/**
 * The Deno permissions the service and its admin CLI run with (decisions.md 2): never `-A`, and
 * writes only in `DATA_DIR`. `deno task start`, the tests, the benchmarks and the demo all start
 * `main.ts` with these, so what is tested is what an operator runs.
 */
export function servicePermissions(dataDir: string): string[] {
  return [
    "--allow-net",
    "--allow-env",
    "--allow-read",
    `--allow-write=${dataDir}`,
    "--allow-sys=hostname,osRelease",
    // OpenSSL's libcrypto checks ES256 signatures (src/crypto/es256.ts, CRYPTO_ENGINE).
    "--allow-ffi",
  ];
}
