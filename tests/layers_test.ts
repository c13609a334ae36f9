/**
 * The layering of `src/` (docs/architecture.md, "The napkin"): folders import one way, the domain
 * never reaches up into the HTTP layer, the routes, the CLI or the composition root, and each kind
 * of code has one home.
 */
import assert from "node:assert/strict";
import { dirname, join, normalize, relative } from "node:path";

const SRC = new URL("../src/", import.meta.url).pathname;
/** Folders that hold the domain: what a request or a notification passes through. */
const DOMAIN = [
  "storea",
  "storeb",
  "events",
  "delivery",
  "recovery",
  "retention",
  "db",
  "audit",
  "auth",
  "crypto",
];
/** What only the composition root (`process/`), the CLI and the server may import. */
const UPPER = ["http", "api", "cli", "process"];
/**
 * What each folder of helpers may import, at most: `lib/` holds helpers with no domain words and
 * imports nothing of the service but its errors; logging and telemetry only the configuration.
 */
const ALLOWED: Record<string, string[]> = {
  lib: ["lib", "errors.ts"],
  observability: ["observability", "config.ts", "errors.ts"],
  storea: ["storea", "crypto", "lib", "observability", "errors.ts"],
  storeb: ["storeb", "lib", "observability", "errors.ts"],
};

/** Each module of `src/` (relative path) with the modules of `src/` it imports. */
async function importGraph(): Promise<Map<string, string[]>> {
  const graph = new Map<string, string[]>();
  const walk = async (dir: string) => {
    for await (const entry of Deno.readDir(dir)) {
      const path = join(dir, entry.name);
      if (entry.isDirectory) await walk(path);
      else if (entry.name.endsWith(".ts")) {
        const text = await Deno.readTextFile(path);
        const targets = [...text.matchAll(/^(?:import|export)[^;]*?from "(\.{1,2}\/[^"]+)"/gms)]
          .map((match) => relative(SRC, normalize(join(dirname(path), match[1]))));
        graph.set(relative(SRC, path), targets);
      }
    }
  };
  await walk(SRC);
  return graph;
}

/** A module's folder under `src/`, or the module itself when it sits at the top. */
function unit(module: string): string {
  return module.includes("/") ? module.split("/")[0] : module;
}

Deno.test("layers: no domain module imports the HTTP layer, the routes, the CLI or process/", async () => {
  const upward: string[] = [];
  for (const [module, targets] of await importGraph()) {
    if (!DOMAIN.includes(unit(module))) continue;
    for (const target of targets) {
      if (UPPER.includes(unit(target))) upward.push(`${module} -> ${target}`);
    }
  }
  assert.deepEqual(upward, []);
});

Deno.test("layers: helpers, observability and the stores import only what is below them", async () => {
  // The stores' credential types live beside each store, so a store client needs nothing of db/.
  const outside: string[] = [];
  for (const [module, targets] of await importGraph()) {
    const allowed = ALLOWED[unit(module)];
    if (allowed === undefined) continue;
    for (const target of targets) {
      if (!allowed.includes(unit(target))) outside.push(`${module} -> ${target}`);
    }
  }
  assert.deepEqual(outside, []);
});

Deno.test("layers: delivery/ never imports events/, which hands it notifications", async () => {
  // The hand-over interface and the enqueue statements sit in delivery/, beside the queue.
  const upstream: string[] = [];
  for (const [module, targets] of await importGraph()) {
    if (unit(module) !== "delivery") continue;
    for (const target of targets) {
      if (unit(target) === "events") upstream.push(`${module} -> ${target}`);
    }
  }
  assert.deepEqual(upstream, []);
});

Deno.test("layers: only delivery/ inserts or updates deliveries (retention deletes)", async () => {
  const elsewhere: string[] = [];
  for (const module of (await importGraph()).keys()) {
    if (unit(module) === "delivery") continue;
    const text = await Deno.readTextFile(join(SRC, module));
    if (/(INSERT INTO|UPDATE) deliveries\b/.test(text)) elsewhere.push(module);
  }
  assert.deepEqual(elsewhere, []);
});

Deno.test("layers: the top of src/ keeps only the configuration, the errors and the version", async () => {
  const loose: string[] = [];
  for await (const entry of Deno.readDir(SRC)) {
    if (entry.isFile) loose.push(entry.name);
  }
  assert.deepEqual(loose.sort(), ["config.ts", "config_parsers.ts", "errors.ts", "version.ts"]);
});

Deno.test("layers: no import cycle between folders", async () => {
  const edges = new Map<string, Set<string>>();
  for (const [module, targets] of await importGraph()) {
    for (const target of targets) {
      if (unit(module) === unit(target)) continue;
      const set = edges.get(unit(module)) ?? new Set();
      set.add(unit(target));
      edges.set(unit(module), set);
    }
  }
  const cycles: string[] = [];
  const visit = (node: string, path: string[]) => {
    for (const next of edges.get(node) ?? []) {
      if (next === path[0]) cycles.push([...path, next].join(" -> "));
      else if (!path.includes(next) && next > path[0]) visit(next, [...path, next]);
    }
  };
  for (const node of edges.keys()) visit(node, [node]);
  assert.deepEqual(cycles, []);
});

Deno.test("layers: every error class of src/ has a code, through RelayError", async () => {
  const bare: string[] = [];
  for (const module of (await importGraph()).keys()) {
    const text = await Deno.readTextFile(join(SRC, module));
    for (const match of text.matchAll(/class (\w+) extends Error\b/g)) {
      if (!(module === "errors.ts" && match[1] === "RelayError")) {
        bare.push(`${module}: ${match[1]}`);
      }
    }
  }
  assert.deepEqual(bare, []);
});
