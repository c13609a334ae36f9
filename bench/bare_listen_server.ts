/**
 * The baseline of `bench/cold_start.ts`: a bare `Deno.serve` that prints one JSON line,
 * `{"msg":"listening","port":N}`, once it listens, as the service logs its `listening` line. It
 * answers every request with an empty 200. It takes its port from `PORT` (0 by default: any free
 * port) and its address from `HOST`.
 *
 * @module
 */

const port = Number(Deno.env.get("PORT") ?? "0");
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  throw new Error(`PORT must be a port number, got ${Deno.env.get("PORT")}`);
}

Deno.serve({
  port,
  hostname: Deno.env.get("HOST") ?? "127.0.0.1",
  onListen: (addr) => console.log(JSON.stringify({ msg: "listening", port: addr.port })),
}, () => new Response(null));
