import assert from "node:assert/strict";
import { startService, stopAndDrop } from "./helpers/service.ts";

Deno.test("smoke: service boots and answers /health", async () => {
  const service = await startService();
  try {
    const response = await fetch(`${service.url}/health`);
    assert.equal(response.status, 200);
    assert.deepEqual(await response.json(), { status: "ok", version: "dev" });
  } finally {
    await stopAndDrop(service);
  }
});
