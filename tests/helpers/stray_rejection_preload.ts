/**
 * Unhandled rejections on demand inside a service process under test, loaded before `main.ts` with
 * `deno run --preload tests/helpers/stray_rejection_preload.ts`. Never part of what the service
 * runs outside tests: it is only ever loaded by that flag, which no launcher of the service passes.
 *
 * - SIGUSR2: the stray rejection `serve` must survive (src/process/stray_rejections.ts), made for real: a
 *   write on a `node:net` socket after the peer's end, whose outcome a promise nobody holds
 *   carries, as npm:postgres's queued write does when PostgreSQL closes its connection. The
 *   reason is node:net's own error, not a copy of its message.
 * - SIGUSR1: an unrelated unhandled rejection, which must still end the process.
 *
 * A database outage provokes the first only now and then (docs/architecture.md, "Why it is built
 * this way"), too rarely for a test to wait for it.
 */
import net from "node:net";

/** Writes on a loopback socket whose peer has ended it; the write's failure is left unhandled. */
function writeAfterPeerEnd(): void {
  const server = net.createServer((socket) => socket.end());
  server.listen(0, "127.0.0.1", () => {
    const { port } = server.address() as net.AddressInfo;
    const client = net.connect(port, "127.0.0.1");
    // The socket's own error event, which npm:postgres handles; only the promise is stray.
    client.on("error", () => {});
    client.resume();
    client.once("end", () => {
      // By the next turn node:net has ended its side too (allowHalfOpen is off): the write fails.
      setImmediate(() => {
        new Promise<void>((resolve, reject) => {
          client.write("X", (error) => error ? reject(error) : resolve());
        });
        server.close();
      });
    });
  });
}

Deno.addSignalListener("SIGUSR2", writeAfterPeerEnd);
Deno.addSignalListener("SIGUSR1", () => {
  Promise.reject(new Error("an unrelated rejection nobody handles"));
});
