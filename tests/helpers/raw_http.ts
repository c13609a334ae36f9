/** HTTP/1.1 written by hand on a socket: for requests no HTTP client would send. */
import assert from "node:assert/strict";

/** A server's answer read off the socket. */
export interface RawAnswer {
  status: number;
  headers: Headers;
  text: string;
}

/** Options of {@linkcode rawExchange}. */
export interface RawExchangeOptions {
  /** Half-close the connection after writing (for a body shorter than its Content-Length). */
  halfClose?: boolean;
  /** How long the server may take to answer or close; 10 s by default. */
  boundMs?: number;
  /**
   * Stop at the first whole answer rather than at the close: after answering a request whose body
   * it did not read to the end, Deno's server keeps the connection open for the rest.
   */
  untilAnswer?: boolean;
}

/**
 * Writes `request` on a new connection to `port` on loopback, half-closes it when asked, and reads
 * the first answer: null when the server closed the connection without one; fails when the server
 * neither answers nor closes within the bound.
 */
export async function rawExchange(
  port: number,
  request: Uint8Array | string,
  options: RawExchangeOptions = {},
): Promise<RawAnswer | null> {
  const boundMs = options.boundMs ?? 10_000;
  const connection = await Deno.connect({ hostname: "127.0.0.1", port });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    connection.close();
  }, boundMs);
  const chunks: Uint8Array[] = [];
  try {
    await connection.write(
      typeof request === "string" ? new TextEncoder().encode(request) : request,
    );
    // Without a half-close: Deno's server drops an answer when the client's side ends first.
    if (options.halfClose) await connection.closeWrite();
    const buffer = new Uint8Array(64 * 1024);
    while (true) {
      const n = await connection.read(buffer).catch(() => null);
      if (n === null) break;
      chunks.push(buffer.slice(0, n));
      if (options.untilAnswer && isWholeAnswer(chunks)) break;
    }
  } finally {
    clearTimeout(timer);
    try {
      connection.close();
    } catch {
      // closed by the timer
    }
  }
  const bytes = new Uint8Array(chunks.reduce((sum, c) => sum + c.length, 0));
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.length;
  }
  assert.ok(!timedOut, `no answer within ${boundMs} ms`);
  if (bytes.length === 0) return null;
  const text = new TextDecoder().decode(bytes);
  const end = text.indexOf("\r\n\r\n");
  assert.ok(end !== -1, `not an HTTP answer: ${JSON.stringify(text.slice(0, 200))}`);
  const [statusLine, ...headerLines] = text.slice(0, end).split("\r\n");
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1]);
  const headers = new Headers();
  for (const line of headerLines) {
    const colon = line.indexOf(":");
    headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  const length = Number(headers.get("content-length") ?? NaN);
  let content = text.slice(end + 4);
  if (Number.isFinite(length)) content = content.slice(0, length);
  return { status, headers, text: content };
}

/** Whether `chunks` hold an answer's headers and as much body as its `Content-Length` says. */
function isWholeAnswer(chunks: Uint8Array[]): boolean {
  const text = new TextDecoder().decode(
    chunks.reduce((all, c) => new Uint8Array([...all, ...c]), new Uint8Array(0)),
  );
  const end = text.indexOf("\r\n\r\n");
  if (end === -1) return false;
  const length = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))?.[1];
  return length !== undefined &&
    new TextEncoder().encode(text.slice(end + 4)).length >= Number(length);
}
