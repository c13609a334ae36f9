/**
 * The build version stamped into a compiled binary by `deno task compile`.
 * `SERVICE_VERSION` in the environment overrides it at boot. It is informational: clients must
 * not branch on it (docs/integration.md, "Common headers").
 */
export const BUILD_VERSION = "dev";
