/**
 * `docs/openapi.yaml` against the real service. The document must be OpenAPI 3.1 and describe
 * exactly the router's endpoints, the error codes each endpoint answers and the event catalog; then
 * a real service process answers a broad set of requests (through the store simulators, as the
 * other end-to-end tests do) and its real deliveries are caught by the callback receiver. Every
 * answer must have a documented status, the documented headers and a body that validates against
 * the documented schema, with the document's `$ref`s resolved by ajv (JSON Schema 2020-12).
 *
 * The document's answer and delivery schemas are open to new fields (docs/integration.md,
 * Compatibility), so the service's answers are checked against a strict view of them instead:
 * the service's own objects closed and `EventName` limited to its known names, so that an
 * undocumented field or event still fails here. The document must also work in the tools
 * integrators feed it to: strict YAML 1.2 (js-yaml), the OpenAPI 3.1 schema, and Redocly's
 * recommended lint rules.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { parse } from "yaml";
import { load } from "js-yaml";
import { Validator } from "@seriousme/openapi-schema-validator";
import SwaggerParser from "@apidevtools/swagger-parser";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import {
  createTenantWithKey,
  type RunningService,
  startService,
  stopAndDrop,
} from "./helpers/service.ts";
import {
  storeaCredentialArgs,
  storebCredentialArgs,
  TEST_ISSUER_ID,
  writeStoreaKeyFile,
} from "./helpers/fixtures.ts";
import { cliOk, createTenantWithCallback, DELIVERY_KEYS, eventually } from "./helpers/relay.ts";
import { ERROR_STATUS } from "../src/errors.ts";
import { RECEIVER_BODY_LIMIT, VERIFY_BODY_LIMIT } from "../src/http/body.ts";
import { ENDPOINTS } from "../src/api/mod.ts";
import { classifyStorea, classifyStoreb } from "../src/events/catalog.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import {
  startStoreaApiSimulator,
  STOREA_API_ERRORS,
  storeaRateLimitedAnswer,
} from "../simulators/storea_api.ts";
import {
  sampleProductPurchase,
  sampleSubscriptionPurchase,
  startStorebSimulator,
} from "../simulators/storeb_play.ts";
import { createServiceAccount } from "../simulators/service_account.ts";
import {
  oneTimeProductNotification,
  pushEnvelope,
  startPushTokenIssuer,
  subscriptionNotification,
  testNotification,
  voidedPurchaseNotification,
} from "../simulators/storeb_push.ts";
import { type ReceivedDelivery, startCallbackReceiver } from "../simulators/callback_receiver.ts";

/** A node of the parsed document or of a JSON body. */
// deno-lint-ignore no-explicit-any
type Node = any;

const DOC_TEXT = await Deno.readTextFile(new URL("../docs/openapi.yaml", import.meta.url));
/** The document as strict tools read it: js-yaml (as swagger-parser and Redocly), YAML 1.2. */
const DOC: Node = readDocument(DOC_TEXT);

function readDocument(text: string): Node {
  try {
    return load(text);
  } catch (error) {
    // The usual cause: `deno fmt` splits a flow mapping or sequence (`{ ... }`, `[ ... ]`) longer
    // than the line width over several lines, closing it at its key's indentation, which strict
    // parsers refuse ("deficient indentation").
    throw new Error(
      "docs/openapi.yaml is not strict YAML 1.2; write a long `{ ... }` or `[ ... ]` as a block",
      { cause: error },
    );
  }
}
const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
const BUNDLE_ID = "com.example.app"; // storeaCredentialArgs' bundle
const PACKAGE = "com.example.app"; // storebCredentialArgs' package
const AUDIENCE = "https://relay.example.com/push"; // storebCredentialArgs' push audience
const PUSH_ACCOUNT = "push@example-project.iam.gserviceaccount.com";
const OTHER_KEY = btoa(String.fromCharCode(...new Uint8Array(32).fill(9)));

/** The operations a tenant's backend calls with its API key: verify, store lookups and actions. */
const API_KEY_OPERATIONS = ENDPOINTS.filter((e) => e.auth === "api-key").map((e) =>
  `${e.method} ${e.pattern}`
);

/** The error codes of every operation and status, as the docs list them. */
const SPEC_CODES: Record<string, Record<string, string[]>> = {
  "POST /v1/storea/verify": {
    "200": ["TRANSACTION_NOT_FOUND", "BUNDLE_ID_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["APPLE_API_ERROR"],
  },
  "POST /v1/storeb/verify": {
    "200": ["PURCHASE_NOT_FOUND", "PACKAGE_NAME_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["GOOGLE_API_ERROR"],
  },
  "POST /v1/storea/subscriptions": {
    "200": ["TRANSACTION_NOT_FOUND", "BUNDLE_ID_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["APPLE_API_ERROR"],
  },
  "POST /v1/storea/history": {
    "200": ["TRANSACTION_NOT_FOUND", "BUNDLE_ID_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["APPLE_API_ERROR"],
  },
  "POST /v1/storea/consumption": {
    "200": ["TRANSACTION_NOT_FOUND"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["APPLE_API_ERROR"],
  },
  "POST /v1/storeb/acknowledge": {
    "200": ["PURCHASE_NOT_FOUND", "PURCHASE_PENDING", "PACKAGE_NAME_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["GOOGLE_API_ERROR"],
  },
  "POST /v1/storeb/consume": {
    "200": ["PURCHASE_NOT_FOUND", "PURCHASE_PENDING", "PACKAGE_NAME_MISMATCH"],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["UNAUTHENTICATED"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
    "502": ["GOOGLE_API_ERROR"],
  },
  "POST /v1/webhooks/storea/{tenantId}": {
    "200": [],
    "400": ["INVALID_REQUEST", "CREDENTIALS_MISSING"],
    "401": ["SIGNATURE_INVALID"],
    "404": ["TENANT_NOT_FOUND"],
    "429": ["RATE_LIMITED"],
    "500": ["INTERNAL_ERROR"],
  },
  "POST /v1/webhooks/storeb/{tenantId}": {
    "200": [],
    "400": ["INVALID_REQUEST"],
    "401": ["UNAUTHENTICATED", "SIGNATURE_INVALID"],
    "404": ["TENANT_NOT_FOUND"],
    "500": ["INTERNAL_ERROR"],
  },
  "GET /health": { "200": [] },
  "GET /ready": { "200": [], "503": [] },
};

// ---- the document: $refs, ajv ----

/** The node a local `$ref` points at. */
function pointer(ref: string): Node {
  assert.ok(ref.startsWith("#/"), `only local $refs are used: ${ref}`);
  let node = DOC;
  for (const raw of ref.slice(2).split("/")) {
    const key = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    assert.ok(node !== null && typeof node === "object" && key in node, `unresolved $ref ${ref}`);
    node = node[key];
  }
  return node;
}

/** Follows `$ref`s of non-schema objects (responses, headers, parameters). */
function deref(node: Node): Node {
  for (let hops = 0; node !== null && typeof node === "object" && "$ref" in node; hops++) {
    assert.ok(hops < 10, "a $ref cycle");
    node = pointer(node.$ref);
  }
  return node;
}

/** Every `$ref` string in `node`, with where it was found. */
function refsIn(node: Node, at = "#"): [string, string][] {
  if (node === null || typeof node !== "object") return [];
  const found: [string, string][] = [];
  for (const [key, value] of Object.entries(node)) {
    if (key === "$ref" && typeof value === "string") found.push([value, at]);
    else found.push(...refsIn(value, `${at}/${key}`));
  }
  return found;
}

/**
 * How a schema is read: `document` as written (open to new fields and event names), `strict` as
 * the service's answers and deliveries are held to (see `strictSchema`).
 */
type View = "document" | "strict";

/** The component schemas of each view are registered with ajv under its id, as `$defs`. */
const SCHEMAS_ID: Record<View, string> = {
  document: "urn:purchase-relay:openapi:schemas",
  strict: "urn:purchase-relay:openapi:strict-schemas",
};

/** The stores' own objects, forwarded unchanged: open in both views, the stores add fields. */
const STORE_SCHEMAS = new Set([
  "StoreaNotificationRequest",
  "StoreaNotification",
  "StoreaNotificationData",
  "StoreaTransactionInfo",
  "StoreaRenewalInfo",
  "StorebPushEnvelope",
  "StorebDeveloperNotification",
]);

/** A copy of `node` whose component `$ref`s point into the `$defs` of `view`. */
function absoluteRefs(node: Node, view: View): Node {
  if (Array.isArray(node)) return node.map((item) => absoluteRefs(item, view));
  if (node === null || typeof node !== "object") return node;
  return Object.fromEntries(
    Object.entries(node).map(([key, value]) => [
      key,
      key === "$ref" && typeof value === "string"
        ? value.replace(/^#\/components\/schemas\//, `${SCHEMAS_ID[view]}#/$defs/`)
        : absoluteRefs(value, view),
    ]),
  );
}

const SUBSCHEMA_MAPS = new Set(["properties", "patternProperties", "$defs", "dependentSchemas"]);
const SUBSCHEMAS = new Set(["items", "additionalProperties", "contains", "propertyNames"]);
const BRANCH_LISTS = new Set(["allOf", "anyOf", "oneOf"]);
const BRANCHES = new Set(["if", "then", "else", "not"]);

/**
 * The strict view of a schema of the service's own: every object schema that names its
 * properties allows no other (`unevaluatedProperties: false`, which sees through `allOf` and
 * `if`/`then`). A composition branch describes part of an object, so it stays open, and its
 * `additionalProperties: true` is dropped: it would mark every property evaluated.
 */
function strictSchema(node: Node, branch = false): Node {
  if (node === null || typeof node !== "object" || Array.isArray(node)) return node;
  const copy: Node = {};
  for (const [key, value] of Object.entries<Node>(node)) {
    if (SUBSCHEMA_MAPS.has(key)) {
      copy[key] = Object.fromEntries(
        Object.entries(value).map(([name, schema]) => [name, strictSchema(schema)]),
      );
    } else if (SUBSCHEMAS.has(key)) copy[key] = strictSchema(value);
    else if (BRANCH_LISTS.has(key)) copy[key] = value.map((item: Node) => strictSchema(item, true));
    else if (BRANCHES.has(key)) copy[key] = strictSchema(value, true);
    else copy[key] = value;
  }
  if (branch && copy.additionalProperties === true) delete copy.additionalProperties;
  if (
    !branch && copy.properties && copy.additionalProperties === undefined &&
    copy.unevaluatedProperties === undefined
  ) {
    copy.unevaluatedProperties = false;
  }
  return copy;
}

/** The component schemas in the strict view: `EventName` takes only the names it lists. */
function strictComponents(schemas: Record<string, Node>): Record<string, Node> {
  return Object.fromEntries(
    Object.entries(schemas).map(([name, schema]) => [
      name,
      STORE_SCHEMAS.has(name)
        ? schema
        : name === "EventName"
        ? { ...schema, enum: schema.examples }
        : strictSchema(schema),
    ]),
  );
}

/** RFC 3339 date-time, as OpenAPI's `format: date-time` means it. */
function isDateTime(value: string): boolean {
  return /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/.test(value) &&
    !Number.isNaN(Date.parse(value));
}

// Strict: an unknown or misspelt keyword in the document fails the compile instead of being
// ignored; the OpenAPI 3.1 schema dialect adds nothing this document uses.
const ajv = new Ajv2020({
  strict: true,
  strictTypes: false,
  strictRequired: false, // `anyOf: [{ required: [a] }, { required: [b] }]` is meant
  allowUnionTypes: true,
  allErrors: true,
});
ajv.addFormat("date-time", { type: "string", validate: isDateTime });
ajv.addSchema({
  $id: SCHEMAS_ID.document,
  $defs: absoluteRefs(DOC.components.schemas, "document"),
});
ajv.addSchema({
  $id: SCHEMAS_ID.strict,
  $defs: absoluteRefs(strictComponents(DOC.components.schemas), "strict"),
});
const validators: Record<View, Map<Node, ValidateFunction>> = {
  document: new Map(),
  strict: new Map(),
};

/**
 * Why `value` does not validate against `schema` (a schema of the document) read in `view`, or
 * null. The strict view is the default: it is what the service's answers are held to.
 */
function schemaErrors(schema: Node, value: unknown, view: View = "strict"): string | null {
  let validate = validators[view].get(schema);
  if (validate === undefined) {
    validate = ajv.compile(absoluteRefs(view === "strict" ? strictSchema(schema) : schema, view));
    validators[view].set(schema, validate);
  }
  return validate(value) ? null : ajv.errorsText(validate.errors, { separator: "; " });
}

function assertValid(schema: Node, value: unknown, what: string, view: View = "strict"): void {
  const errors = schemaErrors(schema, value, view);
  assert.equal(errors, null, `${what}: ${errors}\n${JSON.stringify(value)?.slice(0, 1500)}`);
}

function assertInvalid(schema: Node, value: unknown, what: string, view: View = "strict"): void {
  assert.notEqual(schemaErrors(schema, value, view), null, `${what} validates, and must not`);
}

function component(name: string): Node {
  return { $ref: `#/components/schemas/${name}` };
}

/** Every operation of `paths`, as `METHOD /path`. */
function documentedOperations(): Map<string, Node> {
  const operations = new Map<string, Node>();
  for (const [path, item] of Object.entries<Node>(DOC.paths)) {
    for (const method of METHODS) {
      if (item[method]) operations.set(`${method.toUpperCase()} ${path}`, item[method]);
    }
  }
  return operations;
}

function operation(key: string): Node {
  const found = documentedOperations().get(key);
  assert.ok(found, `${key} is not documented`);
  return found;
}

/** The values an `error` property may take under `schema`, or null when unconstrained. */
function codesOf(schema: Node): Set<string> | null {
  const node = schema.$ref ? pointer(schema.$ref) : schema;
  let codes: Set<string> | null = null;
  const meet = (other: Set<string> | null) => {
    if (other !== null) codes = codes === null ? other : codes.intersection(other);
  };
  if (node.properties?.error) {
    const error = node.properties.error.$ref
      ? pointer(node.properties.error.$ref)
      : node.properties.error;
    if ("const" in error) meet(new Set([error.const]));
    else if (error.enum) meet(new Set(error.enum));
  }
  for (const part of node.allOf ?? []) meet(codesOf(part));
  return codes;
}

/** The error codes a response documents: the union over its `oneOf` branches. */
function documentedCodes(response: Node): Set<string> {
  const schema = deref(response).content?.["application/json"]?.schema;
  if (!schema) return new Set();
  const branches = schema.oneOf ?? [schema];
  return new Set(branches.flatMap((branch: Node) => [...(codesOf(branch) ?? [])]));
}

// ---- answers checked against the document ----

/** A real HTTP answer. */
interface Answer {
  status: number;
  headers: Headers;
  text: string;
  json: Node;
}

/** `METHOD /path status code` of every answer checked. */
const seen = new Set<string>();

async function send(url: string, init: RequestInit = {}): Promise<Answer> {
  const response = await fetch(url, init);
  const text = await response.text();
  let json: Node = undefined;
  try {
    json = JSON.parse(text);
  } catch {
    // left undefined: a JSON body is checked below
  }
  return { status: response.status, headers: response.headers, text, json };
}

function checkHeader(name: string, header: Node, value: string | null, where: string): void {
  if (value === null) {
    assert.ok(!header.required, `${where}: the required header ${name} is missing`);
    return;
  }
  const schema = header.schema.$ref ? pointer(header.schema.$ref) : header.schema;
  let typed: unknown = value;
  if (schema.type === "integer" || schema.type === "number") {
    assert.match(value, /^-?\d+(\.\d+)?$/, `${where}: header ${name}`);
    typed = Number(value);
  }
  assertValid(header.schema, typed, `${where}: header ${name}`);
}

/** Checks an answer against a documented response: headers, content type, body. */
function checkResponse(response: Node, answer: Answer, where: string): void {
  for (const [name, header] of Object.entries<Node>(response.headers ?? {})) {
    checkHeader(name, deref(header), answer.headers.get(name), where);
  }
  const media = response.content?.["application/json"];
  assert.ok(media, `${where}: no application/json body is documented`);
  assert.match(answer.headers.get("content-type") ?? "", /^application\/json(;|$)/, where);
  assert.notEqual(answer.json, undefined, `${where}: not JSON: ${answer.text.slice(0, 300)}`);
  assertValid(media.schema, answer.json, where);
}

/** Checks `answer` against operation `key` (`METHOD /path`) and records it; returns it. */
function checked(key: string, answer: Answer): Answer {
  const responses = operation(key).responses;
  const where = `${key} -> ${answer.status}`;
  const response = responses[String(answer.status)] ??
    responses[`${String(answer.status)[0]}XX`] ?? responses.default;
  assert.ok(response, `${where} is not documented; body ${answer.text.slice(0, 300)}`);
  checkResponse(deref(response), answer, where);
  const code = answer.json?.error;
  if (answer.status !== 200 && answer.status !== 503) {
    assert.equal(ERROR_STATUS[code as keyof typeof ERROR_STATUS], answer.status, where);
  }
  seen.add(`${key} ${answer.status} ${code ?? ""}`);
  return answer;
}

/** Whether the document accepts `body` as the request body of `key`. */
function documentAccepts(key: string, body: unknown): boolean {
  const schema = operation(key).requestBody.content["application/json"].schema;
  return schemaErrors(schema, body, "document") === null;
}

/** Checks a delivery the callback receiver caught against `webhooks.purchaseEvent`. */
function checkDelivery(delivery: ReceivedDelivery): Node {
  const hook = DOC.webhooks.purchaseEvent.post;
  const where = `delivery ${delivery.headers["x-service-event-id"]}`;
  assert.equal(delivery.method, "POST");
  for (const parameter of hook.parameters.map(deref)) {
    assert.equal(parameter.in, "header");
    const value = delivery.headers[parameter.name.toLowerCase()] ?? null;
    checkHeader(parameter.name, parameter, value, where);
  }
  assert.deepEqual(Object.keys(hook.requestBody.content), ["application/json"]);
  assert.equal(delivery.headers["content-type"], "application/json", where);
  assertValid(hook.requestBody.content["application/json"].schema, delivery.json, where);
  const body = delivery.json as Node;
  assert.equal(delivery.headers["x-service-event"], body.event, where);
  assert.equal(delivery.headers["x-service-event-id"], body.eventId, where);
  assert.equal(delivery.signatureValid, true, where);
  return body;
}

// ---- what the service really routes and classifies ----

/** `METHOD /path` of every endpoint of the route table the server routes by. */
function routerOperations(): Set<string> {
  return new Set(ENDPOINTS.map((e) => `${e.method} ${e.pattern.replace(/:(\w+)/g, "{$1}")}`));
}

/** Every unified event the catalog produces, over every input it distinguishes. */
function catalogEvents(): Set<string> {
  const events = new Set<string>();
  const storeaTypes = `SUBSCRIBED DID_RENEW DID_FAIL_TO_RENEW GRACE_PERIOD_EXPIRED
    DID_CHANGE_RENEWAL_STATUS DID_CHANGE_RENEWAL_PREF OFFER_REDEEMED PRICE_INCREASE
    RENEWAL_EXTENDED RENEWAL_EXTENSION EXPIRED REVOKE ONE_TIME_CHARGE REFUND REFUND_DECLINED
    REFUND_REVERSED CONSUMPTION_REQUEST TEST SOMETHING_NEW`.split(/\s+/);
  const subtypes = [
    undefined,
    ...`BILLING_RECOVERY GRACE_PERIOD AUTO_RENEW_DISABLED
    AUTO_RENEW_ENABLED VOLUNTARY`.split(/\s+/),
  ];
  const transactions = [
    null,
    { originalTransactionId: "1", productId: "p", type: "Auto-Renewable Subscription" },
    { originalTransactionId: "1", productId: "p", type: "Non-Consumable" },
  ];
  for (const notificationType of storeaTypes) {
    for (const subtype of subtypes) {
      for (const transaction of transactions) {
        events.add(classifyStorea({ notificationType, subtype }, transaction).event);
      }
    }
  }
  const base = { version: "1.0", packageName: PACKAGE, eventTimeMillis: "1" };
  for (let type = 0; type <= 30; type++) {
    events.add(
      classifyStoreb({
        ...base,
        subscriptionNotification: { notificationType: type, purchaseToken: "t" },
      }).event,
    );
    events.add(
      classifyStoreb({
        ...base,
        oneTimeProductNotification: { notificationType: type, purchaseToken: "t", sku: "s" },
      }).event,
    );
  }
  events.add(classifyStoreb({ ...base, voidedPurchaseNotification: { refundType: 1 } }).event);
  events.add(classifyStoreb({ ...base, testNotification: { version: "1.0" } }).event);
  events.add(classifyStoreb(base).event);
  return events;
}

/** The names in the "Unified events" table of docs/events.md. */
async function eventsDocumented(): Promise<Set<string>> {
  const text = await Deno.readTextFile(new URL("../docs/events.md", import.meta.url));
  const section = text.split("## Unified events")[1].split("\n## ")[0];
  const names = [...section.matchAll(/^\| `([a-z_.]+)`/gm)].map((m) => m[1]);
  return new Set(names.slice(1)); // the first is the header row
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// ---- the document on its own ----

Deno.test("openapi.yaml is OpenAPI 3.1 and describes exactly the service's endpoints", async (t) => {
  await t.step("top level", () => {
    assert.match(DOC.openapi, /^3\.1\.\d+$/);
    const allowed = `openapi info jsonSchemaDialect servers paths webhooks components security tags
      externalDocs`.split(/\s+/);
    for (const key of Object.keys(DOC)) {
      assert.ok(allowed.includes(key) || key.startsWith("x-"), `unknown top-level key ${key}`);
    }
    assert.equal(typeof DOC.info.title, "string");
    assert.equal(typeof DOC.info.version, "string");
    for (const server of DOC.servers) {
      const url = server.url.replace(
        /\{(\w+)\}/g,
        (_: string, name: string) => server.variables[name].default,
      );
      assert.match(url, /^https?:\/\/[^/]+$/, server.url);
    }
  });

  await t.step("every route of the router, and nothing else", () => {
    assert.deepEqual(
      [...documentedOperations().keys()].sort(),
      [...routerOperations()].sort(),
    );
  });

  await t.step("every $ref resolves, and every schema compiles in strict mode", () => {
    const refs = refsIn(DOC);
    assert.ok(refs.length > 50);
    for (const [ref, at] of refs) assert.doesNotThrow(() => pointer(ref), `${ref} at ${at}`);
    for (const name of Object.keys(DOC.components.schemas)) {
      assert.doesNotThrow(() => schemaErrors(component(name), {}, "document"), name);
      assert.doesNotThrow(() => schemaErrors(component(name), {}, "strict"), name);
    }
  });

  await t.step("operations: ids, tags, parameters, security, responses, headers", () => {
    const ids = new Set<string>();
    const tags = new Set(DOC.tags.map((tag: Node) => tag.name));
    const schemes = DOC.components.securitySchemes;
    const all = [...documentedOperations(), ["webhook", DOC.webhooks.purchaseEvent.post]];
    for (const [key, op] of all as [string, Node][]) {
      assert.equal(typeof op.operationId, "string", key);
      assert.ok(!ids.has(op.operationId), `duplicate operationId ${op.operationId}`);
      ids.add(op.operationId);
      assert.equal(typeof op.summary, "string", key);
      for (const tag of op.tags ?? []) assert.ok(tags.has(tag), `${key}: undeclared tag ${tag}`);
      for (const requirement of op.security ?? []) {
        for (const name of Object.keys(requirement)) assert.ok(schemes[name], `${key}: ${name}`);
      }
      const parameters = (op.parameters ?? []).map(deref);
      for (const parameter of parameters) {
        assert.ok(parameter.name && parameter.in && parameter.schema, `${key}: ${parameter.name}`);
      }
      for (const [, name] of key.matchAll(/\{(\w+)\}/g)) {
        const declared = parameters.find((p: Node) => p.in === "path" && p.name === name);
        assert.ok(declared?.required === true, `${key}: path parameter ${name}`);
      }
      assert.ok(Object.keys(op.responses).length > 0, key);
      for (const [status, response] of Object.entries<Node>(op.responses)) {
        assert.equal(typeof deref(response).description, "string", `${key} ${status}`);
        if (key === "webhook") continue;
        const headers = deref(response).headers ?? {};
        for (const name of ["X-Request-Id", "X-Service-Version"]) {
          assert.equal(deref(headers[name])?.required, true, `${key} ${status}: ${name}`);
        }
      }
    }
    assert.equal(schemes.apiKey.type, "http");
    assert.equal(schemes.apiKey.scheme, "bearer");
    assert.equal(schemes.storebPushToken.type, "openIdConnect");
    const security = (key: string) => JSON.stringify(operation(key).security);
    for (const key of API_KEY_OPERATIONS) assert.equal(security(key), '[{"apiKey":[]}]', key);
    assert.equal(security("POST /v1/webhooks/storeb/{tenantId}"), '[{"storebPushToken":[]}]');
    assert.equal(security("POST /v1/webhooks/storea/{tenantId}"), "[]");
    assert.equal(security("GET /health"), "[]");
    assert.equal(security("GET /ready"), "[]");
    assert.equal(DOC.security, undefined, "no default security: each operation says its own");
  });

  await t.step("statuses and error codes of every operation are the documented ones", () => {
    assert.deepEqual(
      [...DOC.components.schemas.ErrorCode.enum].sort(),
      Object.keys(ERROR_STATUS).sort(),
    );
    for (const [key, expected] of Object.entries(SPEC_CODES)) {
      const responses = operation(key).responses;
      assert.deepEqual(Object.keys(responses).sort(), Object.keys(expected).sort(), key);
      for (const [status, codes] of Object.entries(expected)) {
        assert.deepEqual(
          [...documentedCodes(responses[status])].sort(),
          [...codes].sort(),
          `${key} ${status}`,
        );
        if (status !== "200") {
          for (const code of codes) {
            assert.equal(ERROR_STATUS[code as keyof typeof ERROR_STATUS], Number(status), code);
          }
        }
      }
    }
    const retryAfter = deref(operation("POST /v1/storea/verify").responses["429"]).headers;
    assert.ok(retryAfter["Retry-After"], "429 documents Retry-After");
  });

  await t.step("body limits are the service's", () => {
    const limit = (key: string) => operation(key).requestBody["x-max-body-bytes"];
    for (const key of API_KEY_OPERATIONS) assert.equal(limit(key), VERIFY_BODY_LIMIT, key);
    assert.equal(limit("POST /v1/webhooks/storea/{tenantId}"), RECEIVER_BODY_LIMIT);
    assert.equal(limit("POST /v1/webhooks/storeb/{tenantId}"), RECEIVER_BODY_LIMIT);
  });

  await t.step("the outbound delivery: headers, payload keys, event names", async () => {
    const hook = DOC.webhooks.purchaseEvent.post;
    assert.deepEqual(hook.parameters.map((p: Node) => [p.name, p.in, p.required]), [
      ["X-Service-Event", "header", true],
      ["X-Service-Event-Id", "header", true],
      ["X-Service-Timestamp", "header", true],
      ["X-Service-Signature", "header", true],
      ["X-Service-Version", "header", true],
      ["User-Agent", "header", true],
    ]);
    assert.deepEqual(Object.keys(hook.responses), ["2XX", "default"]);
    const payload = DOC.components.schemas.DeliveryPayload;
    // stateError, the one optional key, comes last.
    assert.deepEqual(Object.keys(payload.properties), [...DELIVERY_KEYS, "stateError"]);
    assert.deepEqual(payload.required, DELIVERY_KEYS);
    const names = new Set<string>(DOC.components.schemas.EventName.examples);
    assert.equal(names.size, DOC.components.schemas.EventName.examples.length);
    assert.deepEqual([...names].sort(), [...catalogEvents()].sort());
    assert.deepEqual([...names].sort(), [...await eventsDocumented()].sort());
  });

  await t.step("the document's own examples validate, in both views", () => {
    let count = 0;
    /** An example must match its schema as written, and carry no undocumented field either. */
    const check = (schema: Node, value: unknown, where: string) => {
      assertValid(schema, value, where, "document");
      assertValid(schema, value, where, "strict");
      count++;
    };
    const media = (content: Node, where: string) => {
      for (const [type, entry] of Object.entries<Node>(content ?? {})) {
        if ("example" in entry) check(entry.schema, entry.example, `${where} ${type} example`);
        for (const [name, example] of Object.entries<Node>(entry.examples ?? {})) {
          check(entry.schema, deref(example).value, `${where} ${type} ${name}`);
        }
      }
    };
    const all = [...documentedOperations(), ["webhook", DOC.webhooks.purchaseEvent.post]];
    for (const [key, op] of all as [string, Node][]) {
      media(op.requestBody?.content, `${key} request`);
      for (const parameter of (op.parameters ?? []).map(deref)) {
        if ("example" in parameter) check(parameter.schema, parameter.example, key);
      }
      for (const [status, response] of Object.entries<Node>(op.responses)) {
        media(deref(response).content, `${key} ${status}`);
      }
    }
    for (const [name, response] of Object.entries<Node>(DOC.components.responses)) {
      media(response.content, name);
    }
    // The schemas' own `examples` (JSON Schema's keyword), at any depth.
    const schemaExamples = (node: Node, at: string) => {
      if (node === null || typeof node !== "object") return;
      if (Array.isArray(node.examples)) {
        for (const example of node.examples) check(node, example, at);
      }
      for (const [key, value] of Object.entries<Node>(node)) {
        if (key !== "examples" && key !== "enum") schemaExamples(value, `${at}/${key}`);
      }
    };
    schemaExamples(DOC.components.schemas, "#/components/schemas");
    assert.ok(count >= 50, `${count} examples`);
  });

  await t.step("success shapes list every field as required, and are open to new ones", () => {
    const schemas = DOC.components.schemas;
    // Fields present only in some answers: `draining` while a process shuts down,
    // `encryptionKey` during a rotation of the encryption key, `acknowledged` and
    // `acknowledgeError` when a store B verify asked for `acknowledge: true`.
    const optional: Record<string, string[]> = {
      ReadyOk: ["encryptionKey"],
      ReadyDegraded: ["draining", "encryptionKey"],
      StorebVerifySuccess: ["acknowledged", "acknowledgeError"],
      DeliveryPayload: ["stateError"],
    };
    for (
      const name of [
        "StoreaVerifySuccess",
        "StoreaTransaction",
        "StorebVerifySuccess",
        "StorebSubscriptionPurchase",
        "StorebProductPurchase",
        "StoreaSubscriptionsSuccess",
        "StoreaSubscription",
        "StoreaRenewal",
        "StoreaHistorySuccess",
        "StoreaConsumptionSuccess",
        "StorebAcknowledgeSuccess",
        "StorebConsumeSuccess",
        "StorebAcknowledgeError",
        "DomainFailure",
        "WebhookReceipt",
        "Health",
        "ReadyOk",
        "ReadyDegraded",
        "DeliveryPayload",
        "StoreaDeliveryState",
        "StorebDeliveryState",
        "DeliverySubject",
      ]
    ) {
      assert.equal(schemas[name].additionalProperties, undefined, name);
      assert.deepEqual(
        [...schemas[name].required].sort(),
        Object.keys(schemas[name].properties).filter((f) => !optional[name]?.includes(f)).sort(),
        name,
      );
    }
    assert.equal(schemas.ErrorEnvelope.additionalProperties, undefined);
    assert.deepEqual(schemas.ErrorEnvelope.required, ["valid", "error", "message"]);
  });

  await t.step("the validator is not vacuous: wrong bodies are refused", () => {
    const storeaOk = operation("POST /v1/storea/verify").responses["200"].content[
      "application/json"
    ];
    const success = structuredClone(storeaOk.examples.valid.value);
    assertValid(storeaOk.schema, success, "the example");
    const withoutPrice = structuredClone(success);
    delete withoutPrice.transaction.price;
    assertInvalid(storeaOk.schema, withoutPrice, "a transaction without price");
    assertInvalid(storeaOk.schema, { ...success, extra: 1 }, "an undocumented field");
    assertValid(storeaOk.schema, { ...success, extra: 1 }, "a new field", "document");
    const transaction = { ...success.transaction, extra: 1 };
    assertInvalid(storeaOk.schema, { ...success, transaction }, "an undocumented nested field");
    assertValid(storeaOk.schema, { ...success, transaction }, "a new nested field", "document");
    assertInvalid(storeaOk.schema, { ...success, valid: false }, "valid: false with a result");
    assertInvalid(storeaOk.schema, { valid: true }, "a bare valid: true");
    assertInvalid(
      storeaOk.schema,
      { ...success, transaction: { ...success.transaction, purchaseDate: "yesterday" } },
      "a date that is not a date-time",
    );
    assertInvalid(
      storeaOk.schema,
      { valid: false, version: "dev", error: "PURCHASE_NOT_FOUND", message: "m" },
      "a store B domain code on store A",
    );
    const storebOk = operation("POST /v1/storeb/verify").responses["200"].content[
      "application/json"
    ];
    const subscription = structuredClone(storebOk.examples.subscription.value);
    assertValid(storebOk.schema, subscription, "the example");
    subscription.purchase.kind = "storeb#productPurchase";
    assertInvalid(storebOk.schema, subscription, "a subscription labelled a product");
    assertInvalid(component("ErrorEnvelope"), {
      valid: false,
      error: "NOPE",
      message: "m",
    }, "an unknown code");
    assertInvalid(component("RateLimitedError"), {
      valid: false,
      error: "RATE_LIMITED",
      message: "m",
      details: { retryAfterSeconds: 0 },
    }, "a zero retryAfterSeconds");
    assertInvalid(component("RateLimitedError"), {
      valid: false,
      error: "RATE_LIMITED",
      message: "m",
    }, "RATE_LIMITED without details");
    assertInvalid(component("AppleApiError"), {
      valid: false,
      error: "APPLE_API_ERROR",
      message: "m",
    }, "APPLE_API_ERROR without details");
    assertInvalid(component("Health"), { status: "ok" }, "health without version");
    assertInvalid(component("RequestId"), "req_123", "a request id that is no ULID");
    const delivery = DOC.webhooks.purchaseEvent.post.requestBody.content["application/json"];
    const renewal = structuredClone(delivery.examples.storebRenewal.value);
    assertValid(delivery.schema, renewal, "the example");
    assertInvalid(delivery.schema, { ...renewal, event: "subscription.renewd" }, "a typo event");
    assertValid(delivery.schema, { ...renewal, event: "refund.new" }, "a new event", "document");
    assertInvalid(delivery.schema, { ...renewal, extra: 1 }, "an undocumented payload field");
    assertValid(delivery.schema, { ...renewal, extra: 1 }, "a new payload field", "document");
    const test = structuredClone(delivery.examples.testDelivery.value);
    assertInvalid(delivery.schema, { ...test, data: { message: "m", extra: 1 } }, "test data");
    assertInvalid(delivery.schema, { ...test, event: "refund.issued" }, "a test of another event");
    assertInvalid(delivery.schema, { ...renewal, subject: { key: "k" } }, "a partial subject");
    assertInvalid(delivery.schema, { ...renewal, raw: {} }, "a store B raw without message");
    const { reason: _, ...withoutReason } = renewal;
    assertInvalid(delivery.schema, withoutReason, "a payload without reason");
  });
});

// ---- the document in the tools integrators use ----

/** Every schema node reachable from `root`, through properties, branches and component `$ref`s. */
function reachableSchemas(
  root: Node,
  at: string,
  found = new Map<Node, string>(),
): Map<Node, string> {
  if (root === null || typeof root !== "object" || found.has(root)) return found;
  found.set(root, at);
  for (const [key, value] of Object.entries<Node>(root)) {
    if (key === "$ref" && value.startsWith("#/components/schemas/")) {
      reachableSchemas(pointer(value), value, found);
    } else if (!["enum", "const", "examples", "default"].includes(key)) {
      reachableSchemas(value, `${at}/${key}`, found);
    }
  }
  return found;
}

/** Runs `deno` with `args` in the repository; its exit code and standard output. */
async function deno(args: string[], stdin?: string): Promise<{ code: number; stdout: string }> {
  const child = new Deno.Command(Deno.execPath(), {
    args,
    cwd: new URL("../", import.meta.url),
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(stdin));
    await writer.close();
  }
  const { code, stdout, stderr } = await child.output();
  const text = new TextDecoder().decode(stdout);
  assert.ok(code === 0 || text !== "", new TextDecoder().decode(stderr));
  return { code, stdout: text };
}

Deno.test("openapi.yaml works in the usual tools", async (t) => {
  await t.step("js-yaml (strict YAML 1.2, as swagger-parser and Redocly) and yaml agree", () => {
    assert.deepEqual(DOC, parse(DOC_TEXT));
  });

  await t.step("deno fmt's output of it still parses, to the same document", async () => {
    const { code, stdout } = await deno(["fmt", "--ext=yaml", "-"], DOC_TEXT);
    assert.equal(code, 0);
    assert.deepEqual(readDocument(stdout), DOC);
  });

  await t.step("it validates as OpenAPI 3.1, in two validators", async () => {
    const validator = new Validator();
    const result = await validator.validate(structuredClone(DOC));
    assert.equal(validator.version, "3.1");
    assert.ok(result.valid, JSON.stringify(result.errors, null, 2));
    // swagger-parser, behind many tools, with its own (older) copy of the 3.1 schema.
    const parsed = await SwaggerParser.validate(structuredClone(DOC));
    assert.equal((parsed as Node).openapi, DOC.openapi);
  });

  await t.step("redocly lint, recommended rules: no problem but those ignored", async () => {
    // `deno task lint:openapi` (redocly.yaml); Redocly runs offline, its telemetry off.
    const { stdout } = await deno(["task", "lint:openapi", "--format=json"]);
    const report = JSON.parse(stdout);
    const problems = report.problems.map((problem: Node) =>
      `${problem.ruleId}: ${problem.message} at ${problem.location?.[0]?.pointer}`
    );
    assert.deepEqual(problems, []);
    assert.deepEqual([report.totals.errors, report.totals.warnings], [0, 0]);
    // Every exception of .redocly.lint-ignore.yaml still applies: none is left over.
    const ignore = load(
      await Deno.readTextFile(new URL("../.redocly.lint-ignore.yaml", import.meta.url)),
    ) as Record<string, Record<string, string[]>>;
    const exceptions = Object.values(ignore).flatMap((rules) => Object.values(rules).flat());
    assert.equal(report.totals.ignored, exceptions.length);
  });

  await t.step("answers and deliveries are open to new fields and event names", async () => {
    const roots = new Map<string, Node>();
    for (const [key, op] of documentedOperations()) {
      for (const [status, response] of Object.entries<Node>(op.responses)) {
        for (const [type, media] of Object.entries<Node>(deref(response).content ?? {})) {
          roots.set(`${key} ${status} ${type}`, media.schema);
        }
      }
    }
    const hook = DOC.webhooks.purchaseEvent.post;
    roots.set("delivery", hook.requestBody.content["application/json"].schema);
    for (const parameter of hook.parameters) roots.set(`delivery ${parameter.name}`, parameter);
    let count = 0;
    for (const [where, root] of roots) {
      for (const [node, at] of reachableSchemas(root, where)) {
        count++;
        assert.notEqual(node.additionalProperties, false, `${at} is closed`);
        assert.notEqual(node.unevaluatedProperties, false, `${at} is closed`);
        for (const [name, property] of Object.entries<Node>(node.properties ?? {})) {
          assert.notEqual(property, false, `${at}: ${name} may never be sent`);
        }
      }
    }
    assert.ok(count > 100, `${count} schemas`);
    const eventName = DOC.components.schemas.EventName;
    assert.equal(eventName.type, "string");
    for (const key of ["enum", "const", "pattern", "anyOf", "oneOf"]) {
      assert.ok(!(key in eventName), `EventName has ${key}: a new event would not validate`);
    }
    assert.equal(
      DOC.components.schemas.DeliveryPayload.properties.event.$ref,
      component("EventName").$ref,
    );
    const eventHeader = hook.parameters.find((p: Node) => p.name === "X-Service-Event");
    assert.equal(eventHeader.schema.$ref, component("EventName").$ref);
    // The document cites the policy that makes them open, and the policy is there.
    assert.match(DOC.info.description, /`docs\/integration\.md`, section "Compatibility"/);
    const guide = await Deno.readTextFile(new URL("../docs/integration.md", import.meta.url));
    assert.match(guide, /^## Compatibility$/m);
    // Requests stay closed: the verify endpoints refuse an unknown field (checked against the
    // service below), and the document says so.
    for (const key of ["POST /v1/storea/verify", "POST /v1/storeb/verify"]) {
      const request = pointer(operation(key).requestBody.content["application/json"].schema.$ref);
      assert.equal(request.additionalProperties, false, key);
    }
  });
});

// ---- the document against the real service ----

Deno.test("openapi.yaml describes the real service's answers and deliveries", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "pr-openapi-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: BUNDLE_ID });
  const storeaApi = await startStoreaApiSimulator({ signer });
  const play = await startStorebSimulator();
  const issuer = await startPushTokenIssuer();
  const receiver = await startCallbackReceiver();
  let service: RunningService | undefined;
  try {
    const keyFile = await writeStoreaKeyFile(dir);
    await storeaApi.addKey({
      issuerId: TEST_ISSUER_ID,
      keyId: "ABC123DEFG",
      bundleId: BUNDLE_ID,
      privateKeyPem: await Deno.readTextFile(keyFile),
    });
    const account = await createServiceAccount();
    await play.addServiceAccount(account);
    const accountFile = join(dir, "service-account.json");
    await Deno.writeTextFile(accountFile, account.json);
    service = await startService({
      env: {
        ...storeaApi.serviceEnv,
        ...play.serviceEnv,
        ...issuer.serviceEnv,
        STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
        UPSTREAM_TIMEOUT: "3s",
        RATE_LIMIT_BURST: "40",
        RATE_LIMIT_PER_SECOND: "1",
        DELIVERY_RETRY_SCHEDULE: "1s,1s",
        DELIVERY_TIMEOUT: "2s",
      },
    });
    const running = service;
    const url = running.url;

    /** A tenant with a callback URL, an API key and one store's credentials. */
    const storeTenant = async (credentials: (tenantId: string) => string[]) => {
      const { tenantId, secret } = await createTenantWithCallback(running, receiver.url);
      const key = await cliOk(running, "key", "create", tenantId, "--env", "test");
      await cliOk(running, ...credentials(tenantId));
      return { tenantId, secret: secret!, key: key.key as string };
    };
    const [a, b, bare] = await Promise.all([
      storeTenant((id) => storeaCredentialArgs(id, keyFile)),
      storeTenant((id) => storebCredentialArgs(id, accountFile, PUSH_ACCOUNT)),
      createTenantWithKey(running), // no store credentials
    ]);
    receiver.setSecrets([a.secret, b.secret]);

    const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
      send(`${url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: typeof body === "string" || body instanceof Uint8Array
          ? body as BodyInit
          : JSON.stringify(body),
      });
    const STOREA_VERIFY = "POST /v1/storea/verify";
    const STOREB_VERIFY = "POST /v1/storeb/verify";
    const STOREA_HOOK = "POST /v1/webhooks/storea/{tenantId}";
    const STOREB_HOOK = "POST /v1/webhooks/storeb/{tenantId}";
    const verifyA = async (body: unknown, key = a.key) =>
      checked(
        STOREA_VERIFY,
        await post("/v1/storea/verify", body, { authorization: `Bearer ${key}` }),
      );
    const verifyB = async (body: unknown, key = b.key) =>
      checked(
        STOREB_VERIFY,
        await post("/v1/storeb/verify", body, { authorization: `Bearer ${key}` }),
      );
    const notifyA = async (body: unknown, tenantId = a.tenantId) =>
      checked(STOREA_HOOK, await post(`/v1/webhooks/storea/${tenantId}`, body));
    const mint = (audience = AUDIENCE) => issuer.mint({ audience, email: PUSH_ACCOUNT });
    const notifyB = async (
      body: unknown,
      options: { tenantId?: string; authorization?: string | null } = {},
    ) => {
      const authorization = options.authorization === undefined
        ? `Bearer ${await mint()}`
        : options.authorization;
      return checked(
        STOREB_HOOK,
        await post(
          `/v1/webhooks/storeb/${options.tenantId ?? b.tenantId}`,
          body,
          authorization === null ? {} : { authorization },
        ),
      );
    };
    const signedNotification = async (
      options: Parameters<StoreaSigner["notificationPayload"]>[0],
    ) => ({
      signedPayload: await signer.signNotification(await signer.notificationPayload(options)),
    });
    const bSubscription = (purchase = sampleSubscriptionPurchase()) => {
      const purchaseToken = `ptok-${crypto.randomUUID()}`;
      play.addSubscription({ packageName: PACKAGE, purchaseToken, purchase });
      return { packageName: PACKAGE, productId: "monthly", purchaseToken, type: "subscription" };
    };
    let expectedDeliveries = 0;

    await t.step("health and readiness", async () => {
      const health = checked("GET /health", await send(`${url}/health`));
      assert.deepEqual(health.json, { status: "ok", version: "dev" });
      const ready = checked("GET /ready", await send(`${url}/ready`));
      assert.equal(ready.status, 200);
    });

    await t.step("unknown paths and methods answer the documented envelope", async () => {
      for (
        const [answer, code] of [
          [await send(`${url}/v2/nothing`), "NOT_FOUND"],
          [await send(`${url}/v1/storea/verify`), "METHOD_NOT_ALLOWED"],
          [await send(`${url}/health`, { method: "POST" }), "METHOD_NOT_ALLOWED"],
        ] as [Answer, string][]
      ) {
        const response = {
          headers: DOC.components.headers,
          content: { "application/json": { schema: component("ErrorEnvelope") } },
        };
        checkResponse(response, answer, code);
        assert.equal(answer.json.error, code);
        assert.equal(answer.status, ERROR_STATUS[code as keyof typeof ERROR_STATUS]);
        if (code === "METHOD_NOT_ALLOWED") assert.ok(answer.headers.get("allow"));
      }
    });

    await t.step("store A verify: success shapes and domain failures", async () => {
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({
          transactionId: "2000000000000101",
          type: "Auto-Renewable Subscription",
          appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
          offerType: 1,
          offerIdentifier: "intro",
        }),
      );
      const full = await verifyA({ transactionId: "2000000000000101" });
      assert.equal(full.json.valid, true);
      assert.equal(full.json.transaction.offerType, 1);
      // Every optional field left out by the store: nulls where the document allows them.
      await storeaApi.addTransaction(
        "sandbox",
        signer.sampleTransaction({
          transactionId: "2000000000000102",
          type: "Consumable",
          expiresDate: undefined,
          webOrderLineItemId: undefined,
          appAccountToken: undefined,
          storefront: undefined,
          storefrontId: undefined,
          transactionReason: undefined,
          price: undefined,
          currency: undefined,
        }),
      );
      const sparse = await verifyA({ transactionId: "2000000000000102" });
      assert.equal(sparse.json.environment, "sandbox");
      assert.equal(sparse.json.appUserId, null);
      assert.equal(sparse.json.transaction.price, null);

      const notFound = await verifyA({ transactionId: "2000000000000103" });
      assert.equal(notFound.json.error, "TRANSACTION_NOT_FOUND");
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({ transactionId: "2000000000000104", bundleId: "com.other.app" }),
      );
      const mismatch = await verifyA({ transactionId: "2000000000000104" });
      assert.equal(mismatch.json.error, "BUNDLE_ID_MISMATCH");
    });

    await t.step("store A verify: upstream failures", async () => {
      storeaApi.script("production", { status: 400, body: STOREA_API_ERRORS.invalidTransactionId });
      const failed = await verifyA({ transactionId: "2000000000000105" });
      assert.equal(failed.status, 502);
      assert.deepEqual(failed.json.details, { status: 400, upstreamCode: 4000006 });
      storeaApi.script("production", storeaRateLimitedAnswer({ retryAt: Date.now() + 20_000 }));
      const limited = await verifyA({ transactionId: "2000000000000106" });
      assert.equal(limited.status, 429);
      assert.ok(limited.headers.get("retry-after"));
      assert.equal(
        Number(limited.headers.get("retry-after")),
        limited.json.details.retryAfterSeconds,
      );
    });

    await t.step("store B verify: subscription and product shapes, domain failures", async () => {
      const subscription = await verifyB(bSubscription());
      assert.equal(subscription.json.purchase.kind, "storeb#subscriptionPurchaseV2");
      // A prepaid plan has no recurring price: nulls where the document allows them.
      const prepaid = sampleSubscriptionPurchase({ regionCode: "DE" });
      prepaid.lineItems = [{ productId: "pass_30d", expiryTime: new Date().toISOString() }];
      delete prepaid.latestOrderId;
      const sparse = await verifyB(bSubscription(prepaid));
      assert.equal(sparse.json.purchase.priceAmountMicros, null);
      assert.equal(sparse.json.purchase.autoRenewing, false);

      const purchaseToken = `ptok-${crypto.randomUUID()}`;
      play.addProduct({
        packageName: PACKAGE,
        productId: "coins_100",
        purchaseToken,
        purchase: sampleProductPurchase(),
      });
      const product = await verifyB({
        packageName: PACKAGE,
        productId: "coins_100",
        purchaseToken,
        type: "product",
      });
      assert.equal(product.json.purchase.kind, "storeb#productPurchase");

      const notFound = await verifyB({ ...bSubscription(), purchaseToken: "ptok-unknown" });
      assert.equal(notFound.json.error, "PURCHASE_NOT_FOUND");
      const mismatch = await verifyB({ ...bSubscription(), packageName: "com.other.app" });
      assert.equal(mismatch.json.error, "PACKAGE_NAME_MISMATCH");
    });

    await t.step("store B verify: upstream failures", async () => {
      play.script({ status: 403 });
      const failed = await verifyB(bSubscription());
      assert.equal(failed.status, 502);
      assert.deepEqual(failed.json.details, { status: 403, upstreamCode: "PERMISSION_DENIED" });
      play.script({ status: 429, headers: { "retry-after": "17" } });
      const hinted = await verifyB(bSubscription());
      assert.equal(hinted.status, 429);
      assert.equal(hinted.headers.get("retry-after"), "17");
      play.script({ status: 429 });
      const unhinted = await verifyB(bSubscription());
      assert.equal(unhinted.status, 429);
      assert.equal(unhinted.headers.get("retry-after"), "60", "the default wait");
      play.clearScripts();
    });

    await t.step(
      "store B actions: every documented answer of acknowledge and consume",
      async () => {
        // A tenant of its own, so these calls do not spend b's bucket.
        const c = await storeTenant((id) => storebCredentialArgs(id, accountFile, PUSH_ACCOUNT));
        const auth: Record<string, string> = { authorization: `Bearer ${c.key}` };
        const ACK = "POST /v1/storeb/acknowledge";
        const CONSUME = "POST /v1/storeb/consume";
        const ack = async (body: unknown, headers = auth) =>
          checked(ACK, await post("/v1/storeb/acknowledge", body, headers));
        const consume = async (body: unknown, headers = auth) =>
          checked(CONSUME, await post("/v1/storeb/consume", body, headers));
        const product = (overrides = {}) => {
          const purchaseToken = `ptok-${crypto.randomUUID()}`;
          play.addProduct({
            packageName: PACKAGE,
            productId: "coins_100",
            purchaseToken,
            purchase: sampleProductPurchase({
              acknowledgementState: 0,
              ...overrides,
            }),
          });
          return { packageName: PACKAGE, productId: "coins_100", purchaseToken };
        };
        const subscriptionToken = `ptok-${crypto.randomUUID()}`;
        play.addSubscription({
          packageName: PACKAGE,
          purchaseToken: subscriptionToken,
          purchase: sampleSubscriptionPurchase({
            acknowledgementState: "ACKNOWLEDGEMENT_STATE_PENDING",
          }),
        });
        const subscription = {
          packageName: PACKAGE,
          productId: "premium_monthly",
          purchaseToken: subscriptionToken,
          type: "subscription",
        };

        assert.equal((await ack(subscription)).json.alreadyAcknowledged, false);
        assert.equal((await ack(subscription)).json.alreadyAcknowledged, true);
        assert.equal((await consume(product())).json.alreadyConsumed, false);
        const pending = product({ purchaseState: 2 });
        assert.equal(
          (await ack({ ...pending, type: "product" })).json.error,
          "PURCHASE_PENDING",
        );
        assert.equal((await consume(pending)).json.error, "PURCHASE_PENDING");
        const unknown = {
          packageName: PACKAGE,
          productId: "coins_100",
          purchaseToken: "ptok-none",
        };
        assert.equal(
          (await ack({ ...unknown, type: "product" })).json.error,
          "PURCHASE_NOT_FOUND",
        );
        assert.equal((await consume(unknown)).json.error, "PURCHASE_NOT_FOUND");
        const other = { ...product(), packageName: "com.other.app" };
        assert.equal(
          (await ack({ ...other, type: "product" })).json.error,
          "PACKAGE_NAME_MISMATCH",
        );
        assert.equal((await consume(other)).json.error, "PACKAGE_NAME_MISMATCH");

        for (const send of [ack, consume]) {
          for (
            const headers of [{}, { authorization: "Bearer nope" }] as Record<
              string,
              string
            >[]
          ) {
            assert.equal((await send({}, headers)).json.error, "UNAUTHENTICATED");
          }
          assert.equal((await send({ nope: true })).json.error, "INVALID_REQUEST");
          const missing = await send(
            { ...product(), type: "product" },
            { authorization: `Bearer ${bare.key}` },
          );
          assert.ok(
            ["CREDENTIALS_MISSING", "INVALID_REQUEST"].includes(missing.json.error),
          );
          play.script({ status: 429, headers: { "retry-after": "17" } });
          const limited = await send({
            ...product(),
            ...(send === ack ? { type: "product" } : {}),
          });
          assert.equal(limited.json.error, "RATE_LIMITED");
          play.script({ status: 403 });
          const failed = await send({
            ...product(),
            ...(send === ack ? { type: "product" } : {}),
          });
          assert.deepEqual(failed.json.details, {
            status: 403,
            upstreamCode: "PERMISSION_DENIED",
          });
        }
        // CREDENTIALS_MISSING for consume needs a body without `type`.
        const bareConsume = await consume(product(), {
          authorization: `Bearer ${bare.key}`,
        });
        assert.equal(bareConsume.json.error, "CREDENTIALS_MISSING");
        play.clearScripts();

        // Verify with acknowledge: true, in both outcomes.
        const paid = product();
        const verified = await verifyB({
          ...paid,
          type: "product",
          acknowledge: true,
        }, c.key);
        assert.equal(verified.json.acknowledged, true);
        play.script({ operation: "acknowledge", status: 503, times: 2 });
        const failing = await verifyB({
          ...product(),
          type: "product",
          acknowledge: true,
        }, c.key);
        play.clearScripts();
        assert.equal(failing.json.acknowledged, false);
        assert.equal(failing.json.acknowledgeError.error, "GOOGLE_API_ERROR");
      },
    );

    await t.step("store A lookups and actions: every documented answer", async () => {
      // A tenant of its own, so these calls do not spend a's bucket.
      const d = await storeTenant((id) => storeaCredentialArgs(id, keyFile));
      const auth: Record<string, string> = { authorization: `Bearer ${d.key}` };
      const S = "POST /v1/storea/subscriptions";
      const H = "POST /v1/storea/history";
      const C = "POST /v1/storea/consumption";
      const call = async (key: string, body: unknown, headers = auth) =>
        checked(key, await post(key.slice("POST ".length), body, headers));

      // A customer with a subscription in its grace period, one in another group that Apple
      // sends no renewal info for, and a consumable; and a transaction of another app.
      const sub = signer.sampleTransaction({
        transactionId: "2000000000000301",
        appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
      });
      await storeaApi.addTransaction("production", sub);
      await storeaApi.setSubscriptionState("production", sub.originalTransactionId, { status: 4 });
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({
          transactionId: "2000000000000302",
          originalTransactionId: "2000000000000303",
          subscriptionGroupIdentifier: "21000002",
          purchaseDate: Date.now() - 86_400_000,
        }),
        { customer: sub.originalTransactionId },
      );
      await storeaApi.setSubscriptionState("production", "2000000000000303", {
        status: 5,
        renewalInfo: null,
      });
      const coins = "2000000000000304";
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({ transactionId: coins, type: "Consumable" }),
        { customer: sub.originalTransactionId },
      );
      const foreign = "2000000000000305";
      await storeaApi.addTransaction(
        "production",
        signer.sampleTransaction({ transactionId: foreign, bundleId: "com.other.app" }),
      );
      const unknown = "2000000000000399";

      const statuses = await call(S, { transactionId: coins });
      assert.equal(statuses.json.valid, true, statuses.text);
      assert.deepEqual(
        statuses.json.subscriptions.map((s: Node) => [s.statusName, s.renewal === null]).sort(),
        [["grace_period", false], ["revoked", true]],
      );
      assert.equal(statuses.json.appUserId, "7e3fb20b-4cdb-47cc-936d-99d65f608138");
      assert.equal((await call(S, { transactionId: unknown })).json.error, "TRANSACTION_NOT_FOUND");
      assert.equal((await call(S, { transactionId: foreign })).json.error, "BUNDLE_ID_MISMATCH");

      const page = await call(H, {
        transactionId: sub.transactionId,
        sort: "descending",
        startDate: "2020-01-01T00:00:00Z",
        productTypes: ["AUTO_RENEWABLE", "CONSUMABLE"],
      });
      assert.equal(page.json.transactions.length, 3, page.text);
      assert.equal(page.json.hasMore, false);
      const stale = await call(H, { transactionId: sub.transactionId, revision: "bad" });
      assert.equal(stale.status, 400);
      assert.deepEqual(stale.json.details, { upstreamCode: 4000005 });
      assert.equal((await call(H, { transactionId: unknown })).json.error, "TRANSACTION_NOT_FOUND");
      assert.equal((await call(H, { transactionId: foreign })).json.error, "BUNDLE_ID_MISMATCH");

      const consent = {
        customerConsented: true,
        sampleContentProvided: true,
        deliveryStatus: "DELIVERED",
      };
      const sent = await call(C, { transactionId: coins, ...consent, consumptionPercentage: 1000 });
      assert.deepEqual(
        [sent.json.valid, sent.json.sent, sent.json.transactionId],
        [true, true, coins],
      );
      // Apple's 400 for a percentage on an auto-renewable subscription.
      const refused = await call(C, {
        transactionId: sub.transactionId,
        ...consent,
        consumptionPercentage: 1000,
      });
      assert.equal(refused.status, 400);
      assert.deepEqual(refused.json.details, { upstreamCode: 4000209 });
      const missing = await call(C, { transactionId: unknown, ...consent });
      assert.equal(missing.json.error, "TRANSACTION_NOT_FOUND");

      const bodies: Record<string, unknown> = {
        [S]: { transactionId: sub.transactionId },
        [H]: { transactionId: sub.transactionId },
        [C]: { transactionId: coins, ...consent },
      };
      for (const key of [S, H, C]) {
        for (
          const headers of [{}, { authorization: "Bearer nope" }] as Record<string, string>[]
        ) {
          assert.equal((await call(key, bodies[key], headers)).json.error, "UNAUTHENTICATED");
        }
        assert.equal((await call(key, { nope: true })).json.error, "INVALID_REQUEST");
        const bareAnswer = await call(key, bodies[key], { authorization: `Bearer ${bare.key}` });
        assert.equal(bareAnswer.json.error, "CREDENTIALS_MISSING");
        storeaApi.script("production", storeaRateLimitedAnswer({ retryAt: Date.now() + 20_000 }));
        const limited = await call(key, bodies[key]);
        assert.equal(limited.json.error, "RATE_LIMITED", limited.text);
        storeaApi.script("production", { status: 500, times: 2 });
        const failed = await call(key, bodies[key]);
        assert.deepEqual(failed.json.details, { status: 500, upstreamCode: null }, failed.text);
      }
      storeaApi.clearScripts();
    });

    await t.step("request bodies: the document and the service agree", async () => {
      const id = "2000000000000201";
      const storeaBodies: unknown[] = [
        { transactionId: id },
        { transactionId: id, environment: "production" },
        { transactionId: "1".repeat(128) },
        { transactionId: "1".repeat(129) },
        { transactionId: "" },
        { transactionId: ".." },
        { transactionId: 2000000000000201 },
        { transactionId: id, environment: "staging" },
        { transactionId: id, note: "unknown field" },
        {},
        [],
        null,
      ];
      const verdicts = new Set<boolean>();
      for (const body of storeaBodies) {
        const accepted = documentAccepts(STOREA_VERIFY, body);
        verdicts.add(accepted);
        const answer = await verifyA(body);
        assert.equal(
          answer.json.error === "INVALID_REQUEST",
          !accepted,
          `${JSON.stringify(body)}: document ${accepted}, service ${answer.text}`,
        );
      }
      const ok = { packageName: PACKAGE, productId: "coins_100", type: "product" };
      const storebBodies: unknown[] = [
        { ...ok, purchaseToken: "t".repeat(4096) },
        { ...ok, purchaseToken: "t".repeat(4097) },
        { ...ok, purchaseToken: "" },
        { ...ok, purchaseToken: ".." },
        { ...ok, purchaseToken: "tok", productId: ".." },
        { ...ok, purchaseToken: "tok", productId: "p".repeat(201) },
        { ...ok, purchaseToken: "tok", packageName: "p".repeat(201) },
        { ...ok, purchaseToken: "tok", type: "subscription" },
        { ...ok, purchaseToken: "tok", type: "bundle" },
        { ...ok, purchaseToken: "tok", extra: true },
        { packageName: PACKAGE, purchaseToken: "tok", type: "product" },
      ];
      for (const body of storebBodies) {
        const accepted = documentAccepts(STOREB_VERIFY, body);
        verdicts.add(accepted);
        const answer = await verifyB(body);
        assert.equal(
          answer.json.error === "INVALID_REQUEST",
          !accepted,
          `${JSON.stringify(body).slice(0, 200)}: document ${accepted}, service ${answer.text}`,
        );
      }
      assert.deepEqual([...verdicts].sort(), [false, true]);
    });

    await t.step(
      "store lookups and actions: the document and the service agree on bodies",
      async () => {
        // A tenant of its own with both stores' credentials: these calls take tokens too.
        const e = await storeTenant((id) => storeaCredentialArgs(id, keyFile));
        await cliOk(running, ...storebCredentialArgs(e.tenantId, accountFile, PUSH_ACCOUNT));
        const auth = { authorization: `Bearer ${e.key}` };
        const verdicts = new Set<boolean>();
        const agree = async (key: string, bodies: unknown[]) => {
          for (const body of bodies) {
            const accepted = documentAccepts(key, body);
            verdicts.add(accepted);
            const answer = checked(key, await post(key.slice("POST ".length), body, auth));
            assert.equal(
              answer.json.error === "INVALID_REQUEST",
              !accepted,
              `${key} ${JSON.stringify(body).slice(0, 200)}: document ${accepted}, service ${
                answer.text.slice(0, 300)
              }`,
            );
          }
        };
        // Unknown to the store, so an accepted body answers a domain failure, never Apple's 400.
        const id = "2000000000000499";
        await agree("POST /v1/storea/subscriptions", [
          { transactionId: id, environment: "sandbox" },
          { transactionId: "1".repeat(129) },
          { transactionId: id, environment: "staging" },
          { transactionId: id, revision: "r" },
        ]);
        await agree("POST /v1/storea/history", [
          {
            transactionId: id,
            sort: "descending",
            startDate: "2026-01-01T00:00:00Z",
            endDate: "2026-02-01T00:00:00.500+02:00",
            productIds: ["a", "b"],
            productTypes: ["AUTO_RENEWABLE", "NON_RENEWABLE", "CONSUMABLE", "NON_CONSUMABLE"],
            subscriptionGroupIdentifiers: ["21000001"],
            inAppOwnershipType: "FAMILY_SHARED",
            revoked: true,
          },
          { transactionId: id, productIds: Array.from({ length: 50 }, (_, i) => `p${i}`) },
          { transactionId: id, productIds: Array.from({ length: 51 }, (_, i) => `p${i}`) },
          { transactionId: id, productIds: [""] },
          { transactionId: id, productTypes: ["BUNDLE"] },
          { transactionId: id, sort: "ASCENDING" },
          { transactionId: id, startDate: "2026-01-01" },
          { transactionId: id, startDate: "2026-01-01T00:00:00" },
          { transactionId: id, startDate: 1767225600000 },
          { transactionId: id, inAppOwnershipType: "SHARED" },
          { transactionId: id, revoked: "true" },
          { transactionId: id, revision: "" },
        ]);
        const consent = {
          transactionId: id,
          customerConsented: true,
          sampleContentProvided: false,
          deliveryStatus: "DELIVERED",
        };
        await agree("POST /v1/storea/consumption", [
          consent,
          { ...consent, consumptionPercentage: 100000, refundPreference: "GRANT_FULL" },
          { ...consent, customerConsented: false },
          { ...consent, customerConsented: "true" },
          { ...consent, deliveryStatus: "LOST" },
          { ...consent, consumptionPercentage: 100001 },
          { ...consent, consumptionPercentage: 1.5 },
          { ...consent, refundPreference: "GRANT_HALF" },
          { transactionId: id, customerConsented: true, deliveryStatus: "DELIVERED" },
          { ...consent, accountTenure: 3 },
        ]);
        const ok = { packageName: PACKAGE, productId: "coins_100", purchaseToken: "ptok-none" };
        await agree("POST /v1/storeb/acknowledge", [
          { ...ok, type: "product" },
          { ...ok, type: "bundle" },
          ok,
          { ...ok, type: "product", acknowledge: true },
          { ...ok, type: "product", productId: ".." },
        ]);
        await agree("POST /v1/storeb/consume", [
          ok,
          { ...ok, type: "product" },
          { ...ok, purchaseToken: "t".repeat(4097) },
        ]);
        assert.deepEqual([...verdicts].sort(), [false, true]);

        // Apple's rules between fields, which the schema only describes: refused before the store.
        const consumption = (body: unknown) =>
          post("/v1/storea/consumption", body, auth).then((answer) =>
            checked("POST /v1/storea/consumption", answer)
          );
        for (
          const body of [
            { ...consent, deliveryStatus: "UNDELIVERED_OTHER", consumptionPercentage: 5 },
            { ...consent, refundPreference: "GRANT_PRORATED", consumptionPercentage: 0 },
            { ...consent, refundPreference: "GRANT_PRORATED", consumptionPercentage: 100000 },
          ]
        ) {
          assert.ok(documentAccepts("POST /v1/storea/consumption", body));
          const answer = await consumption(body);
          assert.equal(answer.json.error, "INVALID_REQUEST", answer.text);
          assert.equal(answer.json.details.issues[0].path, "consumptionPercentage");
        }
        const window = await post("/v1/storea/history", {
          transactionId: id,
          startDate: "2026-02-01T00:00:00Z",
          endDate: "2026-01-01T00:00:00Z",
        }, auth);
        assert.equal(checked("POST /v1/storea/history", window).json.error, "INVALID_REQUEST");
      },
    );

    await t.step("verify: bodies that are not JSON, and the 16 KB limit", async () => {
      const auth = { authorization: `Bearer ${a.key}` };
      const invalid = [
        await post("/v1/storea/verify", "{}", { ...auth, "content-type": "text/plain" }),
        await post("/v1/storea/verify", "", auth),
        await post("/v1/storea/verify", "{nope", auth),
        await post("/v1/storea/verify", new Uint8Array([0x7b, 0xff, 0x7d]), auth),
      ];
      for (const answer of invalid) {
        assert.equal(checked(STOREA_VERIFY, answer).json.error, "INVALID_REQUEST", answer.text);
      }
      const json = `{"transactionId":"2000000000000202"}`;
      const atLimit = json + " ".repeat(VERIFY_BODY_LIMIT - json.length);
      const fits = checked(STOREA_VERIFY, await post("/v1/storea/verify", atLimit, auth));
      assert.equal(fits.json.error, "TRANSACTION_NOT_FOUND");
      const over = checked(STOREA_VERIFY, await post("/v1/storea/verify", atLimit + " ", auth));
      assert.deepEqual(over.json.details, { limitBytes: VERIFY_BODY_LIMIT });
    });

    await t.step("verify: 401 without a valid key, 400 without credentials", async () => {
      for (const path of ["/v1/storea/verify", "/v1/storeb/verify"]) {
        const key = `POST ${path}`;
        for (
          const headers of [
            {},
            { authorization: "Bearer nope" },
            { authorization: `Bearer service_test_${"A".repeat(43)}` },
          ] as Record<string, string>[]
        ) {
          const answer = checked(key, await post(path, {}, headers));
          assert.equal(answer.json.error, "UNAUTHENTICATED");
        }
      }
      const a400 = await verifyA({ transactionId: "2000000000000203" }, bare.key);
      assert.equal(a400.json.error, "CREDENTIALS_MISSING");
      const b400 = await verifyB({ ...bSubscription() }, bare.key);
      assert.equal(b400.json.error, "CREDENTIALS_MISSING");
    });

    await t.step("verify: 429 once the tenant's bucket is empty", async () => {
      const answers = await Promise.all(
        Array.from({ length: 50 }, () => verifyA({ transactionId: "2000000000000204" }, bare.key)),
      );
      const limited = answers.filter((answer) => answer.status === 429);
      assert.ok(limited.length > 0, `statuses ${answers.map((x) => x.status)}`);
      for (const answer of limited) {
        assert.equal(answer.json.error, "RATE_LIMITED");
        // The tenant's own limit: both `Retry-After` and `details.retryAfterSeconds`.
        const seconds = Number(answer.headers.get("retry-after"));
        assert.ok(seconds >= 1);
        assert.equal(answer.json.details.retryAfterSeconds, seconds);
      }
    });

    await t.step("store A receiver: receipts and every documented error", async () => {
      const renewal = await signedNotification({
        notificationType: "DID_RENEW",
        transaction: signer.sampleTransaction({ productId: "pro.monthly" }),
        renewalInfo: signer.sampleRenewalInfo({}),
      });
      const first = await notifyA(renewal);
      assert.equal(first.status, 200);
      assert.equal(first.json.isNew, true);
      const again = await notifyA(renewal);
      assert.equal(again.json.isNew, false);
      assert.equal(again.json.eventId, first.json.eventId);
      expectedDeliveries += 1;

      for (const body of [{ signedPayload: "" }, {}, { signedPayload: 42 }]) {
        assert.equal(documentAccepts(STOREA_HOOK, body), false);
        assert.equal((await notifyA(body)).json.error, "INVALID_REQUEST");
      }
      const oversized = checked(
        STOREA_HOOK,
        await post(
          `/v1/webhooks/storea/${a.tenantId}`,
          `{"signedPayload":"x"}${" ".repeat(RECEIVER_BODY_LIMIT)}`,
        ),
      );
      assert.deepEqual(oversized.json.details, { limitBytes: RECEIVER_BODY_LIMIT });
      const json = `{"signedPayload":"not.a.jws"}`;
      const atLimit = checked(
        STOREA_HOOK,
        await post(
          `/v1/webhooks/storea/${a.tenantId}`,
          json + " ".repeat(RECEIVER_BODY_LIMIT - json.length),
        ),
      );
      assert.equal(atLimit.json.error, "SIGNATURE_INVALID");
      const stranger = new StoreaSigner(await createStoreaTestPki(), { bundleId: BUNDLE_ID });
      const forged = {
        signedPayload: await stranger.signNotification(
          await stranger.notificationPayload({ notificationType: "TEST" }),
        ),
      };
      assert.equal((await notifyA(forged)).json.error, "SIGNATURE_INVALID");
      const unknown = await notifyA(renewal, "tenant_01KA1D4C7W5GQ0VZ3RJ8N2T6XE");
      assert.equal(unknown.json.error, "TENANT_NOT_FOUND");
      assert.equal((await notifyA(renewal, bare.tenantId)).json.error, "CREDENTIALS_MISSING");
    });

    await t.step("store A receiver: 429 once chains never seen spend their budget", async () => {
      // A known chain with its leaf's last byte changed, a new way each time: every one is a
      // chain the service has never seen, and is refused 429 unchecked once the budget is spent.
      const genuine = (await signedNotification({ notificationType: "TEST" })).signedPayload;
      const [header, payload, signature] = genuine.split(".");
      const decoded = JSON.parse(
        new TextDecoder().decode(Uint8Array.fromBase64(header, { alphabet: "base64url" })),
      );
      const unseen = (i: number) => {
        const leaf = Uint8Array.fromBase64(decoded.x5c[0]);
        leaf[leaf.length - 1] ^= i;
        const edited = { ...decoded, x5c: [leaf.toBase64(), ...decoded.x5c.slice(1)] };
        const text = new TextEncoder().encode(JSON.stringify(edited));
        return {
          signedPayload: `${
            text.toBase64({ alphabet: "base64url", omitPadding: true })
          }.${payload}.${signature}`,
        };
      };
      const answers = await Promise.all(
        Array.from({ length: 30 }, (_, i) => notifyA(unseen(i + 1))),
      );
      const codes = new Set(answers.map((answer) => answer.json.error));
      assert.deepEqual([...codes].sort(), ["RATE_LIMITED", "SIGNATURE_INVALID"]);
      for (const answer of answers.filter((answer) => answer.status === 429)) {
        assert.equal(
          Number(answer.headers.get("retry-after")),
          answer.json.details.retryAfterSeconds,
        );
      }
    });

    await t.step("a delivery answered 500 is retried with the same event and body", async () => {
      await receiver.waitFor(expectedDeliveries); // the scripted answer is for the next one
      receiver.script({ status: 500 });
      const test = await notifyA(await signedNotification({ notificationType: "TEST" }));
      const eventId = test.json.eventId;
      const attempts = await eventually(
        () => {
          const mine = receiver.deliveries.filter((d) =>
            d.headers["x-service-event-id"] === eventId
          );
          return mine.length >= 2 ? mine : undefined;
        },
        10_000,
        "the retry of a refused delivery",
      );
      assert.deepEqual(attempts.map((d) => d.answeredStatus), [500, 200]);
      assert.equal(attempts[1].body, attempts[0].body);
      for (const attempt of attempts) checkDelivery(attempt);
      expectedDeliveries += 2;
    });

    await t.step("store B receiver: receipts and every documented error", async () => {
      const renewal = pushEnvelope(
        subscriptionNotification(PACKAGE, {
          notificationType: 2,
          purchaseToken: "ptok-renewal",
          subscriptionId: "pro.monthly",
        }),
      );
      const first = await notifyB(renewal);
      assert.equal(first.json.isNew, true);
      assert.equal((await notifyB(renewal)).json.isNew, false);
      // Pub/Sub's other spelling of the message id alone is enough.
      const other = pushEnvelope(testNotification(PACKAGE));
      const { messageId: _, ...underscoreOnly } = other.message;
      assert.equal(documentAccepts(STOREB_HOOK, { ...other, message: underscoreOnly }), true);
      assert.equal((await notifyB({ ...other, message: underscoreOnly })).status, 200);
      for (
        const notification of [
          oneTimeProductNotification(PACKAGE, {
            notificationType: 1,
            purchaseToken: "ptok-coins",
            sku: "coins.100",
          }),
          voidedPurchaseNotification(PACKAGE, {
            purchaseToken: "ptok-voided",
            orderId: "GPA.1234-5678-9012-34567",
            productType: 2,
            refundType: 1,
          }),
          { version: "1.0", packageName: PACKAGE, eventTimeMillis: "1" },
        ]
      ) {
        assert.equal((await notifyB(pushEnvelope(notification))).status, 200);
      }
      expectedDeliveries += 5;

      const missing = await notifyB(pushEnvelope(testNotification(PACKAGE)), {
        authorization: null,
      });
      assert.equal(missing.json.error, "UNAUTHENTICATED");
      const unknown = await notifyB(pushEnvelope(testNotification(PACKAGE)), {
        tenantId: "tenant_01KA1D4C7W5GQ0VZ3RJ8N2T6XE",
      });
      assert.equal(unknown.json.error, "UNAUTHENTICATED");
      const audience = await notifyB(pushEnvelope(testNotification(PACKAGE)), {
        authorization: `Bearer ${await mint("https://other.example.com/push")}`,
      });
      assert.equal(audience.json.error, "SIGNATURE_INVALID");
      for (const body of [{ message: { messageId: "1" } }, { subscription: "s" }]) {
        assert.equal(documentAccepts(STOREB_HOOK, body), false);
        assert.equal((await notifyB(body)).json.error, "INVALID_REQUEST");
      }
      const foreign = await notifyB(pushEnvelope(testNotification("com.other.app")));
      assert.deepEqual(foreign.json.details, { packageName: "com.other.app" });
    });

    await t.step("the operator's test delivery", async () => {
      const sent = await cliOk(running, "webhook", "test", a.tenantId);
      assert.equal(sent.delivered, true);
      expectedDeliveries += 1;
    });

    await t.step("every delivery matches webhooks.purchaseEvent", async () => {
      const deliveries = await receiver.waitFor(expectedDeliveries);
      await sleep(300); // nothing more is due
      assert.equal(receiver.deliveries.length, expectedDeliveries);
      const sources = new Set<string>();
      const events = new Set<string>();
      for (const delivery of deliveries) {
        const body = checkDelivery(delivery);
        sources.add(body.source);
        events.add(body.event);
      }
      assert.deepEqual([...sources].sort(), ["service", "storea", "storeb"]);
      for (const event of ["subscription.renewed", "product.purchased", "refund.issued", "test"]) {
        assert.ok(events.has(event), event);
      }
      assert.ok(events.has("unknown"));
    });

    await t.step("inactive tenants: 404 at both receivers", async () => {
      await cliOk(running, "tenant", "deactivate", a.tenantId);
      await cliOk(running, "tenant", "deactivate", b.tenantId);
      await sleep(1_100); // the receivers cache tenants for a second
      const notification = await signedNotification({ notificationType: "TEST" });
      const storea = await eventually(async () => {
        const answer = await notifyA(notification);
        return answer.status === 404 ? answer : undefined;
      }, 5_000);
      assert.equal(storea.json.error, "TENANT_NOT_FOUND");
      const storeb = await eventually(async () => {
        const answer = await notifyB(pushEnvelope(testNotification(PACKAGE)));
        return answer.status === 404 ? answer : undefined;
      }, 5_000);
      assert.equal(storeb.json.error, "TENANT_NOT_FOUND");
    });

    await t.step("a different encryption key: /ready 503", async () => {
      assert.equal(await running.stop(), 0);
      const wrongKey = await startService({
        db: running.db,
        env: { ENCRYPTION_KEY: OTHER_KEY },
      });
      try {
        const ready = checked("GET /ready", await send(`${wrongKey.url}/ready`));
        assert.equal(ready.status, 503);
        assert.match(ready.json.checks.encryption, /^fail/);
        checked("GET /health", await send(`${wrongKey.url}/health`));
      } finally {
        await wrongKey.stop();
      }
    });

    await t.step("every documented status and code was seen, but for INTERNAL_ERROR", () => {
      const missing: string[] = [];
      for (const [key, op] of documentedOperations()) {
        for (const [status, response] of Object.entries<Node>(op.responses)) {
          const codes = [...documentedCodes(response)].filter((c) => c !== "INTERNAL_ERROR");
          if (status === "500") continue;
          const prefix = `${key} ${status} `;
          if (![...seen].some((s) => s.startsWith(prefix))) missing.push(prefix);
          for (const code of codes) {
            if (!seen.has(prefix + code)) missing.push(prefix + code);
          }
        }
      }
      assert.deepEqual(missing, []);
    });
  } finally {
    if (service) await stopAndDrop(service);
    await receiver.close();
    await issuer.close();
    await play.close();
    await storeaApi.close();
    await Deno.remove(dir, { recursive: true });
  }
});
