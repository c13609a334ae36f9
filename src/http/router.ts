/**
 * A small router: exact segments and `:name` parameters, matched by method and path. Unknown paths
 * and wrong methods are told apart so the server can answer 404 or 405.
 */

/** What a handler receives besides the request. */
export interface RequestContext {
  /** `req_<ULID>`, also sent as `X-Request-Id`. */
  reqId: string;
  /** Set once the request is tied to a tenant; logged with `http_request`. */
  tenantId: string | null;
  /** Path parameters by name. */
  params: Record<string, string>;
}

/** An endpoint. */
export type Handler = (request: Request, context: RequestContext) => Promise<Response> | Response;

/** A route: a method, a pattern such as `/v1/webhooks/storea/:tenantId`, and its handler. */
export interface Route {
  /** The endpoint's name in src/api/mod.ts, for metrics and span names. */
  name?: string;
  method: string;
  pattern: string;
  handler: Handler;
}

/** The outcome of {@linkcode Router.match}. */
export type RouteMatch =
  | { kind: "found"; handler: Handler; params: Record<string, string>; route: Route }
  | { kind: "method_not_allowed"; allowed: string[] }
  | { kind: "not_found" };

interface CompiledRoute extends Route {
  segments: string[];
}

/** The params of a route without parameters; shared, so it is frozen. */
const NO_PARAMS: Record<string, string> = Object.freeze({});

/** Matches requests to routes. A route without parameters wins over one with them. */
export class Router {
  #routes: CompiledRoute[];
  /** Routes without parameters by method and path: most requests are answered by one lookup. */
  #exact = new Map<string, Route>();

  constructor(routes: Route[]) {
    this.#routes = routes.map((route) => ({ ...route, segments: route.pattern.split("/") }));
    for (const route of routes) {
      const key = `${route.method} ${route.pattern}`;
      if (!route.pattern.includes("/:") && !this.#exact.has(key)) {
        this.#exact.set(key, route);
      }
    }
  }

  match(method: string, path: string): RouteMatch {
    const exact = this.#exact.get(`${method} ${path}`);
    if (exact !== undefined) {
      return { kind: "found", handler: exact.handler, params: NO_PARAMS, route: exact };
    }
    const segments = path.split("/");
    const allowed: string[] = [];
    for (const route of this.#routes) {
      const params = matchSegments(route.segments, segments);
      if (params === null) continue;
      if (route.method === method) return { kind: "found", handler: route.handler, params, route };
      if (!allowed.includes(route.method)) allowed.push(route.method);
    }
    return allowed.length > 0 ? { kind: "method_not_allowed", allowed } : { kind: "not_found" };
  }
}

function matchSegments(pattern: string[], actual: string[]): Record<string, string> | null {
  if (pattern.length !== actual.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const expected = pattern[i];
    if (expected.startsWith(":")) {
      if (actual[i] === "") return null;
      try {
        params[expected.slice(1)] = decodeURIComponent(actual[i]);
      } catch {
        return null;
      }
    } else if (expected !== actual[i]) {
      return null;
    }
  }
  return params;
}
