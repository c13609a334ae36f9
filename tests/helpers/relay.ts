/** Helpers for notification relay tests: posting notifications and reading the queue. */
import assert from "node:assert/strict";
import type postgres from "postgres";
import type { RunningService } from "./service.ts";
import type { ReceivedDelivery } from "../../simulators/callback_receiver.ts";

/** An HTTP answer with its JSON body. */
export interface JsonAnswer {
  status: number;
  headers: Headers;
  // deno-lint-ignore no-explicit-any
  json: any;
}

/** POSTs `body` (JSON-encoded unless a string) to `url`. */
export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<JsonAnswer> {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = { unparsed: text };
  }
  return { status: response.status, headers: response.headers, json };
}

/** Asserts the error envelope with `status` and `code`. */
export function assertError(answer: JsonAnswer, status: number, code: string): void {
  assert.equal(answer.status, status, JSON.stringify(answer.json));
  assert.equal(answer.json.valid, false);
  assert.equal(answer.json.error, code);
  assert.equal(typeof answer.json.message, "string");
  assert.match(answer.headers.get("content-type") ?? "", /^application\/json/);
  assert.match(answer.headers.get("x-request-id") ?? "", /^req_/);
}

/** Asserts a receiver's 200 answer `{eventId, externalId, isNew, enqueuedDelivery}`. */
export function assertReceipt(
  answer: JsonAnswer,
  expected: { externalId: string; isNew: boolean; enqueuedDelivery: boolean },
): string {
  assert.equal(answer.status, 200, JSON.stringify(answer.json));
  assert.deepEqual(Object.keys(answer.json).sort(), [
    "enqueuedDelivery",
    "eventId",
    "externalId",
    "isNew",
  ]);
  assert.match(answer.json.eventId, /^evt_[0-9A-HJKMNP-TV-Z]{26}$/);
  assert.equal(answer.json.externalId, expected.externalId);
  assert.equal(answer.json.isNew, expected.isNew);
  assert.equal(answer.json.enqueuedDelivery, expected.enqueuedDelivery);
  return answer.json.eventId;
}

/** Creates a tenant with a callback URL through the CLI; returns its id and webhook secret. */
export async function createTenantWithCallback(
  service: RunningService,
  callbackUrl: string | null,
): Promise<{ tenantId: string; secret: string | null }> {
  const args = ["tenant", "create", "--name", "Relay tenant"];
  if (callbackUrl !== null) args.push("--callback-url", callbackUrl);
  const created = await service.cli(...args);
  assert.equal(created.code, 0, created.stderr);
  return { tenantId: created.json.id, secret: created.json.webhookSecret ?? null };
}

/** Runs a CLI command and asserts it succeeded. */
// deno-lint-ignore no-explicit-any
export async function cliOk(service: RunningService, ...args: string[]): Promise<any> {
  const result = await service.cli(...args);
  assert.equal(result.code, 0, `${args.join(" ")}: ${result.stderr}`);
  return result.json;
}

/** Polls `check` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function eventually<T>(
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
  what = "condition",
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what} not reached within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The delivery row of an event, read directly from the database. */
export async function deliveryOf(
  sql: postgres.Sql,
  eventId: string,
  // deno-lint-ignore no-explicit-any
): Promise<any> {
  const [row] = await sql`SELECT * FROM deliveries WHERE event_id = ${eventId}`;
  return row;
}

/**
 * Waits until the delivery of `eventId` is in `status` and returns its row; fails after
 * `timeoutMs`.
 */
export async function deliveryReaches(
  sql: postgres.Sql,
  eventId: string,
  status: "pending" | "delivered" | "failed",
  timeoutMs = 15_000,
  // deno-lint-ignore no-explicit-any
): Promise<any> {
  return await eventually(
    async () => {
      const row = await deliveryOf(sql, eventId);
      return row?.status === status ? row : undefined;
    },
    timeoutMs,
    `delivery of ${eventId} ${status}`,
  );
}

/** The keys of a delivery body, in the order docs/integration.md lists them. */
export const DELIVERY_KEYS = [
  "event",
  "reason",
  "platformEvent",
  "eventId",
  "externalId",
  "timestamp",
  "tenantId",
  "source",
  "subject",
  "data",
  "raw",
  "occurredAt",
  "state",
];

/**
 * Asserts what every delivery carries: a valid signature over the body, the headers, and the body's
 * keys. Returns the parsed body.
 */
export function assertSignedDelivery(
  delivery: ReceivedDelivery,
  expected: { event: string; eventId: string },
  // deno-lint-ignore no-explicit-any
): any {
  assert.equal(delivery.signatureValid, true);
  assert.equal(delivery.method, "POST");
  const h = delivery.headers;
  assert.equal(h["content-type"], "application/json");
  assert.equal(h["user-agent"], "purchase-relay/dev");
  assert.equal(h["x-service-event"], expected.event);
  assert.equal(h["x-service-event-id"], expected.eventId);
  assert.equal(h["x-service-version"], "dev");
  assert.match(h["x-service-timestamp"], /^\d{10}$/);
  assert.ok(Math.abs(Number(h["x-service-timestamp"]) - Date.now() / 1000) < 30);
  assert.match(
    h["x-service-signature"],
    new RegExp(`^t=${h["x-service-timestamp"]},v1=[0-9a-f]{64}$`),
  );
  // deno-lint-ignore no-explicit-any
  const body = delivery.json as any;
  // `stateError` comes last, and only when a store B purchase's state could not be fetched.
  const keys = Object.keys(body);
  assert.deepEqual(keys.at(-1) === "stateError" ? keys.slice(0, -1) : keys, DELIVERY_KEYS);
  assert.equal(body.event, expected.event);
  assert.equal(body.eventId, expected.eventId);
  return body;
}
