/**
 * The service and its admin CLI run on this machine from the checkout, as `deno task start` and
 * `deno task cli` run them (`deno run <permissions> main.ts ...`, with the permissions of
 * src/process/permissions.ts): what `deno task demo` and `deno task dev` share. Every wait is bounded.
 *
 * @module
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { serviceEnvironment, servicePermissions } from "../src/process/permissions.ts";

/** The checkout. */
export const ROOT = fileURLToPath(new URL("../", import.meta.url));
const MAIN = join(ROOT, "main.ts");

const STOP_TIMEOUT_MS = 15_000;
const KILL_TIMEOUT_MS = 5_000;

/** A failure explained in its message, which a script prints and stops on (no stack trace). */
export class ExplainedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ExplainedError";
  }
}

/** A failed admin command, with the `error` code it printed when it printed one. */
export class AdminCommandError extends ExplainedError {
  readonly code: string | null;
  constructor(message: string, code: string | null) {
    super(message);
    this.name = "AdminCommandError";
    this.code = code;
  }
}

/** Rejects with `what` in the message when `promise` takes longer than `ms`. */
export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new ExplainedError(`${what} took longer than ${ms / 1000} s`)),
      ms,
    );
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Service variables a script sets itself, which the caller's environment must not override. */
const SERVICE_VARIABLES =
  /^(PORT|HOST|NODE_ENV|LOG_LEVEL|SERVICE_VERSION|DATABASE_\w+|DATA_DIR|ENCRYPTION_KEY|CRYPTO_ENGINE|RATE_LIMIT_\w+|VALIDATION_AUDIT_\w+|STOREA_\w+|STOREB_\w+|UPSTREAM_TIMEOUT|DELIVERY_\w+|CALLBACK_ALLOW_\w+|SHUTDOWN_TIMEOUT)$/;

/** Options of {@linkcode serviceEnv}. */
export interface ServiceEnvOptions {
  /**
   * Keep the service variables of the caller's environment that `own` does not set. Otherwise
   * they are dropped, so that only `own` configures the service.
   */
  keepCallerVariables: boolean;
}

/** The environment of a service or CLI process: the caller's, `own` and `NO_COLOR`. */
export function serviceEnv(
  own: Record<string, string>,
  options: ServiceEnvOptions,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(Deno.env.toObject())) {
    if (options.keepCallerVariables || !SERVICE_VARIABLES.test(name)) {
      env[name] = value;
    }
  }
  return { ...env, NO_COLOR: "1", ...own };
}

/** The service (`main.ts serve`) as a child process, with its log lines kept for a failure report. */
export class ServiceProcess {
  readonly exited: Promise<Deno.CommandStatus>;
  /** Called with each log line once set (a script that follows the logs sets it). */
  onLine: ((line: string) => void) | null = null;
  readonly #child: Deno.ChildProcess;
  readonly #lines: string[] = [];
  #stderr = "";
  #listening = Promise.withResolvers<number>();
  #stopping: Promise<void> | null = null;

  /** Starts `main.ts serve` with `env` only, and the permissions that configuration gives. */
  constructor(env: Record<string, string>) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", ...servicePermissions(env), MAIN, "serve"],
      cwd: ROOT,
      env: { ...env, ...serviceEnvironment(env) },
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const pumps = Promise.all([this.#readStdout(), this.#readStderr()]);
    this.exited = this.#child.status.then(async (status) => {
      await pumps.catch(() => {});
      this.#listening.reject(
        new ExplainedError(`the service exited with code ${status.code} before it listened`),
      );
      return status;
    });
    // Handled by whoever waits; this keeps an early exit from being an unhandled rejection.
    this.#listening.promise.catch(() => {});
  }

  /** The port from the `listening` log line. */
  listeningPort(timeoutMs: number): Promise<number> {
    return withTimeout(this.#listening.promise, timeoutMs, "the service's start");
  }

  /** The last log lines and stderr, for a failure report. */
  tail(): string {
    const lines = [...this.#lines.slice(-12), ...this.#stderr.trim().split("\n").slice(-8)];
    return lines.filter((line) => line !== "").join("\n");
  }

  /** SIGTERM and a bounded wait for the graceful shutdown; SIGKILL when it does not come. */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      try {
        this.#child.kill("SIGTERM");
      } catch {
        return; // already exited
      }
      try {
        await withTimeout(this.exited, STOP_TIMEOUT_MS, "the service's shutdown");
      } catch {
        try {
          this.#child.kill("SIGKILL");
        } catch {
          // exited meanwhile
        }
        await withTimeout(this.exited, KILL_TIMEOUT_MS, "the service's kill").catch(() => {});
      }
    })();
    return this.#stopping;
  }

  async #readStdout(): Promise<void> {
    let pending = "";
    for await (const text of this.#child.stdout.pipeThrough(new TextDecoderStream())) {
      pending += text;
      let newline;
      while ((newline = pending.indexOf("\n")) !== -1) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        this.#lines.push(line);
        if (this.#lines.length > 200) this.#lines.shift();
        this.onLine?.(line);
        this.#notice(line);
      }
    }
  }

  async #readStderr(): Promise<void> {
    for await (const text of this.#child.stderr.pipeThrough(new TextDecoderStream())) {
      this.#stderr = (this.#stderr + text).slice(-8000);
    }
  }

  #notice(line: string): void {
    let record: { msg?: string; level?: string; port?: number; reason?: string };
    try {
      record = JSON.parse(line);
    } catch {
      return;
    }
    if (record.msg === "listening" && typeof record.port === "number") {
      this.#listening.resolve(record.port);
    } else if (record.level === "fatal") {
      this.#listening.reject(new ExplainedError(`the service did not start: ${record.reason}`));
    }
  }
}

/** Options of {@linkcode runAdminCommand}. */
export interface AdminCommandOptions {
  timeoutMs: number;
  /** Told of the child process while it runs, so that a cleanup can kill it. */
  track?: { add(child: Deno.ChildProcess): void; delete(child: Deno.ChildProcess): void };
}

/**
 * Runs `main.ts <args>` as the admin CLI with `env` only and returns its JSON answer; an
 * {@linkcode AdminCommandError} with its error line when it fails.
 */
export async function runAdminCommand(
  env: Record<string, string>,
  args: string[],
  options: AdminCommandOptions,
): Promise<Record<string, unknown>> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...servicePermissions(env, args), MAIN, ...args],
    cwd: ROOT,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  options.track?.add(child);
  const timer = setTimeout(() => {
    try {
      child.kill("SIGKILL");
    } catch {
      // exited meanwhile
    }
  }, options.timeoutMs);
  try {
    const output = await child.output();
    const stdout = new TextDecoder().decode(output.stdout).trim();
    const stderr = new TextDecoder().decode(output.stderr).trim();
    if (output.signal === "SIGKILL") {
      throw new ExplainedError(`the command took longer than ${options.timeoutMs / 1000} s`);
    }
    if (output.code !== 0) {
      const last = stderr.split("\n").at(-1) ?? "";
      let code: string | null = null;
      try {
        code = JSON.parse(last).error ?? null;
      } catch {
        // not the JSON error line
      }
      throw new AdminCommandError(`the command exited with code ${output.code}: ${last}`, code);
    }
    return JSON.parse(stdout);
  } finally {
    clearTimeout(timer);
    options.track?.delete(child);
  }
}

/** An HTTP answer with its parsed JSON body. */
export interface JsonAnswer {
  status: number;
  // deno-lint-ignore no-explicit-any
  json: any;
}

/** A JSON request with a time limit; an {@linkcode ExplainedError} when no JSON answer comes. */
export async function requestJson(
  method: "GET" | "POST",
  url: string,
  options: { headers?: Record<string, string>; body?: unknown; timeoutMs: number },
): Promise<JsonAnswer> {
  const headers = options.headers ?? {};
  let response: Response;
  try {
    response = await fetch(url, {
      method,
      headers: options.body === undefined
        ? headers
        : { "Content-Type": "application/json", ...headers },
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      signal: AbortSignal.timeout(options.timeoutMs),
    });
  } catch (error) {
    throw new ExplainedError(`${method} ${url} failed: ${(error as Error).message}`);
  }
  const text = await response.text();
  try {
    return { status: response.status, json: JSON.parse(text) };
  } catch {
    throw new ExplainedError(
      `${method} ${url} answered ${response.status} with: ${text.slice(0, 200)}`,
    );
  }
}
