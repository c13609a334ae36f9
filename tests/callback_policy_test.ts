/**
 * `CALLBACK_ALLOW_HTTP`, `CALLBACK_ALLOW_PRIVATE_NETWORKS` and the deprecated
 * `CALLBACK_ALLOW_INSECURE` (src/config.ts, src/delivery/callback_policy.ts): defaults per
 * environment, precedence, and what the boot logs.
 */
import assert from "node:assert/strict";
import { ConfigError, readConfig } from "../src/config.ts";
import {
  callbackPolicyOf,
  describeCallbackRules,
  logCallbackPolicy,
} from "../src/delivery/callback_policy.ts";
import { Logger } from "../src/observability/log.ts";

const KEY = btoa(String.fromCharCode(...new Uint8Array(32)));
const PRODUCTION = { NODE_ENV: "production", ENCRYPTION_KEY: KEY };

function policy(env: Record<string, string>) {
  return callbackPolicyOf(readConfig(env));
}

Deno.test("callback policy: both off in production and when nothing is set, on when asked", () => {
  assert.deepEqual(policy(PRODUCTION), { allowHttp: false, allowPrivateNetworks: false });
  // Nothing set is as safe as production: development is asked for, never assumed.
  assert.deepEqual(policy({}), { allowHttp: false, allowPrivateNetworks: false });
  assert.deepEqual(policy({ NODE_ENV: " " }), { allowHttp: false, allowPrivateNetworks: false });
  assert.deepEqual(policy({ NODE_ENV: "development" }), {
    allowHttp: true,
    allowPrivateNetworks: true,
  });
  assert.deepEqual(policy({ NODE_ENV: "test" }), { allowHttp: true, allowPrivateNetworks: true });
  // The quick start's generated key needs no NODE_ENV.
  assert.equal(readConfig({}).encryptionKey, null);
});

Deno.test("callback policy: the boot line says which rules apply and why", () => {
  const rules = (env: Record<string, string>) => describeCallbackRules(readConfig(env));
  assert.deepEqual(rules({}), {
    callbacks: "https only, public addresses only",
    because: "NODE_ENV is unset, which keeps production's callback rules (deno task dev, " +
      "NODE_ENV=development or the CALLBACK_ALLOW_* variables relax them)",
  });
  assert.deepEqual(rules({ NODE_ENV: "development" }), {
    callbacks: "http or https, private addresses allowed",
    because: "NODE_ENV is development",
  });
  assert.deepEqual(rules({ ...PRODUCTION, CALLBACK_ALLOW_HTTP: "true" }), {
    callbacks: "http or https, public addresses only",
    because: "CALLBACK_ALLOW_HTTP is set; otherwise NODE_ENV is production",
  });
});

Deno.test("callback policy: each variable sets its own allowance", () => {
  assert.deepEqual(policy({ ...PRODUCTION, CALLBACK_ALLOW_HTTP: "true" }), {
    allowHttp: true,
    allowPrivateNetworks: false,
  });
  assert.deepEqual(policy({ ...PRODUCTION, CALLBACK_ALLOW_PRIVATE_NETWORKS: "yes" }), {
    allowHttp: false,
    allowPrivateNetworks: true,
  });
  assert.deepEqual(policy({ NODE_ENV: "development", CALLBACK_ALLOW_PRIVATE_NETWORKS: "false" }), {
    allowHttp: true,
    allowPrivateNetworks: false,
  });
});

Deno.test("callback policy: CALLBACK_ALLOW_INSECURE sets both unless they are set", () => {
  const insecure = readConfig({ ...PRODUCTION, CALLBACK_ALLOW_INSECURE: "true" });
  assert.deepEqual(callbackPolicyOf(insecure), { allowHttp: true, allowPrivateNetworks: true });
  assert.deepEqual(insecure.deprecatedVariables, ["CALLBACK_ALLOW_INSECURE"]);
  assert.deepEqual(policy({ CALLBACK_ALLOW_INSECURE: "false" }), {
    allowHttp: false,
    allowPrivateNetworks: false,
  });
  assert.deepEqual(
    policy({
      ...PRODUCTION,
      CALLBACK_ALLOW_INSECURE: "true",
      CALLBACK_ALLOW_PRIVATE_NETWORKS: "0",
    }),
    { allowHttp: true, allowPrivateNetworks: false },
  );
  assert.deepEqual(readConfig(PRODUCTION).deprecatedVariables, []);
});

Deno.test("callback policy: an invalid value names its variable", () => {
  for (
    const variable of [
      "CALLBACK_ALLOW_HTTP",
      "CALLBACK_ALLOW_PRIVATE_NETWORKS",
      "CALLBACK_ALLOW_INSECURE",
    ]
  ) {
    assert.throws(
      () => readConfig({ [variable]: "perhaps" }),
      (error) => error instanceof ConfigError && error.variable === variable,
      variable,
    );
  }
});

Deno.test("callback policy: the boot says when a check is relaxed, warning in production", () => {
  const linesOf = (env: Record<string, string>) => {
    let text = "";
    const log = new Logger({
      level: "debug",
      write: (bytes) => text += new TextDecoder().decode(bytes),
    });
    logCallbackPolicy(readConfig(env), log);
    log.flush();
    return text.trim().split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
  };
  assert.deepEqual(linesOf(PRODUCTION), []);
  const [relaxed] = linesOf({ ...PRODUCTION, CALLBACK_ALLOW_PRIVATE_NETWORKS: "true" });
  assert.equal(relaxed.msg, "callback_checks_relaxed");
  assert.equal(relaxed.level, "warn");
  assert.equal(relaxed.allowHttp, false);
  assert.equal(relaxed.allowPrivateNetworks, true);
  assert.deepEqual(linesOf({}), []);
  const [development] = linesOf({ NODE_ENV: "development" });
  assert.equal(development.msg, "callback_checks_relaxed");
  assert.equal(development.level, "info");
  const deprecated = linesOf({ ...PRODUCTION, CALLBACK_ALLOW_INSECURE: "false" });
  assert.deepEqual(deprecated.map((line) => [line.msg, line.level, line.variable]), [
    ["config_variable_deprecated", "warn", "CALLBACK_ALLOW_INSECURE"],
  ]);
});
