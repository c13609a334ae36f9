/**
 * Serves one PGlite to `npm:postgres` connections two ways, the embedded engine's own server
 * (src/db/embedded/server.ts) and `@electric-sql/pglite-socket`'s `PGLiteSocketServer`, runs the same
 * cases against each over a Unix socket, and prints what each answered as a markdown table: the
 * record behind docs/architecture.md, "Why the embedded engine multiplexes sessions itself".
 *
 * pglite-socket is not a dependency of the project: install the version to compare in a scratch
 * directory and pass its module's path.
 *
 *     (mkdir -p /tmp/pglite-socket && cd /tmp/pglite-socket &&
 *       npm install --legacy-peer-deps @electric-sql/pglite-socket@0.2.17)
 *     deno run --allow-all scripts/compare_pglite_socket.ts \
 *       /tmp/pglite-socket/node_modules/@electric-sql/pglite-socket/dist/index.js
 *
 * `--legacy-peer-deps`: pglite-socket 0.2.17 asks for exactly PGlite 0.5.14 and the project pins
 * 0.5.16. It only calls PGlite's public methods, on the instance it is given: the project's.
 * @module
 */
import postgres from "postgres";
import { join } from "node:path";
import { SOCKET_NAME, startEmbeddedServer } from "../src/db/embedded/server.ts";
import { ensureDatabaseDirectory } from "../src/db/embedded/template.ts";
import { DeadlineExceededError, withDeadline } from "../src/lib/deadline.ts";

/** What the cases need of a server: where its socket is, and how to stop it. */
interface Served {
  socketDir: string;
  /** Calls `onNotify` on a NOTIFY of `channel` from any connection, if the server can. */
  listen(channel: string, onNotify: () => void): Promise<void>;
  stop(): Promise<void>;
}

/** The part of pglite-socket's module this script uses. */
interface PgliteSocketModule {
  PGLiteSocketServer: new (options: {
    db: unknown;
    path: string;
    maxConnections?: number;
  }) => { start(): Promise<void>; stop(): Promise<void> };
}

type Case = (served: Served) => Promise<string>;

const CASE_DEADLINE_MS = 10_000;

/** A pool of `max` connections to the server, as the admin CLI connects. */
function client(served: Served, max: number): postgres.Sql {
  return postgres({
    host: served.socketDir,
    port: 5432,
    user: "postgres",
    database: "postgres",
    max,
    prepare: false,
    connect_timeout: 5,
    onnotice: () => {},
  });
}

const cases: Record<string, Case> = {
  "200 parameterised statements of two kinds at once, on 4 connections": async (served) => {
    const sql = client(served, 4);
    try {
      const answers = await Promise.all(
        Array.from(
          { length: 200 },
          (_, i) =>
            i % 2 === 0
              ? sql`SELECT ${i}::int + 1 AS v`
              : sql`SELECT 'text:' || ${String(i)}::text AS v`,
        ),
      );
      const wrong = answers.filter((rows, i) => rows[0].v !== (i % 2 ? `text:${i}` : i + 1));
      const example = wrong.length > 0 ? ` (e.g. ${JSON.stringify(wrong[0][0].v)})` : "";
      return `${200 - wrong.length} right, ${wrong.length} wrong without an error${example}`;
    } finally {
      await sql.end({ timeout: 1 });
    }
  },
  "60 statements at once, every fifth one failing at Parse, on 4 connections": async (served) => {
    const sql = client(served, 4);
    try {
      const outcomes = await Promise.all(Array.from({ length: 60 }, (_, i) =>
        withDeadline(
          i % 5 === 0
            ? sql.unsafe("SELECT missing FROM nowhere WHERE id = $1", [i])
            : sql`SELECT ${i}::int AS v`,
          CASE_DEADLINE_MS / 2,
        ).then(
          (rows) => rows[0]?.v === i ? "right" : "wrong",
          (error) => error instanceof DeadlineExceededError ? "no answer" : "error",
        )));
      const good = outcomes.filter((_, i) => i % 5 !== 0);
      const count = (what: string) => good.filter((outcome) => outcome === what).length;
      return `of the 48 good ones: ${count("right")} right, ${count("wrong")} wrong, ` +
        `${count("no answer")} unanswered after ${CASE_DEADLINE_MS / 2000} s`;
    } finally {
      await sql.end({ timeout: 1 });
    }
  },
  "NOTIFY from a client: heard by the process serving PGlite": async (served) => {
    let heard = 0;
    await served.listen("wake", () => heard++);
    const sql = client(served, 1);
    try {
      await sql`NOTIFY wake`;
      await new Promise((resolve) => setTimeout(resolve, 200));
      return heard === 1 ? "heard" : `heard ${heard} times`;
    } finally {
      await sql.end({ timeout: 1 });
    }
  },
};

/** The project's server on a fresh database in `dir`. */
async function ourServer(dir: string): Promise<Served> {
  const engine = await startEmbeddedServer(dir, dir);
  return {
    socketDir: dir,
    listen: (channel, onNotify) => engine.listen(channel, onNotify),
    stop: () => engine.close(),
  };
}

/** pglite-socket's server, on the same PGlite, on a fresh database in `dir`. */
async function theirServer(dir: string, module: PgliteSocketModule): Promise<Served> {
  const { PGlite } = await import("@electric-sql/pglite");
  await ensureDatabaseDirectory(join(dir, "pglite"));
  const db = await PGlite.create(join(dir, "pglite"));
  const server = new module.PGLiteSocketServer({
    db,
    path: join(dir, SOCKET_NAME),
    maxConnections: 16, // its default, 1, refuses a pool's second connection
  });
  await server.start();
  return {
    socketDir: dir,
    // PGlite's own listeners: pglite-socket has none of its own.
    listen: async (channel, onNotify) => void await db.listen(channel, () => onNotify()),
    async stop() {
      await server.stop();
      await db.close();
    },
  };
}

async function runCases(start: (dir: string) => Promise<Served>): Promise<string[]> {
  const results: string[] = [];
  for (const run of Object.values(cases)) {
    const dir = await Deno.makeTempDir({ prefix: "pr-compare-" });
    const served = await start(dir);
    try {
      results.push(
        await withDeadline(run(served), CASE_DEADLINE_MS).catch((error) =>
          error instanceof DeadlineExceededError
            ? `no answer within ${CASE_DEADLINE_MS / 1000} s`
            : `error: ${error.message}`
        ),
      );
    } finally {
      await withDeadline(served.stop(), 5_000).catch(() => {});
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  }
  return results;
}

if (import.meta.main) {
  const path = Deno.args[0];
  if (!path) {
    console.error("usage: compare_pglite_socket.ts <path to pglite-socket's dist/index.js>");
    Deno.exit(2);
  }
  const module: PgliteSocketModule = await import(new URL(path, `file://${Deno.cwd()}/`).href);
  const ours = await runCases(ourServer);
  const theirs = await runCases((dir) => theirServer(dir, module));
  console.log("| case | src/db/embedded/server.ts | pglite-socket |\n| --- | --- | --- |");
  Object.keys(cases).forEach((name, i) => console.log(`| ${name} | ${ours[i]} | ${theirs[i]} |`));
  Deno.exit(0); // pglite-socket's server can leave a timer behind
}
