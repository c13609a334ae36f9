/**
 * The Deno permissions the service and its admin CLI run with (decisions.md 2): never `-A`, and
 * writes only in `DATA_DIR`; and the one V8 flag they run with. `deno task start`, the tests, the
 * benchmarks and the demo all start `main.ts` with these, so what is tested is what an operator
 * runs.
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
    // Not a permission: the embedded engine's WebAssembly stays on V8's baseline compiler, which
    // saved it some 45 MB and CPU (docs/operations.md, "Embedded or PostgreSQL"). A service on
    // PostgreSQL runs no WebAssembly.
    "--v8-flags=--liftoff-only",
  ];
}
