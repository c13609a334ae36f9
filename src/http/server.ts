/**
 * The HTTP pipeline around every endpoint: request id, routing, the error envelope for every 4xx
 * and 5xx, the common headers, and one `http_request` log line per request.
 */
import { ServiceError } from "../errors.ts";
import { withDeadline } from "../lib/deadline.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../observability/log.ts";
import type { RequestContext, RouteMatch, Router } from "./router.ts";
import { recordRequest, tagRequestSpan, tagRequestTenant } from "../observability/telemetry.ts";

const JSON_TYPE = "application/json; charset=utf-8";

/** Options of {@linkcode createRequestHandler}. */
export interface PipelineOptions {
  router: Router;
  version: string;
  log: Logger;
  /** Tracks requests in flight for a graceful shutdown. */
  inFlight?: InFlight;
  /**
   * The longest a handler may take before the client gets a 500 `INTERNAL_ERROR`: a database
   * that accepts connections but never answers must not hold requests (and a store's
   * notification) open. Default: no limit.
   */
  deadlineMs?: number;
}

/** A JSON response with the given status. */
export function jsonResponse(
  status: number,
  body: unknown,
  headers?: Record<string, string>,
): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: headers ? { "content-type": JSON_TYPE, ...headers } : { "content-type": JSON_TYPE },
  });
}

/**
 * Counts requests in flight so shutdown can wait for them. Deno's `server.shutdown()` cancels the
 * body of a request still being received, so the service drains first and shuts down after.
 */
export class InFlight {
  #count = 0;
  #draining = false;
  #idle: (() => void)[] = [];

  /** Whether shutdown has begun; responses then ask clients to close their connection. */
  get draining(): boolean {
    return this.#draining;
  }

  enter(): void {
    this.#count++;
  }

  leave(): void {
    if (--this.#count === 0) { for (const resolve of this.#idle.splice(0)) resolve(); }
  }

  /** Starts draining; resolves when no request is in flight. */
  drain(): Promise<void> {
    this.#draining = true;
    if (this.#count === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  /** Starts draining; true once no request is in flight, false if some still are after `ms`. */
  drainWithin(ms: number): Promise<boolean> {
    return withDeadline(this.drain(), ms).then(() => true, () => false);
  }
}

/**
 * Builds the `Deno.serve` handler. A route that answers synchronously (`/health`) is answered
 * synchronously here too: `Deno.serve` then skips a promise round trip per request.
 */
export function createRequestHandler(
  options: PipelineOptions,
): (request: Request) => Response | Promise<Response> {
  const { router, version, log, inFlight, deadlineMs } = options;

  return function handle(request: Request): Response | Promise<Response> {
    inFlight?.enter();
    const started = performance.now();
    const context: RequestContext = { reqId: newId("req"), tenantId: null, params: {} };
    const path = pathOf(request.url);
    let route = "none";
    const finish = (response: Response): Response => {
      try {
        recordRequest(route, request.method, response.status);
        tagRequestTenant(context.tenantId);
        response.headers.set("x-request-id", context.reqId);
        response.headers.set("x-service-version", version);
        if (inFlight?.draining) response.headers.set("connection", "close");
        log.info("http_request", {
          reqId: context.reqId,
          method: request.method,
          path,
          status: response.status,
          latencyMs: Math.round((performance.now() - started) * 100) / 100,
          tenantId: context.tenantId,
        });
        return response;
      } finally {
        inFlight?.leave();
      }
    };
    let outcome: Response | Promise<Response>;
    try {
      const match = router.match(request.method, path);
      if (match.kind === "found") {
        route = match.route.name ?? match.route.pattern;
        tagRequestSpan(route, request.method, match.route.pattern);
      }
      outcome = dispatch(request, path, match, context);
    } catch (error) {
      return finish(errorResponse(error, context, log));
    }
    if (outcome instanceof Response) return finish(outcome);
    return outcome.then(finish, (error) => finish(errorResponse(error, context, log)));
  };

  /** The route's answer, synchronous when the route's is; throws what the route throws. */
  function dispatch(
    request: Request,
    path: string,
    match: RouteMatch,
    context: RequestContext,
  ): Response | Promise<Response> {
    if (match.kind === "found") {
      context.params = match.params;
      const handled = match.handler(request, context);
      return deadlineMs === undefined || handled instanceof Response
        ? handled
        : withDeadline(handled, deadlineMs);
    }
    if (match.kind === "method_not_allowed") {
      throw new ServiceError(
        "METHOD_NOT_ALLOWED",
        `${request.method} is not allowed on ${path}; allowed: ${match.allowed.join(", ")}`,
        { headers: { Allow: match.allowed.join(", ") } },
      );
    }
    throw new ServiceError("NOT_FOUND", `no route for ${request.method} ${path}`);
  }
}

/** Turns any thrown value into the error envelope; the one place where that happens. */
function errorResponse(error: unknown, context: RequestContext, log: Logger): Response {
  if (error instanceof ServiceError) {
    const fields = { reqId: context.reqId, code: error.code, status: error.status };
    if (error.status >= 500) {
      log.error("request_failed", { ...fields, ...log.errorFields(error.cause ?? error) });
    } else {
      log.debug("request_rejected", { ...fields, message: error.message });
    }
    const body: Record<string, unknown> = {
      valid: false,
      error: error.code,
      message: error.message,
    };
    if (error.details) body.details = error.details;
    return jsonResponse(error.status, body, error.headers);
  }
  log.error("request_failed", {
    reqId: context.reqId,
    code: "INTERNAL_ERROR",
    status: 500,
    ...log.errorFields(error),
  });
  return internalErrorResponse(context.reqId);
}

/**
 * The 500 envelope. `Deno.serve`'s last-resort `onError` uses it too, with the common headers, so
 * even an error outside the pipeline answers like every other response.
 */
export function internalErrorResponse(reqId: string, headers?: Record<string, string>): Response {
  return jsonResponse(500, {
    valid: false,
    error: "INTERNAL_ERROR",
    message: `internal error; quote request id ${reqId} when reporting it`,
  }, headers);
}

function pathOf(url: string): string {
  // Faster than new URL() on the hot path: skip "scheme://host", stop at "?" or "#".
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  let end = url.length;
  const query = url.indexOf("?", start);
  if (query !== -1) end = query;
  const hash = url.indexOf("#", start);
  if (hash !== -1 && hash < end) end = hash;
  return url.slice(start, end);
}
