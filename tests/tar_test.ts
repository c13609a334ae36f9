/** The tar reader and writer behind the embedded engine's template. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { extractTar, tarArchive, type TarEntry, TarError } from "../src/db/embedded/tar.ts";

/** `bytes` as a stream of chunks of `size` bytes, as a decompressor would hand them over. */
function chunked(bytes: Uint8Array, size: number): ReadableStream<Uint8Array> {
  let offset = 0;
  return new ReadableStream({
    pull(controller) {
      if (offset >= bytes.length) return controller.close();
      controller.enqueue(bytes.slice(offset, offset + size));
      offset += size;
    },
  });
}

async function withDir(run: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "pr-tar-" });
  try {
    await run(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const big = crypto.getRandomValues(new Uint8Array(60_000));
const longPath = `${"d".repeat(60)}/${"e".repeat(60)}/${"f".repeat(90)}`;
const entries: TarEntry[] = [
  { path: "PG_VERSION", type: "file", data: new TextEncoder().encode("18\n") },
  { path: "base", type: "directory" },
  { path: "base/1", type: "directory" },
  { path: "base/1/112", type: "file", data: big },
  { path: "base/1/empty", type: "file", data: new Uint8Array(0) },
  { path: "pg_tblspc", type: "directory" },
  { path: longPath, type: "file", data: new TextEncoder().encode("deep") },
];

for (const chunkSize of [1, 511, 4096, 1 << 20]) {
  Deno.test(`tar: what is written is read back, in chunks of ${chunkSize} bytes`, async () => {
    await withDir(async (dir) => {
      const archive = tarArchive(entries);
      assert.equal(await extractTar(chunked(archive, chunkSize), dir), entries.length);
      for (const entry of entries) {
        const info = await Deno.stat(join(dir, entry.path));
        if (entry.type === "directory") {
          assert.ok(info.isDirectory, entry.path);
          assert.equal(info.mode! & 0o777, 0o700);
        } else {
          assert.deepEqual(await Deno.readFile(join(dir, entry.path)), entry.data);
          assert.equal(info.mode! & 0o777, 0o600);
        }
      }
      // An empty directory survives the trip (PostgreSQL needs its empty pg_tblspc).
      assert.deepEqual(await Array.fromAsync(Deno.readDir(join(dir, "pg_tblspc"))), []);
    });
  });
}

Deno.test("tar: the archive is what GNU tar reads", async () => {
  await withDir(async (dir) => {
    await Deno.writeFile(join(dir, "a.tar"), tarArchive(entries));
    const { stdout } = await new Deno.Command("tar", { args: ["-tvf", join(dir, "a.tar")] })
      .output();
    const listed = new TextDecoder().decode(stdout).trim().split("\n");
    assert.equal(listed.length, entries.length);
    assert.ok(listed.some((line) => line.endsWith(longPath)), "the long path, from its prefix");
    assert.ok(listed.some((line) => /^-rw------- 0\/0 +60000 /.test(line)), listed.join("\n"));
  });
});

/** A one-member archive whose header is edited by `edit` after it was built. */
function tampered(edit: (header: Uint8Array) => void, fixChecksum = true): Uint8Array {
  const archive = tarArchive([{ path: "x", type: "file", data: new Uint8Array(3) }]);
  const header = archive.subarray(0, 512);
  edit(header);
  if (fixChecksum) {
    header.fill(0x20, 148, 156);
    const sum = header.reduce((total, byte) => total + byte, 0);
    header.set(new TextEncoder().encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  }
  return archive;
}

const setName = (name: string) => (header: Uint8Array) => {
  header.fill(0, 0, 100);
  header.set(new TextEncoder().encode(name), 0);
};

for (
  const [what, archive, message] of [
    ["a path that climbs out", tampered(setName("../escaped")), /refusing the member path/],
    ["an absolute path", tampered(setName("/tmp/escaped")), /refusing the member path/],
    ["a symbolic link", tampered((h) => h[156] = 0x32), /neither a file nor a directory/],
    ["a damaged header", tampered((h) => h[0] = 0x79, false), /checksum/],
    ["a cut archive", tarArchive([{ path: "x", type: "file", data: big }]).slice(0, 4096), /ends/],
  ] as const
) {
  Deno.test(`tar: refuses ${what}`, async () => {
    await withDir(async (dir) => {
      await assert.rejects(extractTar(chunked(archive, 1000), dir), (error: Error) => {
        assert.ok(error instanceof TarError, String(error));
        assert.match(error.message, message);
        return true;
      });
      const parent = await Array.fromAsync(Deno.readDir(join(dir, "..")));
      assert.ok(!parent.some((entry) => entry.name === "escaped"));
    });
  });
}

Deno.test("tar: the writer refuses a path a reader would refuse", () => {
  assert.throws(() => tarArchive([{ path: "a/../b", type: "directory" }]), TarError);
});

Deno.test("tar: a file that cannot be written fails the extraction", async () => {
  await withDir(async (dir) => {
    // Written several at a time: the failure of one must still reach the caller.
    const twice = tarArchive([
      ...Array.from({ length: 40 }, (_, i): TarEntry => ({ path: `f${i}`, type: "file" })),
      { path: "f3", type: "file", data: new Uint8Array(1) },
    ]);
    await assert.rejects(extractTar(chunked(twice, 4096), dir), Deno.errors.AlreadyExists);
  });
});
