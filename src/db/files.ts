/**
 * Files the service reads from its own installation, named apart from the code that reads them so
 * that computing the service's permissions (src/process/permissions.ts, which `deno task start` runs before
 * the service starts) loads nothing else of the database's code.
 * @module
 */

/** The migration files' folder: read at boot. */
export const MIGRATIONS_DIR: URL = new URL("../../migrations/", import.meta.url);

/** PGlite's initdb output, as a gzip-compressed tar of the data directory's contents. */
export const TEMPLATE_URL: URL = new URL("./embedded/pglite_initdb.tar.gz", import.meta.url);
