/**
 * Reads JSON request bodies. The size limit is counted on the bytes actually read, never on
 * `Content-Length` alone, and reading stops as soon as it is exceeded.
 */
import type { z } from "zod";
import { invalidRequest } from "../errors.ts";

/** Verify endpoints accept at most 16 KB (spec 8). */
export const VERIFY_BODY_LIMIT = 16 * 1024;
/** Webhook receivers accept at most 1 MB (spec 8). */
export const RECEIVER_BODY_LIMIT = 1024 * 1024;

const decoder = new TextDecoder("utf-8", { fatal: true });

/** Parses the request body as JSON, enforcing the content type and `limit` bytes. */
export async function readJsonBody(request: Request, limit: number): Promise<unknown> {
  const contentType = request.headers.get("content-type");
  if (contentType === null || !isJsonMediaType(contentType)) {
    throw invalidRequest("Content-Type must be application/json");
  }
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (declared > limit) throw tooLarge(limit);

  const bytes = await readLimited(request, limit);
  if (bytes.length === 0) throw invalidRequest("the request body is empty");
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    throw invalidRequest("the request body is not valid UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch {
    throw invalidRequest("the request body is not valid JSON");
  }
}

function isJsonMediaType(value: string): boolean {
  const type = value.split(";", 1)[0].trim().toLowerCase();
  return type === "application/json";
}

async function readLimited(request: Request, limit: number): Promise<Uint8Array> {
  if (request.body === null) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    while (true) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await reader.read();
      } catch {
        throw invalidRequest("the request body could not be read");
      }
      const { done, value } = next;
      if (done) break;
      total += value.length;
      if (total > limit) {
        await reader.cancel().catch(() => {});
        throw tooLarge(limit);
      }
      chunks.push(value);
    }
  } finally {
    reader.releaseLock();
  }
  if (chunks.length === 1) return chunks[0];
  const body = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    body.set(chunk, offset);
    offset += chunk.length;
  }
  return body;
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
