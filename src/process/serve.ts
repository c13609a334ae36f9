/**
 * `purchase-relay serve`: the process around the service (src/process/app.ts). It listens, and on SIGINT
 * or SIGTERM drains: `/ready` answers 503 at once, requests in flight finish (within
 * `SHUTDOWN_TIMEOUT`), the socket closes, then the service is torn down. A boot failure throws;
 * main.ts logs it as `startup_failed` and exits 1.
 */
import type { Config } from "../config.ts";
import type { Logger } from "../observability/log.ts";
import { newId } from "../lib/ids.ts";
import { internalErrorResponse } from "../http/server.ts";
import { createApp } from "./app.ts";
import { describeCallbackRules } from "../delivery/callback_policy.ts";
import { dropStrayWriteAfterEnd } from "./stray_rejections.ts";
import { launcherGone } from "./launcher_pipe.ts";

/** Runs the service; resolves when it has shut down. */
export async function serve(config: Config, log: Logger): Promise<void> {
  using _strayRejections = dropStrayWriteAfterEnd(log);
  await using app = await createApp(config, log);
  const stopped = Promise.withResolvers<{ signal: Deno.Signal; cause?: "launcher_exited" }>();
  const onSignal = (signal: Deno.Signal) => () => stopped.resolve({ signal });
  const signals: [Deno.Signal, () => void][] = [
    ["SIGTERM", onSignal("SIGTERM")],
    ["SIGINT", onSignal("SIGINT")],
  ];
  for (const [signal, handler] of signals) Deno.addSignalListener(signal, handler);
  // Under scripts/launch.ts its end is a SIGTERM, whatever ended it: a SIGKILL of the launcher
  // must not leave the service holding the port and DATA_DIR (src/process/launcher_pipe.ts).
  launcherGone().then(() => stopped.resolve({ signal: "SIGTERM", cause: "launcher_exited" }));
  // After the first signal a second one ends the process at once, as the default action does.
  let listening = true;
  const stopListening = () => {
    if (!listening) return;
    listening = false;
    for (const [name, handler] of signals) Deno.removeSignalListener(name, handler);
  };
  try {
    await using server = Deno.serve({
      port: config.port,
      hostname: config.host,
      onListen: () => {},
      onError: (error) => {
        const reqId = newId("req");
        log.error("request_failed", { reqId, code: "INTERNAL_ERROR", ...log.errorFields(error) });
        return internalErrorResponse(reqId, {
          "x-request-id": reqId,
          "x-service-version": config.version,
        });
      },
    }, app.handler);
    const rules = describeCallbackRules(config);
    log.info("listening", {
      port: server.addr.transport === "tcp" ? server.addr.port : config.port,
      host: config.host,
      env: config.env,
      version: config.version,
      database: app.database,
      cryptoEngine: app.cryptoEngine,
      callbacks: rules.callbacks,
      callbacksBecause: rules.because,
    });

    const stop = await stopped.promise;
    stopListening();
    log.info("shutdown", stop);
    app.readiness.startDraining();
    // Let requests in flight finish, but not forever; then stop accepting and close.
    if (!await app.inFlight.drainWithin(config.shutdownTimeoutMs)) {
      log.warn("shutdown_timeout", { timeoutMs: config.shutdownTimeoutMs });
    }
  } finally {
    stopListening();
  }
}
