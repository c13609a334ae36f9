/** Reading bounded prefixes of streams that come from outside (request and response bodies). */

/**
 * Reads at most `limit` bytes of `stream`, and one chunk more to tell whether there was more;
 * then stops reading and cancels the rest. Read errors propagate.
 */
export async function readStreamPrefix(
  stream: ReadableStream<Uint8Array> | null,
  limit: number,
): Promise<{ bytes: Uint8Array; exceeded: boolean }> {
  if (stream === null) return { bytes: new Uint8Array(0), exceeded: false };
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    while (total <= limit) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      total += value.length;
    }
  } finally {
    if (total > limit) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
  const kept = Math.min(total, limit);
  if (chunks.length === 1 && total <= limit) return { bytes: chunks[0], exceeded: false };
  const bytes = new Uint8Array(kept);
  let offset = 0;
  for (const chunk of chunks) {
    const part = chunk.subarray(0, kept - offset);
    bytes.set(part, offset);
    offset += part.length;
    if (offset === kept) break;
  }
  return { bytes, exceeded: total > limit };
}
