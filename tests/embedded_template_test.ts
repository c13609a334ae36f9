/**
 * The embedded engine's template (src/db/embedded/template.ts): it is what the pinned PGlite's
 * initdb makes, a new database is unpacked from it, and nothing that is already there is lost.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  ensureDatabaseDirectory,
  initdbDirectory,
  TEMPLATE_URL,
} from "../src/db/embedded/template.ts";
import { extractTar } from "../src/db/embedded/tar.ts";
import { connectDatabase } from "../src/db/connect.ts";

/**
 * The files that two runs of initdb write differently: the control file (the system identifier,
 * times) and the WAL that records them. Every other file must be byte for byte the same.
 */
const DIFFERS_PER_RUN = new Set(["global/pg_control", "pg_wal/000000010000000000000001"]);

/** Every file and directory under `dir`, by relative path: its bytes, or null for a directory. */
async function contents(dir: string): Promise<Map<string, Uint8Array | null>> {
  const found = new Map<string, Uint8Array | null>();
  const walk = async (relative: string) => {
    for await (const entry of Deno.readDir(join(dir, relative))) {
      const path = relative === "" ? entry.name : `${relative}/${entry.name}`;
      if (entry.isDirectory) {
        found.set(path, null);
        await walk(path);
      } else {
        found.set(path, await Deno.readFile(join(dir, path)));
      }
    }
  };
  await walk("");
  return found;
}

async function unpackTemplate(dir: string): Promise<void> {
  await Deno.mkdir(dir);
  const file = await Deno.open(TEMPLATE_URL);
  await extractTar(file.readable.pipeThrough(new DecompressionStream("gzip")), dir);
}

async function withDir(run: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "pr-template-" });
  try {
    await run(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("template: it is what the pinned PGlite's initdb makes (else: deno task pglite:initdb)", async () => {
  await withDir(async (dir) => {
    await unpackTemplate(join(dir, "shipped"));
    await initdbDirectory(join(dir, "fresh"));
    const shipped = await contents(join(dir, "shipped"));
    const fresh = await contents(join(dir, "fresh"));
    const rebuild = "the template is not what this PGlite's initdb makes: " +
      "run `deno task pglite:initdb` and commit src/db/embedded/pglite_initdb.tar.gz";
    assert.deepEqual([...shipped.keys()].sort(), [...fresh.keys()].sort(), rebuild);
    for (const [path, bytes] of fresh) {
      const theirs = shipped.get(path)!;
      if (bytes === null || DIFFERS_PER_RUN.has(path)) {
        assert.equal(theirs?.length, bytes?.length, `${path}: ${rebuild}`);
      } else {
        assert.deepEqual(theirs, bytes, `${path}: ${rebuild}`);
      }
    }
    // Only initdb's output: no schema, which the migrations make at boot.
    assert.ok(!shipped.has("base/5/schema_migrations"));
    // One database, the one PGlite serves: not the templates, whose files only slow the unpacking.
    const databases = [...shipped.keys()].filter((path) => /^base\/[^/]+$/.test(path));
    assert.deepEqual(databases, ["base/5"]);
  });
});

Deno.test("template: a new DATA_DIR starts from it, with no schema before the migrations", async () => {
  await withDir(async (dataDir) => {
    const db = await connectDatabase({
      databaseUrl: null,
      dataDir,
      poolSize: 2,
      timeoutMs: 30_000,
      shareEmbedded: false,
    });
    let booted: string;
    try {
      const [tables] = await db.sql`
        SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = 'public'`;
      assert.equal(tables.n, 0, "a new database holds no tables before the migrations");
      [{ id: booted }] = await db
        .sql`SELECT system_identifier::text AS id FROM pg_control_system()`;
    } finally {
      await db.close();
    }
    // initdb would have drawn a new system identifier: the template's is kept.
    const template = join(dataDir, "template");
    await unpackTemplate(template);
    const control = await Deno.readFile(join(template, "global/pg_control"));
    // pg_control starts with the system identifier, a little-endian uint64.
    assert.equal(booted, new DataView(control.buffer).getBigUint64(0, true).toString());
  });
});

Deno.test("template: a database already there is kept as it is", async () => {
  await withDir(async (dir) => {
    const target = join(dir, "pglite");
    assert.equal(await ensureDatabaseDirectory(target), true);
    await Deno.writeTextFile(join(target, "marker"), "mine");
    assert.equal(await ensureDatabaseDirectory(target), false);
    assert.equal(await Deno.readTextFile(join(target, "marker")), "mine");
  });
});

Deno.test("template: files without a database are refused, not deleted", async () => {
  await withDir(async (dir) => {
    const target = join(dir, "pglite");
    await Deno.mkdir(target);
    await Deno.writeTextFile(join(target, "notes.txt"), "someone's");
    await assert.rejects(ensureDatabaseDirectory(target), /holds files but no database/);
    assert.equal(await Deno.readTextFile(join(target, "notes.txt")), "someone's");
  });
});

Deno.test("template: an unpacking cut short is started again; an empty directory is filled", async () => {
  await withDir(async (dir) => {
    const target = join(dir, "pglite");
    // What a crash half-way leaves: the partial directory, never the database's own.
    await Deno.mkdir(`${target}.unpacking/base`, { recursive: true });
    await Deno.writeTextFile(`${target}.unpacking/PG_VERSION`, "half");
    await Deno.mkdir(target);
    assert.equal(await ensureDatabaseDirectory(target), true);
    assert.equal((await Deno.readTextFile(join(target, "PG_VERSION"))).trim(), "18");
    await assert.rejects(Deno.stat(`${target}.unpacking`), Deno.errors.NotFound);
  });
});
