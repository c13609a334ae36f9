/**
 * A new embedded database starts from PGlite's initdb output shipped with the code,
 * `pglite_initdb.tar.gz` next to this module (less the two template databases, see
 * {@linkcode initdbDirectory}), instead of running initdb at its first boot: PGlite
 * runs initdb in a second PostgreSQL instance inside the process, which takes seconds and leaves
 * hundreds of MB resident (docs/postgresql.md, "Embedded or PostgreSQL"). The archive holds
 * initdb's output only; the schema still comes from the migrations, applied at boot as on
 * PostgreSQL. `deno task pglite:initdb` rebuilds it (scripts/build_embedded_template.ts) and
 * tests/embedded_template_test.ts checks that it is what the pinned PGlite's initdb makes.
 */
import { join } from "node:path";
import { extractTar, tarArchive, type TarEntry } from "./tar.ts";

import { TEMPLATE_URL } from "../files.ts";

export { TEMPLATE_URL };

/**
 * Makes `dir` hold a database: one that is there already is kept; a missing or empty `dir` gets
 * the template. Returns whether it unpacked the template.
 */
export async function ensureDatabaseDirectory(dir: string): Promise<boolean> {
  if (await exists(join(dir, "PG_VERSION"))) return false;
  // Anything else in the way may be someone's data: stop rather than delete it.
  if (await exists(dir)) {
    for await (const _ of Deno.readDir(dir)) {
      throw new Error(`${dir} holds files but no database (no PG_VERSION); move it away`);
    }
    await Deno.remove(dir);
  }
  // Unpacked beside it and renamed once complete, so that a crash half-way leaves no database
  // that looks whole; the next boot starts the unpacking again.
  const partial = `${dir}.unpacking`;
  await Deno.remove(partial, { recursive: true }).catch((error) => {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  });
  await Deno.mkdir(partial, { mode: 0o700 });
  const template = await Deno.open(TEMPLATE_URL);
  await extractTar(template.readable.pipeThrough(new DecompressionStream("gzip")), partial);
  await Deno.rename(partial, dir);
  return true;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * Runs PGlite's own first boot on the empty directory `dir`: its initdb, a start and a clean stop,
 * with the databases the service never opens dropped. What it leaves is what the template must
 * hold.
 *
 * initdb makes three databases of some 300 files each: `postgres`, the one PGlite serves, and the
 * templates `template0` and `template1`, which only `CREATE DATABASE` reads. One PGlite session
 * never creates a database, and unpacking a file costs about 0.6 ms on a slow disk: without
 * them a new `DATA_DIR` gets 371 files instead of 972, 0.35 s sooner.
 */
export async function initdbDirectory(dir: string): Promise<void> {
  const { PGlite } = await import("@electric-sql/pglite");
  const db = await PGlite.create(dir);
  try {
    await db.exec(
      "UPDATE pg_database SET datistemplate = false WHERE datname IN ('template0', 'template1')",
    );
    // One statement each: DROP DATABASE cannot run inside a transaction block.
    await db.exec("DROP DATABASE template0");
    await db.exec("DROP DATABASE template1");
  } finally {
    await db.close();
  }
}

/** The template of the database in `dir`: every file and directory under it, sorted, gzipped. */
export async function templateArchive(dir: string): Promise<Uint8Array> {
  const entries: TarEntry[] = [];
  const walk = async (relative: string) => {
    const names = [];
    for await (const entry of Deno.readDir(join(dir, relative))) names.push(entry);
    names.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const entry of names) {
      const path = relative === "" ? entry.name : `${relative}/${entry.name}`;
      if (entry.isDirectory) {
        entries.push({ path, type: "directory" });
        await walk(path);
      } else if (entry.isFile) {
        entries.push({ path, type: "file", data: await Deno.readFile(join(dir, path)) });
      } else {
        throw new Error(`${path} in ${dir} is neither a file nor a directory`);
      }
    }
  };
  await walk("");
  const gzip = new Blob([tarArchive(entries)]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(gzip).arrayBuffer());
}
