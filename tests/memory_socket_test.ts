/** The in-memory socket pair the embedded engine's own process connects through. */
import assert from "node:assert/strict";
import { type MemorySocket, memorySocketPair } from "../src/db/embedded/memory_socket.ts";

function received(socket: MemorySocket): () => string {
  let text = "";
  socket.on("data", (chunk: Uint8Array) => text += new TextDecoder().decode(chunk));
  return () => text;
}

function closed(socket: MemorySocket): Promise<void> {
  return new Promise((resolve) => socket.once("close", () => resolve()));
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

Deno.test("memory socket: bytes arrive in order, both ways, after the writer's call returns", async () => {
  const [client, server] = memorySocketPair();
  const atServer = received(server);
  const atClient = received(client);
  for (let i = 0; i < 100; i++) client.write(`c${i};`);
  // A socket never runs the reader inside the writer's call.
  assert.equal(atServer(), "");
  server.write("hello");
  await tick();
  assert.equal(atServer(), Array.from({ length: 100 }, (_, i) => `c${i};`).join(""));
  assert.equal(atClient(), "hello");
  client.destroy();
});

Deno.test("memory socket: a written buffer reused by its writer arrives as it was", async () => {
  const [client, server] = memorySocketPair();
  const atServer = received(server);
  const bytes = new TextEncoder().encode("first");
  client.write(bytes);
  bytes.set(new TextEncoder().encode("XXXXX"));
  await tick();
  assert.equal(atServer(), "first");
  client.destroy();
});

Deno.test("memory socket: end closes both ends after the data; readyState follows", async () => {
  const [client, server] = memorySocketPair();
  const atServer = received(server);
  let ended = false;
  server.on("end", () => ended = true);
  const bothClosed = Promise.all([closed(client), closed(server)]);
  assert.equal(client.readyState, "open");
  client.end("last words");
  // The server, like npm:postgres on a FIN, ends its side too.
  server.on("end", () => server.end());
  await bothClosed;
  assert.equal(atServer(), "last words");
  assert.ok(ended);
  assert.equal(client.readyState, "closed");
  assert.equal(server.readyState, "closed");
});

Deno.test("memory socket: destroying one end closes the other at once, like a reset", async () => {
  const [client, server] = memorySocketPair();
  const serverClosed = closed(server);
  server.destroy();
  await closed(client);
  await serverClosed;
  assert.ok(client.destroyed);
  // A write after the close fails instead of vanishing.
  const failed = await new Promise<Error | null | undefined>((resolve) =>
    client.write("into the void", resolve)
  );
  assert.ok(failed instanceof Error);
});
