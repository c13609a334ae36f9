/**
 * Asks the C library's allocator to give back to the operating system the memory it keeps after
 * it was freed (glibc's `malloc_trim(0)`). Starting the embedded engine frees some 40 MB of
 * allocations (compiling PGlite's WebAssembly, unpacking a new database) that glibc would
 * otherwise keep resident for the life of the process.
 *
 * It needs `--allow-ffi`, which the service runs with for OpenSSL; without it, or where the C
 * library is not glibc (`malloc_trim` is glibc's own), nothing happens and the memory stays.
 */

const GLIBC = "libc.so.6";

/** Returns whether the allocator was asked to trim. */
export function trimFreedMemory(): boolean {
  // Asking first: dlopen without the permission would prompt on a terminal.
  if (Deno.permissions.querySync({ name: "ffi" }).state !== "granted") return false;
  let library;
  try {
    library = Deno.dlopen(GLIBC, { malloc_trim: { parameters: ["usize"], result: "i32" } });
  } catch {
    return false; // not glibc
  }
  try {
    library.symbols.malloc_trim(0n);
    return true;
  } finally {
    library.close();
  }
}
