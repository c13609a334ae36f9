/**
 * What the baseline servers of the benchmarks share: where they listen, and the service's `/health`
 * answer and content type, which the baselines give as the service does.
 *
 * @module
 */

/** The body of `GET /health` for a service of version `dev`. */
export const HEALTH_BODY = JSON.stringify({ status: "ok", version: "dev" });
/** The content type of the service's JSON answers, `GET /health` among them. */
export const JSON_TYPE = "application/json; charset=utf-8";
/** The headers of a bare JSON answer. */
export const JSON_HEADERS = { "content-type": JSON_TYPE };

/**
 * Where a baseline listens: the port from `PORT` (`defaultPort` without it) and the address from
 * `HOST` (loopback without it). Port 0, any free port, is accepted only where it is the default:
 * the other baselines are reached at the port they were given.
 */
export function baselineAddress(defaultPort: number): { port: number; hostname: string } {
  const port = Number(Deno.env.get("PORT") ?? String(defaultPort));
  const lowest = defaultPort === 0 ? 0 : 1;
  if (!Number.isInteger(port) || port < lowest || port > 65535) {
    throw new Error(`PORT must be a port number, got ${Deno.env.get("PORT")}`);
  }
  return { port, hostname: Deno.env.get("HOST") ?? "127.0.0.1" };
}
