/**
 * What the fuzz suite generates: request bodies, headers, paths, and recipes for near-valid signed
 * payloads of both stores. Arbitraries produce recipes (small plain data) rather than bytes, so a
 * failing run prints a readable counterexample that replays from its seed; `build*` functions turn
 * a recipe into what goes on the wire, signing with the store simulators where needed.
 *
 * Also here: the oracles that follow from the documented interface alone (docs/integration.md and
 * docs/operations.md): which route a path reaches, which API key a header names, and which request
 * bodies the documented limits refuse.
 *
 * @module
 */
import fc from "fast-check";
import { type EndpointName, ENDPOINTS } from "../src/api/mod.ts";
import type { StoreaSigner } from "../simulators/storea_signer.ts";
import type { PushTokenClaimsInput, PushTokenIssuer } from "../simulators/storeb_push.ts";

/** Verify bodies are at most 16 KB. */
export const VERIFY_LIMIT = 16 * 1024;
/** Receiver bodies are at most 1 MB. */
export const RECEIVER_LIMIT = 1024 * 1024;

const encoder = new TextEncoder();

// ---------------------------------------------------------------------------------------------
// Values

/** Strings known to trip parsers, URL paths, databases and logs. */
const ODD_STRINGS = [
  "",
  " ",
  ".",
  "..",
  "/",
  "../../health",
  "%2e%2e",
  "%",
  "%00",
  "?x=1",
  "#",
  "\u0000",
  "a\u0000b",
  "\ud800",
  "\udfff\ud800",
  "\u202e",
  "\ufeff",
  "\u{1F600}",
  "null",
  "0",
  "-1",
  "1e999",
  "<script>",
  "' OR 1=1 --",
  "\\",
  '"',
  "\n",
  "\r\n",
  "\t",
  "\u03a9".repeat(100),
  "9".repeat(40),
] as const;

/** One of {@linkcode ODD_STRINGS}. */
const oddString: fc.Arbitrary<string> = fc.constantFrom(...ODD_STRINGS);

/** Any string: printable, full Unicode, or lone surrogates and control characters. */
export const anyString: fc.Arbitrary<string> = fc.oneof(
  { weight: 2, arbitrary: fc.string({ maxLength: 24 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme", maxLength: 24 }) },
  { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 24 }) },
  { weight: 3, arbitrary: oddString },
);

/** A value of the wrong type for almost any field. */
export const oddValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constantFrom(0, -1, 2 ** 53, 1e21, -0),
  fc.constant([]),
  fc.constant({}),
  fc.array(anyString, { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 6 }), anyString, { maxKeys: 3 }),
  anyString,
);

/** A value that breaks a string field of at most `maxLength` characters, or leaves it out. */
export function oddField(maxLength: number): fc.Arbitrary<unknown> {
  return fc.oneof(
    { weight: 1, arbitrary: fc.constant("") },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        "7".repeat(maxLength),
        "7".repeat(maxLength + 1),
        "x".repeat(maxLength * 3),
      ),
    },
    { weight: 4, arbitrary: anyString },
    { weight: 2, arbitrary: oddValue },
    { weight: 1, arbitrary: fc.constant(undefined) },
  );
}

/**
 * Changes to a valid set of fields: mostly none or one field, so the others stay valid and the
 * request gets deep; sometimes several.
 */
export function fieldChanges<K extends string>(
  names: readonly K[],
  value: (name: K) => fc.Arbitrary<unknown>,
): fc.Arbitrary<{ field: K; value: unknown }[]> {
  const change = fc.constantFrom(...names).chain((name) =>
    value(name).map((v) => ({ field: name, value: v }))
  );
  return fc.oneof(
    { weight: 4, arbitrary: fc.constant([] as { field: K; value: unknown }[]) },
    { weight: 4, arbitrary: change.map((c) => [c]) },
    { weight: 1, arbitrary: fc.array(change, { minLength: 2, maxLength: 4 }) },
  );
}

/** Extra top-level fields: mostly none. */
export const extraFields: fc.Arbitrary<Record<string, unknown>> = fc.oneof(
  { weight: 12, arbitrary: fc.constant({}) },
  { weight: 1, arbitrary: fc.dictionary(anyString, oddValue, { minKeys: 1, maxKeys: 2 }) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      JSON.parse('{"__proto__":{"x":1}}') as Record<string, unknown>,
      { constructor: "x" },
    ),
  },
);

// ---------------------------------------------------------------------------------------------
// Bodies

/**
 * A request body. `shape` is the endpoint's near-valid JSON (built by the caller); the others
 * are raw bytes, or that JSON broken in one way.
 */
export type BodyRecipe =
  | { kind: "shape" }
  | { kind: "bytes"; bytes: number[] }
  | { kind: "text"; text: string }
  | { kind: "json"; value: unknown }
  | { kind: "invalid-utf8"; at: number; sequence: number[] }
  | { kind: "truncated"; at: number }
  | { kind: "deep"; depth: number; open: "[" | "{"; inShape: boolean }
  | { kind: "padded"; size: number }
  | { kind: "filler"; size: number; char: string }
  | { kind: "bom" }
  | { kind: "empty" };

/** Byte sequences that are not UTF-8: stray continuations, overlongs, surrogates, truncations. */
const INVALID_UTF8 = [
  [0x80],
  [0xff],
  [0xc0, 0xaf],
  [0xe0, 0x80, 0x80],
  [0xed, 0xa0, 0x80],
  [
    0xf4,
    0x90,
    0x80,
    0x80,
  ],
  [0xe2, 0x82],
  [0xfe, 0xfe, 0xff, 0xff],
];

/** Sizes around `limit`, and well above. */
function sizeAround(limit: number): fc.Arbitrary<number> {
  return fc.oneof(
    { weight: 4, arbitrary: fc.integer({ min: limit - 3, max: limit + 3 }) },
    { weight: 1, arbitrary: fc.integer({ min: limit - 512, max: limit + 512 }) },
    { weight: 1, arbitrary: fc.constantFrom(limit * 2, limit * 4) },
  );
}

/** Body recipes for an endpoint whose body limit is `limit`. */
export function bodyRecipe(limit: number): fc.Arbitrary<BodyRecipe> {
  return fc.oneof(
    { weight: 30, arbitrary: fc.constant({ kind: "shape" as const }) },
    {
      weight: 2,
      arbitrary: fc.record({
        kind: fc.constant("bytes" as const),
        bytes: fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 200 }),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({ kind: fc.constant("text" as const), text: anyString }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        kind: fc.constant("json" as const),
        value: fc.jsonValue({ maxDepth: 4 }),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant("invalid-utf8" as const),
        at: fc.nat(),
        sequence: fc.constantFrom(...INVALID_UTF8),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({ kind: fc.constant("truncated" as const), at: fc.nat() }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant("deep" as const),
        depth: fc.oneof(
          fc.integer({ min: 1, max: 2000 }),
          fc.constantFrom(10_000, 100_000, Math.floor(limit / 2) - 64),
        ),
        open: fc.constantFrom("[" as const, "{" as const),
        inShape: fc.boolean(),
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({ kind: fc.constant("padded" as const), size: sizeAround(limit) }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant("filler" as const),
        size: sizeAround(limit),
        char: fc.constantFrom(" ", "[", "{", "a", "0", '"'),
      }),
    },
    { weight: 1, arbitrary: fc.constant({ kind: "bom" as const }) },
    { weight: 1, arbitrary: fc.constant({ kind: "empty" as const }) },
  );
}

/** The bytes of `recipe`, given the endpoint's near-valid JSON text `shape`. */
export function buildBody(recipe: BodyRecipe, shape: string): Uint8Array<ArrayBuffer> {
  const shapeBytes = encoder.encode(shape);
  switch (recipe.kind) {
    case "shape":
      return shapeBytes;
    case "bytes":
      return new Uint8Array(recipe.bytes);
    case "text":
      return encoder.encode(recipe.text);
    case "json":
      return encoder.encode(JSON.stringify(recipe.value) ?? "null");
    case "invalid-utf8": {
      const at = recipe.at % (shapeBytes.length + 1);
      return concat(
        shapeBytes.subarray(0, at),
        new Uint8Array(recipe.sequence),
        shapeBytes.subarray(at),
      );
    }
    case "truncated":
      return shapeBytes.slice(0, recipe.at % Math.max(1, shapeBytes.length));
    case "deep": {
      const nest = recipe.open === "["
        ? "[".repeat(recipe.depth) + "]".repeat(recipe.depth)
        : '{"a":'.repeat(recipe.depth) + "1" + "}".repeat(recipe.depth);
      if (recipe.inShape && shape.startsWith("{") && shape.length > 2) {
        return encoder.encode(`{"deep":${nest},${shape.slice(1)}`);
      }
      return encoder.encode(nest);
    }
    case "padded": {
      // JSON allows whitespace around values: the shape itself, exactly `size` bytes long.
      const padding = Math.max(0, recipe.size - shapeBytes.length);
      const bytes = new Uint8Array(shapeBytes.length + padding).fill(0x20);
      bytes.set(shapeBytes, 0);
      return bytes;
    }
    case "filler":
      return new Uint8Array(recipe.size).fill(recipe.char.charCodeAt(0));
    case "bom":
      return concat(new Uint8Array([0xef, 0xbb, 0xbf]), shapeBytes);
    case "empty":
      return new Uint8Array(0);
  }
}

/** Whether the recipe keeps the shape's JSON intact (so the shape decides the outcome). */
export function keepsShape(recipe: BodyRecipe): boolean {
  return recipe.kind === "shape" || recipe.kind === "padded" || recipe.kind === "bom";
}

function concat(...parts: Uint8Array[]): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

/** How the body travels: with a Content-Length, or chunked from a stream. */
export const transport: fc.Arbitrary<"fixed" | "stream"> = fc.oneof(
  { weight: 4, arbitrary: fc.constant("fixed" as const) },
  { weight: 1, arbitrary: fc.constant("stream" as const) },
);

// ---------------------------------------------------------------------------------------------
// Headers

/** A character fetch accepts in a header value (no NUL, CR, LF; Latin-1 only). */
const headerChar = fc.oneof(
  { weight: 8, arbitrary: fc.integer({ min: 0x20, max: 0x7e }) },
  { weight: 1, arbitrary: fc.integer({ min: 0x80, max: 0xff }) },
  { weight: 1, arbitrary: fc.constant(0x09) },
).map((code) => String.fromCharCode(code));

/** A header value fetch will send. */
export function headerValue(maxLength: number): fc.Arbitrary<string> {
  return fc.string({ unit: headerChar, maxLength });
}

/** `Content-Type` values; null sends none. */
export const contentType: fc.Arbitrary<string | null> = fc.oneof(
  { weight: 24, arbitrary: fc.constant("application/json") },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      "application/json; charset=utf-8",
      "APPLICATION/JSON",
      "Application/Json;charset=UTF-8",
      'application/json ; charset="utf-8"',
      "application/json;charset=iso-8859-1",
      "application/json;",
    ),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      null,
      "",
      "text/plain",
      "text/json",
      "application/jsonp",
      "application/json-patch+json",
      "application/json, text/plain",
      "application/x-www-form-urlencoded",
      "multipart/form-data; boundary=x",
      "*/*",
      ";application/json",
    ),
  },
  { weight: 1, arbitrary: headerValue(60) },
);

/** Every request body must be `application/json` (parameters aside). */
export function isJsonContentType(value: string | null): boolean {
  if (value === null) return false;
  return value.split(";", 1)[0].trim().toLowerCase() === "application/json";
}

/** The API key tenants of the fuzz world. */
export type KeyHolder = "main" | "bare";

/** A change to an API key that must make it unknown. */
export type KeyEdit =
  | { op: "replace"; at: number; char: string }
  | { op: "delete"; at: number }
  | { op: "insert"; at: number; char: string }
  | { op: "swap-env" }
  | { op: "prefix"; prefix: string }
  | { op: "truncate"; keep: number }
  | { op: "append"; text: string }
  | { op: "upper" }
  | { op: "twice"; separator: string };

/** An `Authorization` header for the verify endpoints. */
export type ApiKeyAuthRecipe =
  | { kind: "none" }
  | { kind: "key"; holder: KeyHolder; scheme: string; spaces: number; trailing: string }
  | { kind: "edited"; holder: KeyHolder; edit: KeyEdit; scheme: string }
  | { kind: "raw"; value: string }
  | { kind: "huge"; length: number; char: string };

const base64urlChar = fc.constantFrom(
  ..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
);
const schemes = fc.oneof(
  { weight: 6, arbitrary: fc.constant("Bearer") },
  { weight: 2, arbitrary: fc.constantFrom("bearer", "BEARER", "BeArEr") },
  { weight: 1, arbitrary: fc.constantFrom("Basic", "Token", "", "Bearer:", "Bearer,", "Bearers") },
);

/** `Authorization` recipes for the verify endpoints: mostly a real key, so bodies get read. */
export const apiKeyAuth: fc.Arbitrary<ApiKeyAuthRecipe> = fc.oneof(
  {
    weight: 20,
    arbitrary: fc.record({
      kind: fc.constant("key" as const),
      holder: fc.oneof(
        { weight: 8, arbitrary: fc.constant("main" as const) },
        { weight: 1, arbitrary: fc.constant("bare" as const) },
      ),
      scheme: fc.oneof(
        { weight: 8, arbitrary: fc.constant("Bearer") },
        { weight: 1, arbitrary: fc.constantFrom("bearer", "BEARER", "BeArEr") },
      ),
      spaces: fc.oneof(
        { weight: 8, arbitrary: fc.constant(1) },
        { weight: 1, arbitrary: fc.constantFrom(2, 5) },
      ),
      trailing: fc.oneof(
        { weight: 8, arbitrary: fc.constant("") },
        { weight: 1, arbitrary: fc.constantFrom(" ", "\t") },
      ),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("key" as const),
      holder: fc.constantFrom("main" as const, "bare" as const),
      scheme: schemes,
      spaces: fc.constantFrom(0, 1, 2),
      trailing: fc.constantFrom("", " x", ",", ";", " Bearer"),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("edited" as const),
      holder: fc.constantFrom("main" as const, "bare" as const),
      scheme: fc.constant("Bearer"),
      edit: fc.oneof(
        fc.record({ op: fc.constant("replace" as const), at: fc.nat(), char: base64urlChar }),
        fc.record({ op: fc.constant("delete" as const), at: fc.nat() }),
        fc.record({
          op: fc.constant("insert" as const),
          at: fc.nat(),
          char: fc.oneof(base64urlChar, fc.constantFrom("+", "/", "=", ".", "~")),
        }),
        fc.constant({ op: "swap-env" as const }),
        fc.record({
          op: fc.constant("prefix" as const),
          prefix: fc.constantFrom(
            "service_prod_",
            "Service_live_",
            "service-test-",
            "sk_test_",
            "service__",
            "service_live",
            "",
          ),
        }),
        fc.record({ op: fc.constant("truncate" as const), keep: fc.nat() }),
        fc.record({
          op: fc.constant("append" as const),
          text: fc.oneof(fc.constantFrom("=", "==", "a", "\u00e9"), headerValue(8)),
        }),
        fc.constant({ op: "upper" as const }),
        fc.record({
          op: fc.constant("twice" as const),
          separator: fc.constantFrom(" ", ",", ", "),
        }),
      ),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ kind: "none" as const }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("raw" as const),
      value: fc.oneof(
        headerValue(80),
        fc.constantFrom(
          "Bearer",
          "Bearer ",
          "Bearer service_live_",
          "Bearer service_test_" + "A".repeat(43),
          "Bearer service_live_" + "_".repeat(43),
          "Basic dXNlcjpwYXNz",
          "Bearer null",
          "Bearer undefined",
        ),
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("huge" as const),
      // Deno's HTTP server refuses a header value of 64 KiB or more itself (a bare 400, before
      // the service sees the request); below that the service must answer.
      length: fc.constantFrom(1024, 8 * 1024, 60 * 1024),
      char: fc.constantFrom("A", " ", "="),
    }),
  },
);

/** The header value of `recipe` (null: no header), given the tenants' real keys. */
export function buildApiKeyAuth(
  recipe: ApiKeyAuthRecipe,
  keys: Record<KeyHolder, string>,
): string | null {
  switch (recipe.kind) {
    case "none":
      return null;
    case "key":
      return `${recipe.scheme}${" ".repeat(recipe.spaces)}${keys[recipe.holder]}${recipe.trailing}`;
    case "edited":
      return `${recipe.scheme} ${editKey(keys[recipe.holder], recipe.edit)}`;
    case "raw":
      return recipe.value;
    case "huge":
      return `Bearer ${recipe.char.repeat(recipe.length)}`;
  }
}

function editKey(key: string, edit: KeyEdit): string {
  const at = "at" in edit ? edit.at % key.length : 0;
  switch (edit.op) {
    case "replace":
      return key.slice(0, at) + edit.char + key.slice(at + 1);
    case "delete":
      return key.slice(0, at) + key.slice(at + 1);
    case "insert":
      return key.slice(0, at) + edit.char + key.slice(at);
    case "swap-env":
      return key.startsWith("service_live_")
        ? key.replace("service_live_", "service_test_")
        : key.replace("service_test_", "service_live_");
    case "prefix":
      return edit.prefix + key.replace(/^service_(live|test)_/, "");
    case "truncate":
      return key.slice(0, edit.keep % key.length);
    case "append":
      return key + edit.text;
    case "upper":
      return key.toUpperCase();
    case "twice":
      return `${key}${edit.separator}${key}`;
  }
}

/**
 * Whose API key `header` carries, as the service receives it (fetch trims the value).
 * The scheme is case-insensitive (RFC 7235); anything else about the header must be exact.
 */
export function apiKeyHolder(
  header: string | null,
  keys: Record<KeyHolder, string>,
): KeyHolder | null {
  if (header === null) return null;
  const token = /^Bearer +(\S+)$/i.exec(header.replace(/^[\t ]+|[\t ]+$/g, ""))?.[1];
  if (token === keys.main) return "main";
  if (token === keys.bare) return "bare";
  return null;
}

// ---------------------------------------------------------------------------------------------
// Paths and routes

/** An endpoint of the service's route table. */
export type RouteName = EndpointName;

/** Where a request lands. */
export type RouteOutcome =
  | { kind: "found"; name: RouteName; tenantId: string | null }
  | { kind: "wrong-method"; allowed: string[] }
  | { kind: "none" };

/**
 * The endpoint that `method` and `pathname` (exactly as the server receives it, query excluded)
 * address. A `:tenantId` segment is percent-decoded; one that does not decode, or is empty,
 * addresses nothing.
 */
export function routeOf(method: string, pathname: string): RouteOutcome {
  const segments = pathname.split("/");
  const allowed: string[] = [];
  for (const route of ENDPOINTS) {
    const pattern = route.pattern.split("/");
    if (pattern.length !== segments.length) continue;
    let tenantId: string | null = null;
    let matches = true;
    for (let i = 0; i < pattern.length && matches; i++) {
      if (pattern[i] === ":tenantId") {
        try {
          tenantId = decodeURIComponent(segments[i]);
        } catch {
          matches = false;
        }
        if (segments[i] === "") matches = false;
      } else if (pattern[i] !== segments[i]) {
        matches = false;
      }
    }
    if (!matches) continue;
    if (route.method === method) return { kind: "found", name: route.name, tenantId };
    allowed.push(route.method);
  }
  return allowed.length > 0 ? { kind: "wrong-method", allowed } : { kind: "none" };
}

/** The tenants of the fuzz world. */
export type TenantName = "main" | "bare" | "inactive";

/** The `:tenantId` segment of a receiver path. */
export type TenantSegmentRecipe =
  | { kind: "known"; tenant: TenantName; encoding: "plain" | "percent" }
  | { kind: "unknown"; ulid: string }
  | {
    kind: "mangled";
    tenant: TenantName;
    op: "lowercase" | "suffix" | "prefix" | "truncate" | "bare-ulid" | "upper-prefix";
  }
  | { kind: "text"; text: string; encode: boolean };

/** Path variations around a receiver route. */
export interface PathShape {
  trailingSlash: boolean;
  doubleSlash: boolean;
  extraSegment: string | null;
  query: string | null;
}

const ULID_CHARS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** `:tenantId` segment recipes. */
export const tenantSegment: fc.Arbitrary<TenantSegmentRecipe> = fc.oneof(
  {
    weight: 24,
    arbitrary: fc.record({
      kind: fc.constant("known" as const),
      tenant: fc.oneof(
        { weight: 10, arbitrary: fc.constant("main" as const) },
        { weight: 1, arbitrary: fc.constant("bare" as const) },
        { weight: 1, arbitrary: fc.constant("inactive" as const) },
      ),
      encoding: fc.oneof(
        { weight: 12, arbitrary: fc.constant("plain" as const) },
        { weight: 1, arbitrary: fc.constant("percent" as const) },
      ),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("unknown" as const),
      ulid: fc.string({ unit: fc.constantFrom(...ULID_CHARS), minLength: 26, maxLength: 26 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("mangled" as const),
      tenant: fc.constantFrom("main" as const, "inactive" as const),
      op: fc.constantFrom(
        "lowercase" as const,
        "suffix" as const,
        "prefix" as const,
        "truncate" as const,
        "bare-ulid" as const,
        "upper-prefix" as const,
      ),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("text" as const),
      text: fc.oneof(
        anyString,
        fc.constantFrom(
          "..",
          ".",
          "%2e%2e",
          "%2E",
          "%",
          "%zz",
          "%00",
          "%ED%A0%80",
          "%C0%AE",
          "a%2Fb",
          "tenant_",
          ":tenantId",
          "*",
          "x".repeat(4000),
        ),
      ),
      encode: fc.boolean(),
    }),
  },
);

/** A query string (without `?`). */
export const queryString: fc.Arbitrary<string> = fc.oneof(
  fc.string({ unit: "binary", maxLength: 30 }).map((s) => encodeURIComponent(s.toWellFormed())),
  fc.constantFrom("a=1&b=2", "%", "%zz", "?", "tenantId=x", "=", "&&", "x".repeat(2000)),
);

/** Path shapes: mostly the route exactly. */
export const pathShape: fc.Arbitrary<PathShape> = fc.oneof(
  {
    weight: 16,
    arbitrary: fc.constant({
      trailingSlash: false,
      doubleSlash: false,
      extraSegment: null,
      query: null,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      trailingSlash: fc.boolean(),
      doubleSlash: fc.boolean(),
      extraSegment: fc.option(fc.constantFrom("x", "..", "%2e%2e", ".", ""), { nil: null }),
      query: fc.option(queryString, { nil: null }),
    }),
  },
);

/** The `:tenantId` segment text of `recipe`. */
export function buildTenantSegment(
  recipe: TenantSegmentRecipe,
  tenants: Record<TenantName, string>,
): string {
  switch (recipe.kind) {
    case "known": {
      const id = tenants[recipe.tenant];
      return recipe.encoding === "plain"
        ? id
        : [...id].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, "0")}`).join("");
    }
    case "unknown":
      return `tenant_${recipe.ulid}`;
    case "mangled": {
      const id = tenants[recipe.tenant];
      switch (recipe.op) {
        case "lowercase":
          return id.toLowerCase();
        case "suffix":
          return `${id}0`;
        case "prefix":
          return `x${id}`;
        case "truncate":
          return id.slice(0, -1);
        case "bare-ulid":
          return id.slice("tenant_".length);
        case "upper-prefix":
          return id.replace("tenant_", "TENANT_");
      }
      break;
    }
    case "text":
      return recipe.encode ? encodeURIComponent(recipe.text.toWellFormed()) : recipe.text;
  }
  throw new Error("unreachable");
}

/** The path (and query) of a receiver request. */
export function buildReceiverPath(store: "storea" | "storeb", segment: string, shape: PathShape) {
  let path = `/v1/webhooks/${store}/${segment}`;
  if (shape.doubleSlash) path = path.replace("/webhooks/", "/webhooks//");
  if (shape.trailingSlash) path += "/";
  if (shape.extraSegment !== null) path += `/${shape.extraSegment}`;
  if (shape.query !== null) path += `?${shape.query}`;
  return path;
}

/** Methods, registered and not. */
export const method: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom("GET", "POST") },
  { weight: 2, arbitrary: fc.constantFrom("PUT", "DELETE", "PATCH", "OPTIONS", "HEAD") },
  { weight: 1, arbitrary: fc.constantFrom("get", "post", "PROPFIND", "X-CUSTOM", "M") },
);

/** Paths near and far from the routes, as fetch would be given them. */
export const anyPath: fc.Arbitrary<string> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      "/health",
      "/ready",
      "/v1/storea/verify",
      "/v1/storeb/verify",
      "/v1/storeb/acknowledge",
      "/v1/storeb/consume",
      "/v1/storea/subscriptions",
      "/v1/storea/history",
      "/v1/storea/consumption",
      "/v1/webhooks/storea/tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV",
      "/v1/webhooks/storeb/tenant_01ARZ3NDEKTSV4RRFFQ69G5FAV",
    ),
  },
  {
    weight: 3,
    arbitrary: fc.tuple(
      fc.constantFrom(
        "/health",
        "/ready",
        "/v1/storea/verify",
        "/v1/storeb/verify",
        "/v1/storeb/acknowledge",
        "/v1/storea/history",
        "/v1/webhooks/storea/x",
        "/v1/webhooks/storeb/x",
      ),
      fc.constantFrom(
        "/",
        "//",
        "/..",
        "/../health",
        "/%2e%2e",
        "?",
        "?a=b",
        "#x",
        "/x",
        ";x",
        "%20",
        "%00",
        "/.",
        "\\",
      ),
    ).map(([path, suffix]) => path + suffix),
  },
  {
    weight: 2,
    arbitrary: fc.array(
      fc.oneof(
        fc.constantFrom(
          "v1",
          "v2",
          "health",
          "ready",
          "storea",
          "storeb",
          "webhooks",
          "verify",
          "acknowledge",
          "consume",
          "subscriptions",
          "history",
          "consumption",
        ),
        fc.constantFrom("", ".", "..", "%2e", "HEALTH", "V1", "%76%31"),
        fc.string({ unit: "binary", maxLength: 10 }).map((s) =>
          encodeURIComponent(s.toWellFormed())
        ),
      ),
      { maxLength: 6 },
    ).map((segments) => `/${segments.join("/")}`),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "/",
      "//health",
      "/./health",
      "/v1/../health",
      "/v1/storea/../storeb/verify",
      "/%68ealth",
      "/health%2F",
      "/" + "a".repeat(8000),
      "/v1/webhooks/storea/" + "b".repeat(8000),
    ),
  },
);

// ---------------------------------------------------------------------------------------------
// The documented checks of verify bodies

/** Whether `value` unambiguously breaks a length rule (UTF-16 units and code points agree). */
function tooLong(value: string, max: number): boolean {
  return value.length > max && [...value].length > max;
}

/** Why this store A verify body is invalid, or null when the documented rules accept it. */
export function storeaBodyViolation(body: unknown): string | null {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return "not an object";
  const { transactionId, environment } = body as Record<string, unknown>;
  if (typeof transactionId !== "string") return "transactionId is not a string";
  if (transactionId.length === 0 || tooLong(transactionId, 128)) return "transactionId length";
  if (isDotSegment(transactionId)) return "transactionId is a dot segment";
  if (environment !== undefined && environment !== "production" && environment !== "sandbox") {
    return "environment";
  }
  return null;
}

/** Why this store B verify body is invalid, or null when the documented rules accept it. */
export function storebBodyViolation(body: unknown): string | null {
  const purchase = storebPurchaseViolation(body);
  if (purchase !== null) return purchase;
  const { type, acknowledge } = body as Record<string, unknown>;
  if (type !== "subscription" && type !== "product") return "type";
  if (acknowledge !== undefined && typeof acknowledge !== "boolean") return "acknowledge";
  return null;
}

/** Why this store B acknowledge body is invalid (verify's fields, no `acknowledge`), or null. */
export function storebAcknowledgeBodyViolation(body: unknown): string | null {
  const purchase = storebPurchaseViolation(body);
  if (purchase !== null) return purchase;
  const { type, acknowledge } = body as Record<string, unknown>;
  if (type !== "subscription" && type !== "product") return "type";
  if (acknowledge !== undefined) return "acknowledge is an unknown field here";
  return null;
}

/** Why this store B consume body is invalid (one-time products: no `type`), or null. */
export function storebConsumeBodyViolation(body: unknown): string | null {
  const purchase = storebPurchaseViolation(body);
  if (purchase !== null) return purchase;
  const { type, acknowledge } = body as Record<string, unknown>;
  if (type !== undefined || acknowledge !== undefined) return "an unknown field";
  return null;
}

/** The fields every store B body shares: package, product and token. */
function storebPurchaseViolation(body: unknown): string | null {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return "not an object";
  const fields = body as Record<string, unknown>;
  for (const [name, max] of [["packageName", 200], ["productId", 200], ["purchaseToken", 4096]]) {
    const value = fields[name as string];
    if (typeof value !== "string") return `${name} is not a string`;
    if (value.length === 0 || tooLong(value, max as number)) return `${name} length`;
    if (name !== "packageName" && isDotSegment(value)) return `${name} is a dot segment`;
  }
  return null;
}

/**
 * Dates a history filter may carry, with what they mean in epoch milliseconds, or null for those
 * the documented rules refuse (no zone, no seconds, not a day of the calendar, before 1970).
 */
export const HISTORY_DATES: Readonly<Record<string, number | null>> = {
  "2026-01-01T00:00:00Z": Date.UTC(2026, 0, 1),
  "2026-03-01T12:30:00.250+02:00": Date.UTC(2026, 2, 1, 10, 30, 0, 250),
  "1970-01-01T00:00:00Z": 0,
  "2030-12-31T23:59:59.999-05:00": Date.UTC(2031, 0, 1, 4, 59, 59, 999),
  "2026-01-01": null,
  "2026-01-01T00:00:00": null,
  "2026-01-01T00:00Z": null,
  "2026-02-30T00:00:00Z": null,
  "1969-12-31T23:59:59Z": null,
  "yesterday": null,
};

/** The product types of a history filter. */
export const HISTORY_PRODUCT_TYPES = [
  "AUTO_RENEWABLE",
  "NON_RENEWABLE",
  "CONSUMABLE",
  "NON_CONSUMABLE",
] as const;

/** The most items an array filter of history may hold. */
export const HISTORY_FILTER_LIMIT = 50;

/**
 * Why this store A history body is invalid, or null when the documented rules accept it. Date
 * strings must be keys of {@linkcode HISTORY_DATES}; the fuzzer sends no other.
 */
export function storeaHistoryBodyViolation(body: unknown): string | null {
  const verify = storeaBodyViolation(body);
  if (verify !== null) return verify;
  const fields = body as Record<string, unknown>;
  const { revision, sort, startDate, endDate, inAppOwnershipType, revoked } = fields;
  if (revision !== undefined) {
    if (typeof revision !== "string" || !revision.isWellFormed()) return "revision";
    if (revision.length === 0 || tooLong(revision, 1024)) return "revision length";
  }
  if (sort !== undefined && sort !== "ascending" && sort !== "descending") return "sort";
  const dates: Record<string, number | undefined> = {};
  for (const [name, value] of [["startDate", startDate], ["endDate", endDate]] as const) {
    if (value === undefined) continue;
    if (typeof value !== "string" || !(value in HISTORY_DATES)) return `${name} is not a date`;
    const epoch = HISTORY_DATES[value];
    if (epoch === null) return `${name} is not a date the rules accept`;
    dates[name] = epoch;
  }
  if (
    dates.startDate !== undefined && dates.endDate !== undefined &&
    dates.startDate >= dates.endDate
  ) return "endDate is not after startDate";
  for (const name of ["productIds", "subscriptionGroupIdentifiers"]) {
    const list = fields[name];
    if (list === undefined) continue;
    if (!Array.isArray(list) || list.length > HISTORY_FILTER_LIMIT) return name;
    const bad = list.some((item) =>
      typeof item !== "string" || item.length === 0 || item.length > 200 || !item.isWellFormed()
    );
    if (bad) return `an item of ${name}`;
  }
  const types = fields.productTypes;
  if (types !== undefined) {
    if (!Array.isArray(types) || types.length > HISTORY_FILTER_LIMIT) return "productTypes";
    if (types.some((type) => !(HISTORY_PRODUCT_TYPES as readonly unknown[]).includes(type))) {
      return "an item of productTypes";
    }
  }
  if (
    inAppOwnershipType !== undefined && inAppOwnershipType !== "FAMILY_SHARED" &&
    inAppOwnershipType !== "PURCHASED"
  ) return "inAppOwnershipType";
  if (revoked !== undefined && typeof revoked !== "boolean") return "revoked";
  return null;
}

/** Apple's `deliveryStatus` values. */
export const DELIVERY_STATUSES = [
  "DELIVERED",
  "UNDELIVERED_QUALITY_ISSUE",
  "UNDELIVERED_WRONG_ITEM",
  "UNDELIVERED_SERVER_OUTAGE",
  "UNDELIVERED_OTHER",
] as const;

/** Apple's `refundPreference` values. */
export const REFUND_PREFERENCES = ["DECLINE", "GRANT_FULL", "GRANT_PRORATED"] as const;

/**
 * Why this store A consumption body is invalid, or null when the documented rules accept it:
 * each field's values, the customer's consent, and Apple's two rules between fields.
 */
export function storeaConsumptionBodyViolation(body: unknown): string | null {
  const verify = storeaBodyViolation(body);
  if (verify !== null) return verify;
  const fields = body as Record<string, unknown>;
  if (fields.customerConsented !== true) return "customerConsented";
  if (typeof fields.sampleContentProvided !== "boolean") return "sampleContentProvided";
  const { deliveryStatus, consumptionPercentage: percentage, refundPreference } = fields;
  if (!(DELIVERY_STATUSES as readonly unknown[]).includes(deliveryStatus)) return "deliveryStatus";
  if (
    refundPreference !== undefined &&
    !(REFUND_PREFERENCES as readonly unknown[]).includes(refundPreference)
  ) return "refundPreference";
  if (percentage === undefined) return null;
  if (!Number.isInteger(percentage) || (percentage as number) < 0 || (percentage as number) > 1e5) {
    return "consumptionPercentage";
  }
  if (deliveryStatus !== "DELIVERED" && percentage !== 0) return "a percentage of the undelivered";
  if (refundPreference === "GRANT_PRORATED" && (percentage === 0 || percentage === 1e5)) {
    return "a prorated refund of all or nothing";
  }
  return null;
}

/** "." or "..": a URL resolves them away, so a field bound for one is refused. */
function isDotSegment(value: string): boolean {
  return value === "." || value === "..";
}

/** A JSON object without its `undefined` fields, as `JSON.stringify` would send it. */
export function jsonObject(fields: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined));
}

// ---------------------------------------------------------------------------------------------
// Edits of JSON documents and compact JWS

/** Sets (or removes) the value at `path` of a JSON object, creating objects on the way. */
export interface FieldEdit {
  path: string[];
  remove: boolean;
  value: unknown;
}

/** Edits at the given paths (plus a random new one) with odd values. */
function fieldEdits(paths: string[][]): fc.Arbitrary<FieldEdit[]> {
  const edit = fc.record({
    path: fc.oneof(
      { weight: 8, arbitrary: fc.constantFrom(...paths) },
      { weight: 1, arbitrary: anyString.map((key) => [key]) },
    ),
    remove: fc.oneof(
      { weight: 4, arbitrary: fc.constant(false) },
      { weight: 1, arbitrary: fc.constant(true) },
    ),
    value: fc.oneof(oddValue, anyString),
  });
  return fc.array(edit, { minLength: 1, maxLength: 3 });
}

/** A deep copy of `document` with `edits` applied. */
function applyEdits(document: unknown, edits: FieldEdit[]): Record<string, unknown> {
  const root = structuredClone(document) as Record<string, unknown>;
  for (const edit of edits) {
    let node: Record<string, unknown> = root;
    for (const key of edit.path.slice(0, -1)) {
      const next = node[key];
      if (typeof next !== "object" || next === null || Array.isArray(next)) {
        node[key] = {};
      }
      node = node[key] as Record<string, unknown>;
    }
    const last = edit.path[edit.path.length - 1];
    if (edit.remove) delete node[last];
    else node[last] = structuredClone(edit.value);
  }
  return root;
}

/** A change to one segment of a compact JWS. */
export type SegmentEdit =
  | { op: "replace"; at: number; char: string }
  | { op: "truncate"; keep: number }
  | { op: "append"; text: string }
  | { op: "empty" }
  | { op: "standard-base64" }
  | { op: "pad" }
  | { op: "text"; text: string }
  | { op: "reencode"; json: unknown }
  | { op: "swap" }
  | { op: "extra-segment" };

/** Segment edits. */
const segmentEdit: fc.Arbitrary<SegmentEdit> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant("replace" as const),
      at: fc.nat(),
      char: fc.oneof(base64urlChar, fc.constantFrom("=", "+", "/", ".", " ", "*")),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("truncate" as const), keep: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("append" as const),
      text: fc.constantFrom("A", "AA", "AAAA", "=", "==", "."),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ op: "empty" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "standard-base64" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "pad" as const }) },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant("text" as const), text: fc.string({ maxLength: 40 }) }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      op: fc.constant("reencode" as const),
      json: fc.oneof(
        fc.jsonValue({ maxDepth: 2 }),
        fc.constantFrom({ alg: "none" }, { alg: "ES256" }, { alg: "RS256", kid: 1 }, []),
      ),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ op: "swap" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "extra-segment" as const }) },
);

/** `jws` with `edit` applied to segment `index` (0 header, 1 payload, 2 signature). */
function editSegment(jws: string, index: 0 | 1 | 2, edit: SegmentEdit): string {
  const parts = jws.split(".");
  const segment = parts[index];
  switch (edit.op) {
    case "replace": {
      const at = edit.at % Math.max(1, segment.length);
      parts[index] = segment.slice(0, at) + edit.char + segment.slice(at + 1);
      break;
    }
    case "truncate":
      parts[index] = segment.slice(0, edit.keep % Math.max(1, segment.length));
      break;
    case "append":
      parts[index] = segment + edit.text;
      break;
    case "empty":
      parts[index] = "";
      break;
    case "standard-base64":
      parts[index] = segment.replaceAll("-", "+").replaceAll("_", "/");
      break;
    case "pad":
      parts[index] = segment + "==";
      break;
    case "text":
      parts[index] = edit.text;
      break;
    case "reencode":
      parts[index] = encoder.encode(JSON.stringify(edit.json) ?? "null").toBase64({
        alphabet: "base64url",
        omitPadding: true,
      });
      break;
    case "swap": {
      const other = (index + 1) % 3;
      [parts[index], parts[other]] = [parts[other], parts[index]];
      break;
    }
    case "extra-segment":
      parts.splice(index + 1, 0, "AAAA");
      break;
  }
  return parts.join(".");
}

/**
 * Whether an edited JWS still carries exactly what was signed: the same header and payload text
 * (the signature covers the text, not what it decodes to) and a signature that decodes to the
 * same bytes. Only then may a verifier accept it.
 */
export function carriesSameSignedData(original: string, edited: string): boolean {
  const a = original.split(".");
  const b = edited.split(".");
  if (b.length !== 3 || a[0] !== b[0] || a[1] !== b[1]) return false;
  try {
    const left = Uint8Array.fromBase64(a[2], { alphabet: "base64url" });
    const right = Uint8Array.fromBase64(b[2], { alphabet: "base64url" });
    return left.length === right.length && left.every((byte, i) => byte === right[i]);
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Store A notifications

/** Apple's notification types plus ones the service has never heard of. */
const STOREA_TYPES = [
  "SUBSCRIBED",
  "DID_RENEW",
  "DID_FAIL_TO_RENEW",
  "DID_CHANGE_RENEWAL_PREF",
  "DID_CHANGE_RENEWAL_STATUS",
  "EXPIRED",
  "GRACE_PERIOD_EXPIRED",
  "PRICE_INCREASE",
  "REFUND",
  "REFUND_DECLINED",
  "REFUND_REVERSED",
  "CONSUMPTION_REQUEST",
  "RENEWAL_EXTENDED",
  "RENEWAL_EXTENSION",
  "REVOKE",
  "TEST",
  "OFFER_REDEEMED",
  "ONE_TIME_CHARGE",
  "SOMETHING_NEW",
];
const STOREA_SUBTYPES = [
  "INITIAL_BUY",
  "RESUBSCRIBE",
  "UPGRADE",
  "DOWNGRADE",
  "AUTO_RENEW_ENABLED",
  "AUTO_RENEW_DISABLED",
  "VOLUNTARY",
  "BILLING_RETRY",
  "PRICE_INCREASE",
  "GRACE_PERIOD",
  "BILLING_RECOVERY",
  "PRODUCT_NOT_FOR_SALE",
  "SUMMARY",
  "FAILURE",
];

/** What a well-formed notification is about. */
export interface StoreaNotificationBasics {
  notificationType: string;
  subtype: string | null;
  product: "Auto-Renewable Subscription" | "Consumable" | "Non-Consumable" | null;
  renewal: boolean;
  environment: "Production" | "Sandbox";
}

/** A change to one certificate of the `x5c` chain. */
export type CertificateEdit =
  | { op: "xor"; at: number; mask: number }
  | { op: "truncate"; keep: number }
  | { op: "append"; bytes: number[] }
  | { op: "other"; index: 0 | 1 | 2 }
  | { op: "text"; text: string };

/** A change to a nested JWS (`signedTransactionInfo`, `signedRenewalInfo`). */
export type NestedEdit =
  | { kind: "tamper"; segment: 0 | 1 | 2; edit: SegmentEdit }
  | { kind: "fields"; edits: FieldEdit[] }
  | { kind: "value"; value: unknown };

/** A store A `signedPayload`, valid or not quite. */
export type StoreaPayloadRecipe =
  | { kind: "valid"; basics: StoreaNotificationBasics }
  | { kind: "edited"; basics: StoreaNotificationBasics; edits: FieldEdit[] }
  | { kind: "tampered"; basics: StoreaNotificationBasics; segment: 0 | 1 | 2; edit: SegmentEdit }
  | { kind: "header"; basics: StoreaNotificationBasics; header: Record<string, unknown> }
  | {
    kind: "certificate";
    basics: StoreaNotificationBasics;
    index: 0 | 1 | 2;
    edit: CertificateEdit;
  }
  | {
    kind: "nested";
    basics: StoreaNotificationBasics;
    field: "signedTransactionInfo" | "signedRenewalInfo";
    edit: NestedEdit;
  }
  | { kind: "deep"; basics: StoreaNotificationBasics; depth: number }
  | { kind: "raw-payload"; payload: BodyRecipe }
  | { kind: "text"; text: string };

const storeaBasics: fc.Arbitrary<StoreaNotificationBasics> = fc.record({
  notificationType: fc.oneof(
    { weight: 8, arbitrary: fc.constantFrom(...STOREA_TYPES) },
    { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 30 }) },
  ),
  subtype: fc.option(
    fc.oneof(
      { weight: 6, arbitrary: fc.constantFrom(...STOREA_SUBTYPES) },
      { weight: 1, arbitrary: fc.string({ maxLength: 30 }) },
    ),
    { nil: null },
  ),
  product: fc.constantFrom(
    "Auto-Renewable Subscription" as const,
    "Auto-Renewable Subscription" as const,
    "Consumable" as const,
    "Non-Consumable" as const,
    null,
  ),
  renewal: fc.boolean(),
  environment: fc.constantFrom("Production" as const, "Sandbox" as const),
});

const NOTIFICATION_PATHS = [
  ["notificationUUID"],
  ["notificationUUID"],
  ["notificationType"],
  ["subtype"],
  ["version"],
  ["signedDate"],
  ["data"],
  ["data", "bundleId"],
  ["data", "environment"],
  ["data", "appAppleId"],
  ["data", "bundleVersion"],
  ["data", "status"],
  ["data", "signedTransactionInfo"],
  ["data", "signedRenewalInfo"],
  ["summary"],
  ["summary", "bundleId"],
];
const TRANSACTION_PATHS = [
  ["transactionId"],
  ["originalTransactionId"],
  ["bundleId"],
  ["productId"],
  ["type"],
  ["signedDate"],
  ["purchaseDate"],
  ["expiresDate"],
  ["price"],
  ["currency"],
  ["environment"],
];

/** Nesting depths: shallow, around any sensible limit, and far too deep to recurse. */
const nestingDepth: fc.Arbitrary<number> = fc.oneof(
  fc.integer({ min: 1, max: 200 }),
  fc.constantFrom(31, 32, 33, 63, 64, 65, 127, 128, 129, 10_000, 100_000),
);

/** `{"deep":[[...]], ...fields of json}`: JSON text nested `depth` levels below the top. */
function withDeepField(json: string, levels: number): string {
  return `{"deep":${"[".repeat(levels)}${"]".repeat(levels)},${json.slice(1)}`;
}

/** A certificate edit. */
const certificateEdit: fc.Arbitrary<CertificateEdit> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant("xor" as const),
      at: fc.nat(),
      mask: fc.integer({ min: 1, max: 255 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("truncate" as const), keep: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("append" as const),
      bytes: fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 8 }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant("other" as const), index: fc.constantFrom(0, 1, 2) }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("text" as const),
      text: fc.oneof(anyString, fc.constantFrom("MII", "====", "A")),
    }),
  },
);

/** `signedPayload` recipes. */
export const storeaPayload: fc.Arbitrary<StoreaPayloadRecipe> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({ kind: fc.constant("valid" as const), basics: storeaBasics }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("edited" as const),
      basics: storeaBasics,
      edits: fieldEdits(NOTIFICATION_PATHS),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("tampered" as const),
      basics: storeaBasics,
      segment: fc.constantFrom(0 as const, 1 as const, 2 as const),
      edit: segmentEdit,
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("header" as const),
      basics: storeaBasics,
      header: fc.record({
        alg: fc.constantFrom("ES256", "ES384", "RS256", "none", "HS256", "es256", 1, null),
        x5c: fc.constantFrom(
          "keep",
          "drop",
          "two",
          "four",
          "reversed",
          "not-base64",
          "numbers",
          "empty",
          "string",
        ),
        extra: fc.option(
          fc.dictionary(fc.constantFrom("kid", "typ", "crit", "b64", "jku"), oddValue),
          {
            nil: null,
          },
        ),
      }, { requiredKeys: ["x5c"] }).map((h) => h as Record<string, unknown>),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("certificate" as const),
      basics: storeaBasics,
      index: fc.constantFrom(0 as const, 1 as const, 2 as const),
      edit: certificateEdit,
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("nested" as const),
      basics: storeaBasics,
      field: fc.constantFrom(
        "signedTransactionInfo" as const,
        "signedTransactionInfo" as const,
        "signedRenewalInfo" as const,
      ),
      edit: fc.oneof(
        fc.record({
          kind: fc.constant("tamper" as const),
          segment: fc.constantFrom(0 as const, 1 as const, 2 as const),
          edit: segmentEdit,
        }),
        fc.record({ kind: fc.constant("fields" as const), edits: fieldEdits(TRANSACTION_PATHS) }),
        fc.record({ kind: fc.constant("value" as const), value: oddValue }),
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("deep" as const),
      basics: storeaBasics,
      depth: nestingDepth,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("raw-payload" as const),
      payload: bodyRecipe(8 * 1024),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("text" as const),
      text: fc.oneof(
        anyString,
        fc.constantFrom("a.b.c", "..", "e30.e30.", "e30.e30.e30", "x".repeat(5000)),
      ),
    }),
  },
);

/** The signed notification and, for tampering checks, the JWS it was derived from. */
export interface BuiltStoreaPayload {
  signedPayload: string;
  /** The notification UUID, when the payload carries a fresh valid one. */
  notificationUUID: string | null;
  /** The untouched JWS that `tampered` recipes edited. */
  original: string | null;
  /** A nested JWS before and after a `nested` recipe's segment edit. */
  nested?: { original: string; edited: string };
}

/** Builds a `signedPayload` with the simulator's signer for the tenant's bundle and app id. */
export async function buildStoreaPayload(
  recipe: StoreaPayloadRecipe,
  signer: StoreaSigner,
  appId: number,
): Promise<BuiltStoreaPayload> {
  if (recipe.kind === "text") {
    return { signedPayload: recipe.text, notificationUUID: null, original: null };
  }
  if (recipe.kind === "raw-payload") {
    const bytes = buildBody(recipe.payload, '{"notificationUUID":"x"}');
    return { signedPayload: await signer.signRaw(bytes), notificationUUID: null, original: null };
  }
  const basics = recipe.basics;
  const transaction = basics.product === null ? undefined : signer.sampleTransaction({
    type: basics.product,
    environment: basics.environment,
  });
  let signedTransactionInfo: string | undefined;
  let signedRenewalInfo: string | undefined;
  if (recipe.kind === "nested") {
    const edit = recipe.edit;
    const base = recipe.field === "signedTransactionInfo"
      ? transaction ?? signer.sampleTransaction({ environment: basics.environment })
      : signer.sampleRenewalInfo({ environment: basics.environment });
    let value: unknown;
    let nested: BuiltStoreaPayload["nested"];
    if (edit.kind === "value") value = edit.value;
    else if (edit.kind === "fields") value = await signer.signRaw(applyEdits(base, edit.edits));
    else {
      const original = await signer.signRaw(base);
      value = editSegment(original, edit.segment, edit.edit);
      nested = { original, edited: value as string };
    }
    // Placed after building: the nested value may be of any type.
    const payload = await signer.notificationPayload({
      notificationType: basics.notificationType,
      subtype: basics.subtype ?? undefined,
      transaction: recipe.field === "signedTransactionInfo" ? undefined : transaction,
      appAppleId: appId,
      environment: basics.environment,
    });
    (payload.data as unknown as Record<string, unknown>)[recipe.field] = value;
    return {
      signedPayload: await signer.signNotification(payload),
      notificationUUID: null,
      original: null,
      nested,
    };
  }
  if (basics.renewal && basics.product === "Auto-Renewable Subscription") {
    signedRenewalInfo = await signer.signRenewalInfo(
      signer.sampleRenewalInfo({
        originalTransactionId: transaction?.originalTransactionId,
        environment: basics.environment,
      }),
    );
  }
  if (transaction) signedTransactionInfo = await signer.signTransaction(transaction);
  const payload = await signer.notificationPayload({
    notificationType: basics.notificationType,
    subtype: basics.subtype ?? undefined,
    signedTransactionInfo,
    signedRenewalInfo,
    appAppleId: appId,
    environment: basics.environment,
  });
  switch (recipe.kind) {
    case "valid":
      return {
        signedPayload: await signer.signNotification(payload),
        notificationUUID: payload.notificationUUID,
        original: null,
      };
    case "edited":
      return {
        signedPayload: await signer.signRaw(applyEdits(payload, recipe.edits)),
        notificationUUID: null,
        original: null,
      };
    case "deep":
      return {
        signedPayload: await signer.signRaw(
          encoder.encode(withDeepField(JSON.stringify(payload), recipe.depth)),
        ),
        notificationUUID: null,
        original: null,
      };
    case "tampered": {
      const original = await signer.signNotification(payload);
      return {
        signedPayload: editSegment(original, recipe.segment, recipe.edit),
        notificationUUID: null,
        original,
      };
    }
    case "header": {
      const { x5c, extra, ...rest } = recipe.header;
      const header: Record<string, unknown> = { ...rest, ...(extra ?? {}) };
      header.x5c = x5cVariant(signer.pki.x5c, x5c as string);
      return {
        signedPayload: await signer.signRaw(payload, header),
        notificationUUID: null,
        original: null,
      };
    }
    case "certificate": {
      const chain: unknown[] = [...signer.pki.x5c];
      chain[recipe.index] = editCertificate(signer.pki.x5c, recipe.index, recipe.edit);
      return {
        signedPayload: await signer.signRaw(payload, { x5c: chain as string[] }),
        notificationUUID: null,
        original: null,
      };
    }
  }
}

function x5cVariant(x5c: string[], variant: string): unknown {
  switch (variant) {
    case "keep":
      return x5c;
    case "drop":
      return undefined;
    case "two":
      return x5c.slice(0, 2);
    case "four":
      return [...x5c, x5c[2]];
    case "reversed":
      return [...x5c].reverse();
    case "not-base64":
      return ["!!!", "***", "@@@"];
    case "numbers":
      return [1, 2, 3];
    case "empty":
      return [];
    default:
      return x5c.join("");
  }
}

function editCertificate(x5c: string[], index: 0 | 1 | 2, edit: CertificateEdit): string {
  const der = Uint8Array.fromBase64(x5c[index]);
  switch (edit.op) {
    case "xor": {
      const copy = der.slice();
      copy[edit.at % copy.length] ^= edit.mask;
      return copy.toBase64();
    }
    case "truncate":
      return der.slice(0, edit.keep % der.length).toBase64();
    case "append":
      return concat(der, new Uint8Array(edit.bytes)).toBase64();
    case "other":
      return x5c[edit.index];
    case "text":
      return edit.text;
  }
}

// ---------------------------------------------------------------------------------------------
// Store B push tokens and envelopes

/** One thing wrong with an otherwise valid push token (each has a documented answer). */
export type PushTokenFault =
  | "audience"
  | "email"
  | "unverified"
  | "issuer"
  | "expired"
  | "future"
  | "unknown-key"
  | "wrong-key"
  | "omit-exp"
  | "omit-email"
  | "omit-email_verified"
  | "omit-aud"
  | "omit-iss";

/** The answer to each single fault (docs/relay.md, "How a notification is received"). */
export const PUSH_FAULT_CODE: Record<PushTokenFault, "UNAUTHENTICATED" | "SIGNATURE_INVALID"> = {
  "audience": "SIGNATURE_INVALID",
  "email": "SIGNATURE_INVALID",
  "unverified": "UNAUTHENTICATED",
  "issuer": "UNAUTHENTICATED",
  "expired": "UNAUTHENTICATED",
  "future": "UNAUTHENTICATED",
  "unknown-key": "SIGNATURE_INVALID",
  "wrong-key": "SIGNATURE_INVALID",
  "omit-exp": "UNAUTHENTICATED",
  "omit-email": "UNAUTHENTICATED",
  "omit-email_verified": "UNAUTHENTICATED",
  "omit-aud": "SIGNATURE_INVALID",
  "omit-iss": "UNAUTHENTICATED",
};

/** A store B `Authorization` header. */
export type PushAuthRecipe =
  | { kind: "valid"; variant: "exact" | "email-case" | "short-issuer" }
  | { kind: "fault"; fault: PushTokenFault; value: string }
  | { kind: "faults"; faults: PushTokenFault[] }
  | { kind: "tampered"; segment: 0 | 1 | 2; edit: SegmentEdit }
  | {
    kind: "forged";
    alg: unknown;
    kid: "real" | "unknown" | "none" | "number";
    claims: "valid" | "odd";
    oddClaims: unknown;
    signature: "random" | "empty" | "short";
  }
  | { kind: "raw"; value: string }
  | { kind: "none" };

/** How the token is put in the header. */
export interface PushAuthFormat {
  scheme: string;
  spaces: number;
}

const pushFault = fc.constantFrom(...(Object.keys(PUSH_FAULT_CODE) as PushTokenFault[]));

/** Push token recipes. */
export const pushAuth: fc.Arbitrary<PushAuthRecipe> = fc.oneof(
  {
    weight: 30,
    arbitrary: fc.record({
      kind: fc.constant("valid" as const),
      variant: fc.constantFrom(
        "exact" as const,
        "exact" as const,
        "exact" as const,
        "email-case" as const,
        "short-issuer" as const,
      ),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("fault" as const),
      fault: pushFault,
      value: fc.oneof(
        fc.constantFrom("", "https://evil.example/push"),
        fc.string({ maxLength: 30 }),
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("faults" as const),
      faults: fc.uniqueArray(pushFault, { minLength: 2, maxLength: 4 }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("tampered" as const),
      segment: fc.constantFrom(0 as const, 1 as const, 2 as const),
      edit: segmentEdit,
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("forged" as const),
      alg: fc.constantFrom("RS256", "RS256", "none", "HS256", "ES256", "rs256", null, 7),
      kid: fc.constantFrom("real" as const, "unknown" as const, "none" as const, "number" as const),
      claims: fc.constantFrom("valid" as const, "valid" as const, "odd" as const),
      oddClaims: fc.oneof(fc.jsonValue({ maxDepth: 2 }), oddValue),
      signature: fc.constantFrom("random" as const, "empty" as const, "short" as const),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("raw" as const),
      value: fc.oneof(
        headerValue(60),
        fc.constantFrom("a.b.c", "e30.e30.e30", "Bearer x", "eyJ", "...", "a..b"),
      ),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ kind: "none" as const }) },
);

/** Header formats: mostly `Bearer <token>`. */
export const pushAuthFormat: fc.Arbitrary<PushAuthFormat> = fc.oneof(
  { weight: 16, arbitrary: fc.constant({ scheme: "Bearer", spaces: 1 }) },
  {
    weight: 1,
    arbitrary: fc.record({
      scheme: fc.constantFrom("bearer", "BEARER", "Bearer", "Basic", "", "Bearer,", "Token"),
      spaces: fc.constantFrom(0, 1, 2, 3),
    }),
  },
);

/** What the tenant's push configuration expects of a token. */
export interface PushExpectation {
  audience: string;
  email: string;
  /** A `kid` the issuer publishes, for forged tokens. */
  kid: string;
}

/** The `Authorization` value of a push recipe, or null for none. */
export async function buildPushAuth(
  recipe: PushAuthRecipe,
  format: PushAuthFormat,
  issuer: PushTokenIssuer,
  expected: PushExpectation,
): Promise<{ header: string | null; token: string | null; original: string | null }> {
  const base: PushTokenClaimsInput = { audience: expected.audience, email: expected.email };
  let token: string;
  let original: string | null = null;
  switch (recipe.kind) {
    case "none":
      return { header: null, token: null, original: null };
    case "raw":
      return { header: recipe.value, token: null, original: null };
    case "valid":
      token = await issuer.mint({
        ...base,
        ...(recipe.variant === "email-case" ? { email: expected.email.toUpperCase() } : {}),
        ...(recipe.variant === "short-issuer" ? { issuer: "accounts.google.com" } : {}),
      });
      break;
    case "fault":
      token = await issuer.mint(withFaults(base, [recipe.fault], recipe.value));
      break;
    case "faults":
      token = await issuer.mint(withFaults(base, recipe.faults, "other"));
      break;
    case "tampered":
      original = await issuer.mint(base);
      token = editSegment(original, recipe.segment, recipe.edit);
      break;
    case "forged": {
      const header: Record<string, unknown> = { alg: recipe.alg, typ: "JWT" };
      if (recipe.kid === "real") header.kid = expected.kid;
      if (recipe.kid === "unknown") header.kid = "f".repeat(40);
      if (recipe.kid === "number") header.kid = 42;
      const now = Math.floor(Date.now() / 1000);
      const claims = recipe.claims === "valid"
        ? {
          aud: expected.audience,
          email: expected.email,
          email_verified: true,
          iss: "https://accounts.google.com",
          iat: now,
          exp: now + 600,
        }
        : recipe.oddClaims;
      const signature = recipe.signature === "empty"
        ? new Uint8Array(0)
        : crypto.getRandomValues(new Uint8Array(recipe.signature === "short" ? 8 : 256));
      token = [
        encoder.encode(JSON.stringify(header)),
        encoder.encode(JSON.stringify(claims) ?? "null"),
        signature,
      ].map((bytes) => bytes.toBase64({ alphabet: "base64url", omitPadding: true })).join(".");
      break;
    }
  }
  return { header: `${format.scheme}${" ".repeat(format.spaces)}${token}`, token, original };
}

function withFaults(
  base: PushTokenClaimsInput,
  faults: PushTokenFault[],
  value: string,
): PushTokenClaimsInput {
  const claims: PushTokenClaimsInput = { ...base, omit: [] };
  for (const fault of faults) {
    switch (fault) {
      case "audience":
        claims.audience = value === base.audience ? `${value}x` : value;
        break;
      case "email":
        claims.email = value.toLowerCase() === base.email.toLowerCase() ? `x${value}` : value;
        break;
      case "unverified":
        claims.emailVerified = false;
        break;
      case "issuer":
        claims.issuer = "https://evil.example";
        break;
      case "expired":
        claims.expiresInSeconds = -600;
        break;
      case "future":
        claims.issuedAt = Math.floor(Date.now() / 1000) + 3600;
        break;
      case "unknown-key":
        claims.unknownKey = true;
        break;
      case "wrong-key":
        claims.wrongKey = true;
        break;
      default:
        claims.omit!.push(fault.slice("omit-".length) as "email");
    }
  }
  return claims;
}

/** Whether `header` is `Bearer <token>` as RFC 6750 spells it (scheme case-insensitive). */
export function isBearerFormat(format: PushAuthFormat): boolean {
  return format.scheme.toLowerCase() === "bearer" && format.spaces >= 1;
}

/** The developer notification inside a valid envelope. */
export type StorebNotificationKind = "subscription" | "one-time" | "voided" | "test" | "none";

/** A store B push envelope, valid or not quite. */
export type EnvelopeRecipe =
  | {
    kind: "valid";
    notification: StorebNotificationKind;
    notificationType: number;
    spelling: "messageId" | "message_id" | "both";
  }
  | { kind: "edited"; notification: StorebNotificationKind; edits: FieldEdit[] }
  | { kind: "notification-edited"; notification: StorebNotificationKind; edits: FieldEdit[] }
  | { kind: "data"; data: DataRecipe };

/** What `message.data` holds when it is not a valid notification. */
export type DataRecipe =
  | { kind: "bytes"; bytes: number[] }
  | { kind: "text"; text: string }
  | { kind: "json"; value: unknown }
  | { kind: "base64url" }
  | { kind: "invalid-utf8" }
  | { kind: "deep"; depth: number };

const notificationKind = fc.constantFrom(
  "subscription" as const,
  "subscription" as const,
  "one-time" as const,
  "voided" as const,
  "test" as const,
  "none" as const,
);

const ENVELOPE_PATHS = [
  ["message"],
  ["message", "data"],
  ["message", "messageId"],
  ["message", "messageId"],
  ["message", "message_id"],
  ["message", "publishTime"],
  ["message", "attributes"],
  ["message", "attributes", "key"],
  ["subscription"],
];
const NOTIFICATION_FIELDS = [
  ["packageName"],
  ["packageName"],
  ["version"],
  ["eventTimeMillis"],
  ["subscriptionNotification"],
  ["subscriptionNotification", "notificationType"],
  ["subscriptionNotification", "purchaseToken"],
  ["subscriptionNotification", "subscriptionId"],
  ["oneTimeProductNotification", "sku"],
  ["voidedPurchaseNotification", "refundType"],
  ["testNotification"],
];

/** Envelope recipes. */
export const envelope: fc.Arbitrary<EnvelopeRecipe> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant("valid" as const),
      notification: notificationKind,
      notificationType: fc.oneof(fc.integer({ min: 1, max: 22 }), fc.constantFrom(0, 99, -1)),
      spelling: fc.constantFrom("messageId" as const, "message_id" as const, "both" as const),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("edited" as const),
      notification: notificationKind,
      edits: fieldEdits(ENVELOPE_PATHS),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("notification-edited" as const),
      notification: notificationKind,
      edits: fieldEdits(NOTIFICATION_FIELDS),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("data" as const),
      data: fc.oneof(
        fc.record({
          kind: fc.constant("bytes" as const),
          bytes: fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 100 }),
        }),
        fc.record({ kind: fc.constant("text" as const), text: anyString }),
        fc.record({ kind: fc.constant("json" as const), value: fc.jsonValue({ maxDepth: 3 }) }),
        fc.constant({ kind: "base64url" as const }),
        fc.constant({ kind: "invalid-utf8" as const }),
        fc.record({ kind: fc.constant("deep" as const), depth: nestingDepth }),
      ),
    }),
  },
);

/** The developer notification of `kind` for `packageName`. */
function developerNotification(
  kind: StorebNotificationKind,
  packageName: string,
  notificationType: number,
): Record<string, unknown> {
  const common = { version: "1.0", packageName, eventTimeMillis: String(Date.now()) };
  const purchaseToken = `fuzz-${crypto.randomUUID()}`;
  switch (kind) {
    case "subscription":
      return {
        ...common,
        subscriptionNotification: {
          version: "1.0",
          notificationType,
          purchaseToken,
          subscriptionId: "pro.monthly",
        },
      };
    case "one-time":
      return {
        ...common,
        oneTimeProductNotification: {
          version: "1.0",
          notificationType: notificationType % 3,
          purchaseToken,
          sku: "coins.100",
        },
      };
    case "voided":
      return {
        ...common,
        voidedPurchaseNotification: {
          purchaseToken,
          // One order per purchase: a voided purchase is known by its order id, so a fixed one
          // would make every voided notification after the first a duplicate.
          orderId: `GPA.${String(Math.floor(Math.random() * 1e16)).padStart(16, "0")}`,
          productType: 2,
          refundType: 1 + (notificationType % 2),
        },
      };
    case "test":
      return { ...common, testNotification: { version: "1.0" } };
    case "none":
      return common;
  }
}

/** A push envelope around `notification`, with a fresh message id. */
function pushEnvelopeOf(
  notification: unknown,
  data?: string,
): Record<string, unknown> {
  const messageId = String(1e15 + Math.floor(Math.random() * 8e15));
  const publishTime = new Date().toISOString();
  return {
    message: {
      data: data ?? encoder.encode(JSON.stringify(notification)).toBase64(),
      messageId,
      message_id: messageId,
      publishTime,
      publish_time: publishTime,
    },
    subscription: "projects/fuzz-project/subscriptions/play-rtdn",
  };
}

/** The envelope of `recipe` for the tenant's `packageName`, and whether it is valid. */
export function buildEnvelope(
  recipe: EnvelopeRecipe,
  packageName: string,
): { envelope: Record<string, unknown>; valid: boolean } {
  switch (recipe.kind) {
    case "valid": {
      const built = pushEnvelopeOf(
        developerNotification(recipe.notification, packageName, recipe.notificationType),
      );
      const message = built.message as Record<string, unknown>;
      if (recipe.spelling === "messageId") delete message.message_id;
      if (recipe.spelling === "message_id") delete message.messageId;
      return { envelope: built, valid: true };
    }
    case "edited":
      return {
        envelope: applyEdits(
          pushEnvelopeOf(developerNotification(recipe.notification, packageName, 2)),
          recipe.edits,
        ),
        valid: false,
      };
    case "notification-edited":
      return {
        envelope: pushEnvelopeOf(
          applyEdits(developerNotification(recipe.notification, packageName, 2), recipe.edits),
        ),
        valid: false,
      };
    case "data": {
      const valid = encoder.encode(
        JSON.stringify(developerNotification("subscription", packageName, 2)),
      );
      const data = recipe.data;
      const text = data.kind === "deep"
        ? encoder.encode(withDeepField(new TextDecoder().decode(valid), data.depth)).toBase64()
        : data.kind === "bytes"
        ? new Uint8Array(data.bytes).toBase64()
        : data.kind === "text"
        ? data.text
        : data.kind === "json"
        ? encoder.encode(JSON.stringify(data.value) ?? "null").toBase64()
        : data.kind === "base64url"
        ? valid.toBase64({ alphabet: "base64url", omitPadding: true })
        : concat(new Uint8Array([0xc0, 0xaf]), valid).toBase64();
      // URL-safe base64 of a valid notification is accepted (Pub/Sub clients differ).
      return { envelope: pushEnvelopeOf(null, text), valid: data.kind === "base64url" };
    }
  }
}
