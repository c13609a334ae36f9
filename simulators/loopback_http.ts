/**
 * What the `node:http` simulators share: listening on a loopback port, closing with every
 * connection, answering without keep-alive, and waits that end when the client leaves.
 *
 * Why no keep-alive: Deno's fetch silently retries a request whose reused connection is reset,
 * which would turn one scripted reset into a success. A fresh connection per call is not retried.
 */
import type http from "node:http";
import type { AddressInfo } from "node:net";

/** A loopback address to listen on. */
export type LoopbackAddress = "127.0.0.1" | "::1";

/** Where {@linkcode listenOnLoopback} listens. */
export interface LoopbackListenOptions {
  /** Default 0: a free port. */
  port?: number;
  /** Default `127.0.0.1`. */
  address?: LoopbackAddress;
}

/** Listens on a loopback address, by default 127.0.0.1 on a free port; resolves with the port. */
export function listenOnLoopback(
  server: http.Server,
  options: LoopbackListenOptions = {},
): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(
      options.port ?? 0,
      options.address ?? "127.0.0.1",
      () => resolve((server.address() as AddressInfo).port),
    );
  });
}

/** Stops listening and destroys every connection, hanging and delayed requests included. */
export function closeServer(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/**
 * Answers with `Connection: close` (whatever `headers` say) and, when there is a body and no
 * content type was given, `Content-Type: application/json`.
 */
export function answerAndClose(
  res: http.ServerResponse,
  status: number,
  body: string,
  headers: Record<string, string> = {},
): void {
  const sent: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() !== "connection") sent[name] = value;
  }
  sent["Connection"] = "close";
  if (body !== "" && !Object.keys(sent).some((name) => name.toLowerCase() === "content-type")) {
    sent["Content-Type"] = "application/json";
  }
  res.writeHead(status, sent).end(body);
}

/** Aborts when the client closes its connection before the answer is written. */
export function clientGone(res: http.ServerResponse): AbortSignal {
  const controller = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) controller.abort();
  });
  return controller.signal;
}

/** Resolves true after `ms`, or false as soon as `signal` aborts. */
export function sleepUnlessAborted(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    function onAbort() {
      clearTimeout(timer);
      resolve(false);
    }
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
