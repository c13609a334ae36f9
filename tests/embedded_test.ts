/**
 * The embedded engine: many connections, in memory from the hosting process and through its Unix
 * socket from others, share PGlite's one session safely.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import postgres from "postgres";
import { connectDatabase, type Database } from "../src/db/connect.ts";
import { DeadlineExceededError, withDeadline } from "../src/lib/deadline.ts";

/** The engine in `dataDir`, hosted as the service does, or through the host's socket (the CLI). */
function openEmbedded(dataDir: string, poolSize: number, host: boolean): Promise<Database> {
  return connectDatabase({
    databaseUrl: null,
    dataDir,
    poolSize,
    timeoutMs: host ? 30_000 : 5_000,
    shareEmbedded: host,
  });
}

Deno.test("embedded: concurrent transactions from many connections stay isolated", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 8, true);
  // A second client, as the admin CLI would be, on the engine's socket.
  const other = await openEmbedded(dataDir, 2, false);
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

/** A protocol 3.0 startup message as npm:postgres sends it, with `params`. */
function startupMessage(params: Record<string, string>): Uint8Array {
  const body = new TextEncoder().encode(
    Object.entries(params).map(([k, v]) => `${k}\0${v}\0`).join("") + "\0",
  );
  const message = new Uint8Array(8 + body.length);
  const view = new DataView(message.buffer);
  view.setInt32(0, message.length);
  view.setInt32(4, 196608);
  message.set(body, 8);
  return message;
}

/** Connects to the engine's socket, sends `message` and reads until ReadyForQuery ('Z'). */
async function startupAnswer(socketPath: string, message: Uint8Array): Promise<Uint8Array> {
  const conn = await Deno.connect({ transport: "unix", path: socketPath });
  try {
    await conn.write(message);
    let answer = new Uint8Array(0);
    const chunk = new Uint8Array(4096);
    while (true) {
      const n = await conn.read(chunk);
      if (n === null) throw new Error("closed before ReadyForQuery");
      answer = new Uint8Array([...answer, ...chunk.subarray(0, n)]);
      // ReadyForQuery is the last message: 'Z', length 5, status byte.
      if (answer.length >= 6 && answer[answer.length - 6] === 0x5a) return answer;
    }
  } finally {
    conn.close();
  }
}

Deno.test("embedded: a known startup is answered at once while a transaction holds the session", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 2, true);
  const socketPath = `${dataDir}/.s.PGSQL.5432`;
  const message = startupMessage({ user: "postgres", database: "postgres", x: "1" });
  let finish!: () => void;
  const held = new Promise<void>((resolve) => finish = resolve);
  let transaction: Promise<unknown> | undefined;
  try {
    const first = await startupAnswer(socketPath, message); // through PGlite, then remembered
    assert.equal(first[0], 0x52, "AuthenticationOk first");

    let began!: () => void;
    const inside = new Promise<void>((resolve) => began = resolve);
    transaction = db.sql.begin(async (tx) => {
      await tx`SELECT 1`;
      began();
      await held; // the session lock stays with this connection until the transaction ends
    });
    await inside;

    const again = await withDeadline(startupAnswer(socketPath, message), 2_000);
    assert.deepEqual(again, first);
    // A startup PGlite has not answered before still waits for the session.
    const other = startupMessage({ user: "postgres", database: "postgres", x: "2" });
    const unknown = startupAnswer(socketPath, other);
    const outcome = await withDeadline(unknown, 300).then(
      () => "answered",
      (error) => error instanceof DeadlineExceededError ? "waiting" : Promise.reject(error),
    );
    assert.equal(outcome, "waiting");
    finish();
    await transaction;
    assert.equal((await unknown)[0], 0x52);
  } finally {
    finish();
    await transaction?.catch(() => {});
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});

// What sharing one session takes beyond isolation (docs/architecture.md, "Why the embedded engine
// multiplexes sessions itself"): each of these fails on @electric-sql/pglite-socket 0.2.17.

Deno.test("embedded: concurrent connections' statements never run with each other's parameters", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 4, true);
  const other = await openEmbedded(dataDir, 2, false);
  try {
    // Outside a transaction npm:postgres parses and describes first, then binds once it knows
    // the parameter types: another connection's statement in between must not be the one bound.
    const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => {
      const { sql } = i % 3 === 0 ? other : db;
      return i % 2 === 0
        ? sql`SELECT ${i}::int + 1 AS v`
        : sql`SELECT 'text:' || ${String(i)}::text AS v`;
    }));
    answers.forEach((rows, i) => assert.equal(rows[0].v, i % 2 === 0 ? i + 1 : `text:${i}`));
  } finally {
    await other.close();
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});

Deno.test("embedded: an answer larger than the socket's buffer reaches the socket's client whole", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 2, true);
  const other = await openEmbedded(dataDir, 1, false);
  try {
    // Megabytes of rows, each different, as `deliveries list` or a claim's payloads may be: more
    // than a Unix socket takes at once, so the answer waits in the server's write queue.
    for (let round = 0; round < 3; round++) {
      const rows = await withDeadline(
        other.sql`
          SELECT g AS n, repeat(md5(g::text), 64) AS text FROM generate_series(1, 1000) g`,
        10_000,
      );
      assert.equal(rows.length, 1000);
      const wrong = rows.findIndex((row, i) =>
        row.n !== i + 1 ||
        row.text !== createHash("md5").update(String(i + 1)).digest("hex").repeat(64)
      );
      assert.equal(wrong, -1, `row ${wrong} came back changed`);
    }
  } finally {
    await other.close();
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});

Deno.test("embedded: a connection's named statements are deallocated when it closes", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 2, true);
  // A client of the engine's socket that names its statements.
  const other = postgres({
    host: dataDir,
    port: 5432,
    user: "postgres",
    database: "postgres",
    max: 1,
    prepare: true,
  });
  const marked = () =>
    db.sql`SELECT count(*)::int AS n FROM pg_prepared_statements
           WHERE statement LIKE '%AS closing_' || 'marker%'`.then(([row]) => row.n);
  try {
    // The session is shared: each connection's statements live in it under names of their own.
    for (let i = 0; i < 3; i++) {
      const [row] = await other`SELECT ${i}::int AS closing_marker`;
      assert.equal(row.closing_marker, i);
    }
    assert.equal(await marked(), 1, "the statement was prepared once, by name");
    await other.end();
    const deadline = Date.now() + 5_000;
    while (await marked() > 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(await marked(), 0, "the closed connection's statement outlived it");
  } finally {
    await other.end();
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});

Deno.test("embedded: a failing statement takes no other connection's answer with it", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 4, true);
  try {
    // After an error PostgreSQL skips messages until the next Sync: only its own connection's.
    const outcomes = await withDeadline(
      Promise.allSettled(
        Array.from(
          { length: 60 },
          (_, i) =>
            i % 5 === 0
              ? db.sql.unsafe("SELECT missing FROM nowhere WHERE id = $1", [i])
              : db.sql`SELECT ${i}::int AS v`,
        ),
      ),
      20_000,
    );
    outcomes.forEach((outcome, i) => {
      if (i % 5 === 0) {
        assert.ok(outcome.status === "rejected");
        assert.equal(outcome.reason.code, "42P01");
      } else {
        assert.ok(
          outcome.status === "fulfilled",
          String((outcome as PromiseRejectedResult).reason),
        );
        assert.equal(outcome.value[0].v, i);
      }
    });
  } finally {
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});

Deno.test("embedded: a NOTIFY from any connection reaches the engine's listeners", async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "pr-embedded-" });
  const db = await openEmbedded(dataDir, 2, true);
  const other = await openEmbedded(dataDir, 2, false);
  try {
    const heard: string[] = [];
    await db.listen("wake", () => heard.push("wake"));
    await other.sql`NOTIFY wake`; // another process, on the socket
    await db.sql.begin(async (tx) => {
      await tx`NOTIFY wake`;
      assert.deepEqual(heard, ["wake"], "a NOTIFY is heard when its transaction commits");
    });
    await db.sql`NOTIFY other_channel`;
    assert.deepEqual(heard, ["wake", "wake"]);
  } finally {
    await other.close();
    await db.close();
    await Deno.remove(dataDir, { recursive: true });
  }
});
