/**
 * `deno task pglite:initdb`: rebuilds `src/db/embedded/pglite_initdb.tar.gz`, the data directory a new
 * embedded database starts from (src/db/embedded/template.ts), with the PGlite that deno.json
 * pins: its initdb on an empty directory, a clean stop, and the directory's contents archived in
 * name order. Run it after changing PGlite's version; tests/embedded_template_test.ts fails until
 * then. Two builds differ only in `global/pg_control` and the WAL segment (the system identifier
 * and the times initdb writes there).
 */
import { initdbDirectory, TEMPLATE_URL, templateArchive } from "../src/db/embedded/template.ts";

const scratch = await Deno.makeTempDir({ prefix: "purchase-relay-template-" });
try {
  await initdbDirectory(`${scratch}/pglite`);
  const archive = await templateArchive(`${scratch}/pglite`);
  await Deno.writeFile(TEMPLATE_URL, archive);
  console.log(`wrote ${TEMPLATE_URL.pathname} (${(archive.length / 1e6).toFixed(2)} MB)`);
} finally {
  await Deno.remove(scratch, { recursive: true });
}
