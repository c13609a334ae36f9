/**
 * What callbacks may do beyond public https, from `CALLBACK_ALLOW_HTTP` and
 * `CALLBACK_ALLOW_PRIVATE_NETWORKS` (docs/security.md, "Callback safety"), and the boot lines
 * that say when either is on. The CLI and the sending processes read it the same way.
 */
import type { Config } from "../config.ts";
import type { Logger } from "../observability/log.ts";

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

/** The variables that set a callback allowance themselves. */
const ALLOWANCE_VARIABLES = [
  "CALLBACK_ALLOW_HTTP",
  "CALLBACK_ALLOW_PRIVATE_NETWORKS",
  "CALLBACK_ALLOW_INSECURE",
];

/**
 * Which callback rules apply and why, for the `listening` line: an unset `NODE_ENV` gives
 * production's rules, so the line says so rather than leave an operator to guess.
 */
export function describeCallbackRules(config: Config): { callbacks: string; because: string } {
  const { allowHttp, allowPrivateNetworks } = callbackPolicyOf(config);
  const callbacks = `${allowHttp ? "http or https" : "https only"}, ` +
    `${allowPrivateNetworks ? "private addresses allowed" : "public addresses only"}`;
  const explicit = ALLOWANCE_VARIABLES.filter((name) => config.setVariables.includes(name));
  const environment = config.setVariables.includes("NODE_ENV")
    ? `NODE_ENV is ${config.env}`
    : "NODE_ENV is unset, which keeps production's callback rules (deno task dev, " +
      "NODE_ENV=development or the CALLBACK_ALLOW_* variables relax them)";
  const because = explicit.length === 0
    ? environment
    : `${explicit.join(" and ")} ${explicit.length === 1 ? "is" : "are"} set; otherwise ` +
      environment;
  return { callbacks, because };
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
