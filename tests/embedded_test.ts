/** The embedded engine's socket server: many connections share PGlite's one session safely. */
import assert from "node:assert/strict";
import { connectDatabase } from "../src/db/connect.ts";

Deno.test("embedded: concurrent transactions from many connections stay isolated", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await connectDatabase({
    databaseUrl: null,
    dataDir,
    poolSize: 8,
    timeoutMs: 30_000,
    shareEmbedded: true,
  });
  // A second client, as the admin CLI would be, on the same socket.
  const other = await connectDatabase({
    databaseUrl: null,
    dataDir,
    poolSize: 2,
    timeoutMs: 5_000,
    shareEmbedded: false,
  });
  try {
    await db.sql`CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)`;
    await db.sql`INSERT INTO counters VALUES (1, 0)`;
    const increments = Array.from(
      { length: 60 },
      (_, i) =>
        (i % 3 === 0 ? other : db).sql.begin(async (tx) => {
          const [row] = await tx`SELECT n FROM counters WHERE id = 1`;
          await tx`UPDATE counters SET n = ${row.n + 1} WHERE id = 1`;
        }),
    );
    // Failing transactions roll back and do not disturb the others.
    const failures = Array.from({ length: 10 }, () =>
      db.sql.begin(async (tx) => {
        await tx`UPDATE counters SET n = n + 1000 WHERE id = 1`;
        await tx`SELECT 1 / 0`;
      }).then(() => "committed", () => "rolled back"));
    const parallelReads = Array.from({ length: 200 }, (_, i) => db.sql`SELECT ${i}::int AS i`);
    await Promise.all(increments);
    assert.deepEqual(new Set(await Promise.all(failures)), new Set(["rolled back"]));
    const reads = await Promise.all(parallelReads);
    reads.forEach((rows, i) => assert.equal(rows[0].i, i));
    const [row] = await other.sql`SELECT n FROM counters WHERE id = 1`;
    assert.equal(row.n, 60);
  } finally {
    await other.close();
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});
