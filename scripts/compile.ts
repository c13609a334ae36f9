/**
 * `deno task compile`: builds one executable, `dist/purchase-relay`, with the build version stamped
 * in. The version is `SERVICE_VERSION` when set, else the exact git tag of HEAD
 * (`v<major>.<minor>.<patch>`), else `dev`. Deno downloads its runtime for this step, so it needs
 * network access to Deno's release servers.
 */
const VERSION_FILE = new URL("../src/version.ts", import.meta.url);

async function gitTag(): Promise<string | null> {
  try {
    const { code, stdout } = await new Deno.Command("git", {
      args: ["describe", "--tags", "--exact-match"],
      stderr: "null",
    }).output();
    const tag = new TextDecoder().decode(stdout).trim();
    return code === 0 && /^v\d+\.\d+\.\d+$/.test(tag) ? tag : null;
  } catch {
    return null;
  }
}

const version = Deno.env.get("SERVICE_VERSION") ?? await gitTag() ?? "dev";
if (version !== "dev" && !/^v\d+\.\d+\.\d+$/.test(version)) {
  console.error(`version ${version} is not v<major>.<minor>.<patch> or dev`);
  Deno.exit(2);
}
await Deno.mkdir(new URL("../dist/", import.meta.url), { recursive: true });
const original = await Deno.readTextFile(VERSION_FILE);
const stamped = original.replace(/BUILD_VERSION = "[^"]*"/, `BUILD_VERSION = "${version}"`);
await Deno.writeTextFile(VERSION_FILE, stamped);
try {
  const { code } = await new Deno.Command("deno", {
    args: [
      "compile",
      "--allow-net",
      "--allow-env",
      "--allow-read",
      // DATA_DIR is chosen at run time; confine writes with the service manager (see operations).
      "--allow-write",
      "--allow-sys=hostname,osRelease",
      "--allow-ffi",
      // Baked into the executable like the permissions (src/permissions.ts says why).
      "--v8-flags=--liftoff-only",
      "--include",
      "migrations/",
      // The embedded engine's first data directory (src/db/embedded_template.ts).
      "--include",
      "src/db/pglite_initdb.tar.gz",
      "--output",
      "dist/purchase-relay",
      "main.ts",
    ],
  }).spawn().status;
  if (code !== 0) Deno.exit(code);
  console.log(`built dist/purchase-relay (${version})`);
} finally {
  await Deno.writeTextFile(VERSION_FILE, original);
}
