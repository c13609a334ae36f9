/**
 * migrations/0005_attempt_errors_without_url_secrets.sql on this run's engine: errors recorded
 * by earlier versions lose the query strings of the URLs they quote, and nothing else.
 */
import assert from "node:assert/strict";
import { migrate } from "../src/db/migrate.ts";
import { connectTestDatabase, freshDatabase } from "./helpers/service.ts";

const MIGRATION = "0005_attempt_errors_without_url_secrets.sql";

Deno.test("migration 0005: stored attempt errors keep their URLs without the query", async () => {
  const test = await freshDatabase();
  const db = await connectTestDatabase(test, { poolSize: 1, migrated: false });
  try {
    const sql = db.sql;
    await migrate(sql);
    const before = [
      "TypeError: fetch failed: error sending request for url (https://hooks.example.com/x?token=s3cret): client error (Connect)",
      "no answer within 10000 ms",
      "callback URL refused: must use https",
      "see HTTPS://hooks.example.com/a#s3cret and http://h.example/b?c=s3cret end",
    ];
    await sql`INSERT INTO tenants (id, name) VALUES ('tenant_1', 'T')`;
    await sql`
      INSERT INTO events (id, tenant_id, source, external_id, event, platform_event, payload)
      VALUES ('evt_1', 'tenant_1', 'storea', 'x', 'renewed', 'DID_RENEW', '{}')`;
    await sql`
      INSERT INTO deliveries (id, event_id, tenant_id, status, last_error)
      VALUES ('dlv_1', 'evt_1', 'tenant_1', 'failed', ${before[0]})`;
    for (const error of before) {
      await sql`
        INSERT INTO delivery_attempts (delivery_id, attempted_at, duration_ms, error)
        VALUES ('dlv_1', now(), 1, ${error})`;
    }
    // Run the migration again over these rows, as an upgrade does over older ones.
    await sql`DELETE FROM schema_migrations WHERE name = ${MIGRATION}`;
    assert.deepEqual(await migrate(sql), [MIGRATION]);

    const attempts = await sql`SELECT error FROM delivery_attempts ORDER BY id`;
    assert.deepEqual(attempts.map((row) => row.error), [
      "TypeError: fetch failed: error sending request for url (https://hooks.example.com/x client error (Connect)",
      "no answer within 10000 ms",
      "callback URL refused: must use https",
      "see HTTPS://hooks.example.com/a and http://h.example/b end",
    ]);
    const [delivery] = await sql`SELECT last_error FROM deliveries`;
    assert.equal(delivery.last_error, attempts[0].error);
  } finally {
    await db.close();
    await test.drop();
  }
});
