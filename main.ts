/**
 * purchase-relay: `serve` (the default), `migrate`, `version` and the admin commands.
 * @module
 */
import { readConfig, readEnvironment } from "./src/config.ts";
import { log, Logger } from "./src/log.ts";
import { serve } from "./src/serve.ts";
import { type CliContext, openForCli, runCli } from "./src/cli/mod.ts";

async function main(args: string[]): Promise<number> {
  const command = args[0] ?? "serve";
  if (command === "serve" && args.length <= 1) return await runServer();
  return await runAdmin(args);
}

async function runServer(): Promise<number> {
  try {
    const config = readConfig(readEnvironment());
    log.configure({ level: config.logLevel, production: config.env === "production" });
    await serve(config, log);
    return 0;
  } catch (error) {
    log.fatal("startup_failed", {
      code: (error as { code?: string })?.code ?? "STARTUP_FAILED",
      reason: error instanceof Error ? error.message : String(error),
      ...(error instanceof Error ? { errorClass: error.constructor.name } : {}),
    });
    return 1;
  }
}

async function runAdmin(args: string[]): Promise<number> {
  // Commands print one JSON object on stdout; their logs go to stderr.
  const cliLog = new Logger({ write: (bytes) => Deno.stderr.writeSync(bytes) });
  let config;
  try {
    config = readConfig(readEnvironment());
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    Deno.stderr.writeSync(
      new TextEncoder().encode(JSON.stringify({ error: "CONFIG_INVALID", message }) + "\n"),
    );
    return 1;
  }
  cliLog.configure({ level: "warn", production: config.env === "production" });
  let opened: Awaited<ReturnType<typeof openForCli>> | undefined;
  const context: CliContext = {
    config,
    log: cliLog,
    open: async () => (opened ??= await openForCli(config, cliLog)),
  };
  try {
    return await runCli(args, context);
  } finally {
    await opened?.db.close().catch(() => {});
    cliLog.flush();
  }
}

if (import.meta.main) {
  const code = await main(Deno.args);
  log.flush();
  Deno.exit(code);
}
