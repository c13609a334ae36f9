/**
 * A callback on loopback that answers byte by byte as a test scripts it: for the HTTP clients'
 * tests, which need answers no HTTP server library would send (malformed, endless, mixed framing)
 * and connections dropped on cue.
 */

/**
 * What a scripted callback does with each request on a connection: the bytes it answers; an empty
 * chunk closes the connection.
 */
export type Script = (
  request: number,
  connection: number,
) => AsyncIterable<Uint8Array> | Uint8Array;

export interface ScriptedCallback {
  url: string;
  /** Requests received on each connection, in the order connections were accepted. */
  requests: number[];
  /** Bytes written to the client, over every connection. */
  written: () => number;
  /**
   * Resolves when the client ends the `connection`th connection accepted (it closes it, or the
   * connection fails), not when the script or {@linkcode ScriptedCallback.close} ends it.
   */
  clientClosed(connection: number): Promise<void>;
  close(): Promise<void>;
}

const encoder = new TextEncoder();
/** `value` as the bytes to answer. */
export function text(value: string): Uint8Array {
  return encoder.encode(value);
}

/** A callback on loopback that reads each request whole and answers what `script` gives. */
export function scriptedCallback(script: Script): ScriptedCallback {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const requests: number[] = [];
  const conns = new Set<Deno.Conn>();
  const clientClosed: PromiseWithResolvers<void>[] = [];
  let closing = false;
  let written = 0;
  const ended = (connection: number) => {
    while (clientClosed.length <= connection) clientClosed.push(Promise.withResolvers<void>());
    return clientClosed[connection];
  };
  const serving = (async () => {
    for await (const conn of listener) {
      conns.add(conn);
      const index = requests.push(0) - 1;
      (async () => {
        const buffer = new Uint8Array(64 * 1024);
        let pending = "";
        try {
          while (true) {
            const n = await conn.read(buffer);
            if (n === null) {
              ended(index).resolve();
              break;
            }
            pending += new TextDecoder().decode(buffer.subarray(0, n));
            const end = pending.indexOf("\r\n\r\n");
            const length = Number(/content-length: (\d+)/i.exec(pending)?.[1] ?? 0);
            if (end === -1 || pending.length < end + 4 + length) continue;
            pending = pending.slice(end + 4 + length);
            const answer = script(requests[index]++, index);
            const parts = answer instanceof Uint8Array ? [answer] : answer;
            for await (const part of parts) {
              if (part.length === 0) return;
              await conn.write(part);
              written += part.length;
            }
          }
        } catch {
          // the client closed the connection
          if (!closing) ended(index).resolve();
        } finally {
          conns.delete(conn);
          try {
            conn.close();
          } catch {
            // closed already
          }
        }
      })();
    }
  })().catch(() => {});
  return {
    url: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}/hooks`,
    requests,
    written: () => written,
    clientClosed: (connection) => ended(connection).promise,
    async close() {
      closing = true;
      listener.close();
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // closed already
        }
      }
      await serving;
    },
  };
}
