/**
 * Reads JSON request bodies. The size limit is counted on the bytes actually read, never on
 * `Content-Length` alone, and reading stops as soon as it is exceeded.
 */
import type { z } from "zod";
import { invalidRequest } from "../errors.ts";
import { decodeUtf8Strict, MAX_JSON_DEPTH, nestsDeeperThan } from "../lib/json.ts";
import { readStreamPrefix } from "../lib/streams.ts";
import { DeadlineExceededError, withDeadline } from "../lib/deadline.ts";

/** Verify endpoints accept at most 16 KB (docs/integration.md, "Limits"). */
export const VERIFY_BODY_LIMIT = 16 * 1024;
/** Webhook receivers accept at most 1 MB (docs/relay.md, "How a notification is received"). */
export const RECEIVER_BODY_LIMIT = 1024 * 1024;

/**
 * How long a request's body may take to arrive, whole. A client that stops sending would otherwise
 * hold its request until the request's deadline, which answers 500: a store sends a notification
 * of a few KB at once, a tenant's verify body is at most 16 KB, and the 1 MB a receiver takes needs
 * about 210 KB/s. Shorter than the request's deadline (`requestDeadlineMs` in process/app.ts: 5 s and three
 * upstream timeouts) by more than what a route does before it reads the body (a store B push
 * token's key fetch, bounded by one upstream timeout).
 */
export const BODY_TIMEOUT_MS = 5_000;

/**
 * Parses the request body as JSON, enforcing the content type, `limit` bytes and
 * {@linkcode BODY_TIMEOUT_MS}.
 */
export async function readJsonBody(request: Request, limit: number): Promise<unknown> {
  const contentType = request.headers.get("content-type");
  if (contentType === null || !isJsonMediaType(contentType)) {
    throw invalidRequest("Content-Type must be application/json");
  }
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (declared > limit) throw tooLarge(limit);

  let read: { bytes: Uint8Array; exceeded: boolean };
  try {
    read = await withDeadline(
      framedByLength(request, declared)
        ? request.bytes().then((bytes) => ({ bytes, exceeded: false }))
        : readStreamPrefix(request.body, limit),
      BODY_TIMEOUT_MS,
    );
  } catch (error) {
    if (error instanceof DeadlineExceededError) {
      // The answer goes out now; Deno's server keeps the connection until the client closes it.
      throw invalidRequest(`the request body did not arrive within ${BODY_TIMEOUT_MS / 1000} s`);
    }
    throw invalidRequest("the request body could not be read");
  }
  // Counted again on what arrived, whichever way it was read.
  if (read.exceeded || read.bytes.length > limit) throw tooLarge(limit);
  const bytes = read.bytes;
  if (bytes.length === 0) throw invalidRequest("the request body is empty");
  let text: string;
  try {
    text = decodeUtf8Strict(bytes);
  } catch {
    throw invalidRequest("the request body is not valid UTF-8");
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalidRequest("the request body is not valid JSON");
  }
  if (nestsDeeperThan(value, MAX_JSON_DEPTH)) {
    throw invalidRequest(`the request body nests deeper than ${MAX_JSON_DEPTH} levels`, {
      maxDepth: MAX_JSON_DEPTH,
    });
  }
  return value;
}

/**
 * Whether the body is framed by its `Content-Length` alone. The HTTP server then delivers exactly
 * that many bytes, never more (what follows them is the next request on the connection), so a
 * declared length within the limit bounds the read and the body can be taken whole: reading it
 * chunk by chunk from a stream cost about 15 µs more per request. With `Transfer-Encoding` the
 * length header does not frame the body, and the stream is read up to the limit.
 */
function framedByLength(request: Request, declared: number): boolean {
  return Number.isSafeInteger(declared) && declared >= 0 &&
    !request.headers.has("transfer-encoding");
}

function isJsonMediaType(value: string): boolean {
  const type = value.split(";", 1)[0].trim().toLowerCase();
  return type === "application/json";
}

function tooLarge(limit: number) {
  return invalidRequest(`the request body exceeds ${limit} bytes`, { limitBytes: limit });
}

/** Reads the JSON body and validates it with `schema`: 400 `INVALID_REQUEST` naming each issue. */
export async function readValidatedBody<T>(
  request: Request,
  schema: z.ZodType<T>,
  limit: number,
): Promise<T> {
  const parsed = schema.safeParse(await readJsonBody(request, limit));
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => ({
    path: issue.path.join("."),
    message: issue.message,
  }));
  throw invalidRequest(
    `invalid request body: ${issues.map((i) => `${i.path || "body"}: ${i.message}`).join("; ")}`,
    { issues },
  );
}
