/**
 * The drain baseline of `bench/relay.ts`: a bare Deno loop that sends the dispatcher's signed POSTs
 * to the same callback sink, with nothing else: per request an HMAC-SHA256 signature of
 * `<t>.<body>` (src/delivery/signature.ts) and a `fetch` POST of the same body and headers as a
 * delivery, `inFlight` at once, for `seconds`. No database, no queue, no records. Each request
 * carries its own event id, so the sink counts each as a distinct valid delivery.
 *
 * Run by the bench as its own process, pinned to the core the service used:
 *
 *     deno run --allow-net=127.0.0.1 --allow-read bench/signed_post_loop.ts CONFIG_JSON
 *
 * `CONFIG_JSON`: `url`, `secret`, `bodyFile` (the body to send), `seconds`, `inFlight`. Prints one
 * JSON line: `requests` (answered 2xx), `failed`, `seconds`, `perSecond`.
 * @module
 */
import { signatureHeader } from "../src/delivery/signature.ts";

/** What one loop measured. */
export interface SignedPostLoopResult {
  requests: number;
  failed: number;
  seconds: number;
  perSecond: number;
  inFlight: number;
  bodyBytes: number;
}

async function runLoop(config: {
  url: string;
  secret: string;
  bodyFile: string;
  seconds: number;
  inFlight: number;
}): Promise<SignedPostLoopResult> {
  const body = await Deno.readTextFile(config.bodyFile);
  let sent = 0;
  let requests = 0;
  let failed = 0;
  const started = performance.now();
  const until = started + config.seconds * 1000;
  const worker = async () => {
    while (performance.now() < until) {
      const n = sent++;
      const response = await fetch(config.url, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "user-agent": "purchase-relay-bench",
          "x-service-event": "subscription.renewed",
          "x-service-event-id": `evt_loop_${n}`,
          "x-service-signature": signatureHeader(
            [config.secret],
            Math.floor(Date.now() / 1000),
            body,
          ),
        },
        body,
      }).catch(() => null);
      if (response === null) {
        failed++;
        continue;
      }
      await response.body?.cancel();
      if (response.ok) requests++;
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
    bodyBytes: new TextEncoder().encode(body).length,
  };
}

if (import.meta.main) {
  console.log(JSON.stringify(await runLoop(JSON.parse(Deno.args[0]))));
}
