/**
 * The drain baselines of `bench/relay.ts`: a bare Deno loop that sends the dispatcher's signed POSTs
 * to the same callback sink, with nothing else: per request an HMAC-SHA256 signature of
 * `<t>.<body>` (src/delivery/signature.ts) and a POST of the same body and headers as a delivery,
 * `inFlight` at once, for `seconds`. No database, no queue, no records. Each request carries its own
 * event id, so the sink counts each as a distinct valid delivery.
 *
 * Two clients: `fetch`, what a bare Deno program sends with (the drain goal's baseline), and
 * `service`, the service's own callback client (src/delivery/callback_client.ts) with its kept
 * connections: the floor, the cheapest way we know to make the POSTs a drain cannot do without.
 *
 * Run by the bench as its own process, pinned to the core the service used:
 *
 *     deno run --allow-net=127.0.0.1 --allow-read bench/signed_post_loop.ts CONFIG_JSON
 *
 * `CONFIG_JSON`: `url`, `secret`, `bodyFile` (the body to send), `seconds`, `inFlight`, `client`
 * (`fetch` or `service`). Prints one JSON line: `requests` (answered 2xx), `failed`, `seconds`,
 * `perSecond`.
 * @module
 */
import { signatureHeader } from "../src/delivery/signature.ts";
import { CallbackConnections, postToCallback } from "../src/delivery/callback_client.ts";

/** Which client sends the POSTs. */
export type PostLoopClient = "fetch" | "service";

/** What one loop measured. */
export interface SignedPostLoopResult {
  requests: number;
  failed: number;
  seconds: number;
  perSecond: number;
  inFlight: number;
  bodyBytes: number;
  client: PostLoopClient;
}

async function runLoop(config: {
  url: string;
  secret: string;
  bodyFile: string;
  seconds: number;
  inFlight: number;
  client: PostLoopClient;
}): Promise<SignedPostLoopResult> {
  // Its bytes, read once: the signature and every request are made of them, as the sender's are.
  const body = await Deno.readFile(config.bodyFile);
  const post = config.client === "fetch" ? postWithFetch : postWithServiceClient(config.url);
  let sent = 0;
  let requests = 0;
  let failed = 0;
  const started = performance.now();
  const until = started + config.seconds * 1000;
  const worker = async () => {
    while (performance.now() < until) {
      const n = sent++;
      const headers = {
        "content-type": "application/json",
        "user-agent": "purchase-relay-bench",
        "x-service-event": "subscription.renewed",
        "x-service-event-id": `evt_loop_${n}`,
        "x-service-signature": signatureHeader(
          [config.secret],
          Math.floor(Date.now() / 1000),
          body,
        ),
      };
      const status = await post(config.url, headers, body).catch(() => null);
      if (status !== null && status >= 200 && status < 300) requests++;
      else failed++;
    }
  };
  await Promise.all(Array.from({ length: config.inFlight }, worker));
  const seconds = (performance.now() - started) / 1000;
  return {
    requests,
    failed,
    seconds,
    perSecond: requests / seconds,
    inFlight: config.inFlight,
    bodyBytes: body.length,
    client: config.client,
  };
}

type Post = (
  url: string,
  headers: Record<string, string>,
  body: Uint8Array<ArrayBuffer>,
) => Promise<number>;

async function postWithFetch(
  url: string,
  headers: Record<string, string>,
  body: Uint8Array<ArrayBuffer>,
) {
  const response = await fetch(url, { method: "POST", headers, body });
  await response.body?.cancel();
  return response.status;
}

function postWithServiceClient(url: string): Post {
  const connections = new CallbackConnections();
  const parsed = new URL(url);
  const target = { url: parsed, host: parsed.hostname, addresses: [parsed.hostname] };
  return async (_url, headers, body) => {
    const answer = await postToCallback(target, {
      headers,
      body,
      bodyLimit: 4096,
      signal: AbortSignal.timeout(10_000),
    }, connections);
    return answer.status;
  };
}

if (import.meta.main) {
  console.log(JSON.stringify(await runLoop(JSON.parse(Deno.args[0]))));
}
