/**
 * A connected pair of in-memory sockets: what one end writes, the other reads, in order.
 *
 * The process that hosts the embedded engine hands one end to `npm:postgres` (its `socket`
 * option) and the other to the engine's connection handler, so its own queries never cross a
 * Unix socket. Over a Unix socket, under load after a crash, connections of the same process can
 * stall for good: the engine answers the first half of a query and the second half never arrives.
 * In memory, nothing can be held back between the two.
 *
 * Each end behaves like a `net.Socket` as far as both users need: `data`, `end` and `close`
 * events, `write`, `end` (half-close, then close once both sides ended), `destroy` (closes both
 * ends at once, like a reset), and `readyState`.
 */
import { Buffer } from "node:buffer";
import { Duplex } from "node:stream";

/** One end of a {@linkcode memorySocketPair}. */
export class MemorySocket extends Duplex {
  #peer: MemorySocket | null = null;

  constructor() {
    super({ allowHalfOpen: false });
  }

  /** What `npm:postgres` reads to know whether it may still write. */
  get readyState(): "open" | "closed" {
    return this.destroyed ? "closed" : "open";
  }

  /** Links two fresh ends; used by {@linkcode memorySocketPair} only. */
  connectTo(peer: MemorySocket): void {
    this.#peer = peer;
  }

  override _read(): void {
    // Data is pushed by the peer as it writes; there is nothing to pull.
  }

  override _write(
    chunk: Uint8Array,
    _encoding: string,
    callback: (error?: Error | null) => void,
  ): void {
    const peer = this.#peer;
    if (peer === null || peer.destroyed) {
      callback(new Error("the other end of the connection is closed"));
      return;
    }
    // Delivered on a later microtask, as a socket would: a writer never runs the reader's
    // handler inside its own call (npm:postgres writes from inside its data handler).
    // A copy: the writer may reuse its bytes (the engine writes views of its own memory).
    const copy = Buffer.from(chunk);
    queueMicrotask(() => {
      if (!peer.destroyed) peer.push(copy);
    });
    callback();
  }

  override _final(callback: (error?: Error | null) => void): void {
    const peer = this.#peer;
    // After the data written before it, like a FIN.
    queueMicrotask(() => {
      if (peer !== null && !peer.destroyed) peer.push(null);
    });
    callback();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    const peer = this.#peer;
    if (peer !== null && !peer.destroyed) peer.destroy();
    callback(error);
  }

  /** `net.Socket` has it; a memory socket needs no keep-alive. */
  setKeepAlive(): this {
    return this;
  }
}

/** Two connected ends: the client's and the server's. */
export function memorySocketPair(): [client: MemorySocket, server: MemorySocket] {
  const client = new MemorySocket();
  const server = new MemorySocket();
  client.connectTo(server);
  server.connectTo(client);
  return [client, server];
}
