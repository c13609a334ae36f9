/**
 * `deno task dev` run as a developer runs it (the task line of deno.json, with its permissions),
 * and the lines it prints, read back so that a test can run them as they would be pasted.
 */
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** A first start downloads nothing here but may create the embedded database. */
const READY_TIMEOUT_MS = 180_000;
const STOP_TIMEOUT_MS = 30_000;

/** What the banner of `deno task dev` said. */
export interface DevBanner {
  serviceUrl: string;
  tenantId: string;
  apiKey: string;
  callbackUrl: string;
  webhookSecret: string;
  /** Whether it said the tenant was kept from the last run. */
  kept: boolean;
  /** The two verify commands, as printed. */
  curlLines: string[];
  /** The `... tenant set-callback ...` command, as printed. */
  setCallbackLine: string;
  /** The `... trigger ...` commands, as printed. */
  triggerLines: string[];
}

/** A running `deno task dev`. */
export interface DevLoop {
  banner: DevBanner;
  /** Everything it printed on stdout so far. */
  output(): string;
  /** SIGTERM, as Ctrl-C would; resolves with its exit code. */
  stop(): Promise<number>;
}

/** Starts `deno task -q dev` with `env` added to this process's environment. */
export async function startDevLoop(env: Record<string, string>): Promise<DevLoop> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", "dev"],
    cwd: ROOT,
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let stdout = "";
  let stderr = "";
  const ready = Promise.withResolvers<void>();
  const pumps = Promise.all([
    (async () => {
      for await (const text of child.stdout.pipeThrough(new TextDecoderStream())) {
        stdout += text;
        if (/^Ready\./m.test(stdout)) ready.resolve();
      }
    })(),
    (async () => {
      for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) stderr += text;
    })(),
  ]);
  const status = child.status.then(async (status) => {
    await pumps.catch(() => {});
    ready.reject(new Error(`deno task dev exited with ${status.code}:\n${stdout}\n${stderr}`));
    return status;
  });
  const timer = setTimeout(
    () => ready.reject(new Error(`deno task dev was not ready:\n${stdout}\n${stderr}`)),
    READY_TIMEOUT_MS,
  );
  let stopping: Promise<number> | null = null;
  const stop = () => {
    stopping ??= (async () => {
      try {
        child.kill("SIGTERM");
      } catch {
        // exited already
      }
      const killer = setTimeout(() => {
        try {
          child.kill("SIGKILL");
        } catch {
          // exited meanwhile
        }
      }, STOP_TIMEOUT_MS);
      const { code } = await status;
      clearTimeout(killer);
      return code;
    })();
    return stopping;
  };
  try {
    await ready.promise;
  } catch (error) {
    await stop();
    throw error;
  } finally {
    clearTimeout(timer);
  }
  return { banner: parseBanner(stdout), output: () => stdout, stop };
}

/** Reads the banner's fields and commands; throws naming what it lacks. */
export function parseBanner(text: string): DevBanner {
  const field = (label: string) => {
    const match = new RegExp(`^  ${label} +(\\S+)`, "m").exec(text);
    if (!match) throw new Error(`the banner has no ${label}:\n${text}`);
    return match[1];
  };
  const commands = text.split("\n").map((line) => line.trim());
  return {
    serviceUrl: field("Service"),
    tenantId: field("Tenant"),
    apiKey: field("API key"),
    callbackUrl: field("Callback URL"),
    webhookSecret: field("Webhook secret"),
    kept: /kept from the last run/.test(text),
    curlLines: commands.filter((line) => line.startsWith("curl ")),
    setCallbackLine: commands.find((line) => line.includes(" tenant set-callback ")) ?? "",
    triggerLines: commands.filter((line) => / deno task cli trigger /.test(line)),
  };
}

/** The words of a shell command line: double and single quotes, no expansions. */
export function shellWords(line: string): string[] {
  const words: string[] = [];
  let word = "";
  let quote: '"' | "'" | null = null;
  let started = false;
  for (const char of line) {
    if (quote !== null) {
      if (char === quote) quote = null;
      else word += char;
    } else if (char === '"' || char === "'") {
      quote = char;
      started = true;
    } else if (char === " ") {
      if (started || word !== "") words.push(word);
      word = "";
      started = false;
    } else {
      word += char;
    }
  }
  if (started || word !== "") words.push(word);
  return words;
}

/** What `curl -s URL -H "Name: value" ... -d BODY` sends, sent with fetch. */
export function fetchLikeCurl(line: string): Promise<Response> {
  const words = shellWords(line);
  if (words[0] !== "curl") throw new Error(`not a curl command: ${line}`);
  let url = "";
  const headers = new Headers();
  let body: string | undefined;
  for (let i = 1; i < words.length; i++) {
    if (words[i] === "-s") continue;
    if (words[i] === "-H") {
      const [name, ...value] = words[++i].split(":");
      headers.set(name.trim(), value.join(":").trim());
    } else if (words[i] === "-d") {
      body = words[++i];
      if (!headers.has("content-type")) {
        headers.set("content-type", "application/x-www-form-urlencoded");
      }
    } else if (!words[i].startsWith("-") && url === "") {
      url = words[i];
    } else {
      throw new Error(`unexpected curl word ${words[i]} in ${line}`);
    }
  }
  // As curl: -d makes it a POST.
  return fetch(url, { method: body === undefined ? "GET" : "POST", headers, body });
}

/** The result of a printed command run through `sh -c`. */
export interface ShellResult {
  code: number;
  stdout: string;
  stderr: string;
  // deno-lint-ignore no-explicit-any
  json: any;
}

/** Runs a printed command line as pasted into a shell in the checkout, with `env` added. */
export async function runPrinted(line: string, env: Record<string, string>): Promise<ShellResult> {
  const output = await new Deno.Command("sh", {
    args: ["-c", line],
    cwd: ROOT,
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(120_000),
  }).output();
  const stdout = new TextDecoder().decode(output.stdout);
  const stderr = new TextDecoder().decode(output.stderr);
  let json = null;
  try {
    json = JSON.parse(output.code === 0 ? stdout : stderr.trim().split("\n").at(-1) ?? "");
  } catch {
    json = null;
  }
  return { code: output.code, stdout, stderr, json };
}
