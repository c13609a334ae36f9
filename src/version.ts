/**
 * The build version stamped into a compiled binary by `deno task compile`.
 * `SERVICE_VERSION` in the environment overrides it at boot (spec 9).
 */
export const BUILD_VERSION = "dev";
