/**
 * migrations/0006_event_payload_lz4.sql on this run's engine: where the server has LZ4, new event
 * payloads are stored with it and the certificate chains they repeat cost little room; where it
 * has not (the embedded engine), the default stays. Either way a payload reads back as written.
 */
import assert from "node:assert/strict";
import { connectTestDatabase, ENGINE, freshDatabase } from "./helpers/service.ts";

/** Random base64: what pglz or LZ4 can shrink in it is only what it repeats. */
function randomBase64(chars: number): string {
  const raw = crypto.getRandomValues(new Uint8Array(Math.ceil(chars * 3 / 4)));
  return btoa(String.fromCharCode(...raw)).slice(0, chars);
}

Deno.test("event payloads are stored with LZ4 where the server has it", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test, { poolSize: 1 });
  try {
    const sql = db.sql;
    const [{ lz4 }] = await sql`
      SELECT EXISTS (SELECT FROM pg_settings
                     WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) AS lz4`;
    // Debian's PostgreSQL, which CI runs, has LZ4; PGlite has not.
    assert.equal(lz4, ENGINE === "postgresql");

    // A store A notification's payload repeats one certificate chain (about 4.5 KB) in each of
    // its three signatures, farther apart than pglz looks back.
    const chain = randomBase64(4_600);
    const payload = JSON.stringify({
      raw: { signedPayload: [chain, randomBase64(1_200), chain, randomBase64(900), chain] },
    });
    await sql`INSERT INTO tenants (id, name) VALUES ('tenant_1', 'T')`;
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
      VALUES ('evt_1', 'tenant_1', 'storea', 'x', 'renewed', 'DID_RENEW', ${payload})`;
    const [row] = await sql`
      SELECT payload, pg_column_compression(payload) AS method,
             pg_column_size(payload) AS stored
      FROM events`;
    assert.equal(row.payload, payload);
    if (lz4) {
      assert.equal(row.method, "lz4");
      assert.ok(row.stored < payload.length * 0.45, `${row.stored} of ${payload.length} bytes`);
    } else {
      assert.notEqual(row.method, "lz4");
    }
  } finally {
    await db.close();
    await test.drop();
  }
});
