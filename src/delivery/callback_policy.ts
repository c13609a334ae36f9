/**
 * What callbacks may do beyond public https, from `CALLBACK_ALLOW_HTTP` and
 * `CALLBACK_ALLOW_PRIVATE_NETWORKS` (docs/operations.md, "Callback safety"), and the boot lines
 * that say when either is on. The CLI and the sending processes read it the same way.
 */
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";

/** What callbacks may do beyond public https. */
export interface CallbackPolicy {
  /** Plain `http://` callbacks are allowed. */
  allowHttp: boolean;
  /** Callbacks at localhost or at addresses that are not globally reachable are allowed. */
  allowPrivateNetworks: boolean;
}

/** The policy the configuration sets. */
export function callbackPolicyOf(config: Config): CallbackPolicy {
  return {
    allowHttp: config.callbackAllowHttp,
    allowPrivateNetworks: config.callbackAllowPrivateNetworks,
  };
}

/**
 * At boot: a warning for the deprecated `CALLBACK_ALLOW_INSECURE`, and a line when a check is
 * relaxed (a warning in production, where both are off unless set).
 */
export function logCallbackPolicy(config: Config, log: Logger): void {
  if (config.deprecatedVariables.includes("CALLBACK_ALLOW_INSECURE")) {
    log.warn("config_variable_deprecated", {
      variable: "CALLBACK_ALLOW_INSECURE",
      hint: "set CALLBACK_ALLOW_HTTP and CALLBACK_ALLOW_PRIVATE_NETWORKS instead",
    });
  }
  const policy = callbackPolicyOf(config);
  if (!policy.allowHttp && !policy.allowPrivateNetworks) return;
  const fields = { ...policy, env: config.env };
  if (config.env === "production") log.warn("callback_checks_relaxed", fields);
  else log.info("callback_checks_relaxed", fields);
}
