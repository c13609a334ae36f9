/**
 * purchase-relay: `serve` runs the service; every other command is the admin CLI (src/cli/mod.ts),
 * and no command at all prints its help.
 * @module
 */
import { type Config, readConfig, readEnvironment } from "./src/config.ts";
import { log, Logger } from "./src/observability/log.ts";
import { serve } from "./src/process/serve.ts";
import { errorCode } from "./src/errors.ts";
import { type CliContext, openForCli, runCli } from "./src/cli/mod.ts";

async function main(args: string[]): Promise<number> {
  if (args.length === 1 && args[0] === "serve") return await runServer();
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
      code: errorCode(error, "STARTUP_FAILED"),
      reason: error instanceof Error ? error.message : String(error),
      ...(error instanceof Error ? { errorClass: error.constructor.name } : {}),
    });
    return 1;
  }
}

async function runAdmin(args: string[]): Promise<number> {
  // Commands print their result on stdout; their logs go to stderr.
  const cliLog = new Logger({ write: (bytes) => Deno.stderr.writeSync(bytes) });
  let config: Config | undefined;
  let opened: ReturnType<typeof openForCli> | undefined;
  const context: CliContext = {
    // Read when a command first needs it: help works whatever the environment holds.
    get config() {
      if (config === undefined) {
        config = readConfig(readEnvironment());
        cliLog.configure({ level: "warn", production: config.env === "production" });
      }
      return config;
    },
    log: cliLog,
    open: (options) => (opened ??= openForCli(context.config, cliLog, options)),
  };
  try {
    return await runCli(args, context);
  } finally {
    await opened?.then((open) => open.db.close()).catch(() => {});
    cliLog.flush();
  }
}

if (import.meta.main) {
  const code = await main(Deno.args);
  log.flush();
  Deno.exit(code);
}
