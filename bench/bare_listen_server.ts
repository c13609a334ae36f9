/**
 * The baseline of `bench/cold_start.ts`: a bare `Deno.serve` that prints one JSON line,
 * `{"msg":"listening","port":N}`, once it listens, as the service logs its `listening` line. It
 * answers every request with an empty 200. It takes its port from `PORT` (0 by default: any free
 * port) and its address from `HOST`.
 *
 * @module
 */
import { baselineAddress } from "./baseline.ts";

const { port, hostname } = baselineAddress(0);

Deno.serve({
  port,
  hostname,
  onListen: (addr) => console.log(JSON.stringify({ msg: "listening", port: addr.port })),
}, () => new Response(null));
