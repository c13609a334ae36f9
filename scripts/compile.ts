/**
 * `deno task compile`: builds one executable, `dist/purchase-relay`, with the build version stamped
 * in. The version is `SERVICE_VERSION` when set, else the exact git tag of HEAD
 * (`v<major>.<minor>.<patch>`), else `dev`. Deno downloads its runtime for this step, so it needs
 * network access to Deno's release servers.
 */
import { executablePermissions } from "../src/process/permissions.ts";

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
      // Fixed now, for the paths of the systemd unit and the container image: the executable
      // cannot follow a DATA_DIR chosen when it runs (docs/deploy.md, "Permissions").
      ...executablePermissions(),
      "--include",
      "migrations/",
      // The embedded engine's first data directory (src/db/embedded/template.ts).
      "--include",
      "src/db/embedded/pglite_initdb.tar.gz",
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
