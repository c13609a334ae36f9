/**
 * The baseline of `bench/verify.ts`: a bare `Deno.serve` that does the one thing a verify request
 * cannot do without, the upstream call, and nothing else. For each POST it reads the JSON body,
 * makes the same call the service makes (same URL shape, a bearer token, `accept:
 * application/json`), reads the whole answer and returns it as is.
 *
 * - `POST /v1/storea/verify` `{ transactionId }` ->
 *   `GET ${STOREA_URL}/inApps/v1/transactions/${transactionId}` with `STOREA_TOKEN`
 * - `POST /v1/storeb/verify` `{ packageName, purchaseToken, ... }` -> `GET ${STOREB_URL}/
 *   androidpublisher/v3/applications/${packageName}/purchases/subscriptionsv2/tokens/${purchaseToken}`
 *   with `STOREB_TOKEN`
 *
 * Each token is fixed, obtained once by the bench (store A: signed with the tenant's key; store B:
 * an access token from the token endpoint): the service also reuses one token for most of its
 * hour. It checks no API key, no rate limit, no
 * schema, no signature, and logs nothing, so the gap between the two is what the service adds.
 * It takes its port from `PORT`.
 *
 * @module
 */
import { baselineAddress } from "./baseline.ts";

const JSON_HEADERS = { "content-type": "application/json" };

const { port, hostname } = baselineAddress(8080);
const storeaUrl = Deno.env.get("STOREA_URL");
const storeaAuthorization = `Bearer ${Deno.env.get("STOREA_TOKEN")}`;
const storebUrl = Deno.env.get("STOREB_URL");
const storebAuthorization = `Bearer ${Deno.env.get("STOREB_TOKEN")}`;

Deno.serve(
  { port, hostname, onListen: () => {} },
  handle,
);

/** Forwards one verify request upstream and answers with the upstream's status and body. */
async function handle(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  if (request.method !== "POST") return new Response(null, { status: 404 });
  let url: string;
  let authorization: string;
  if (path === "/v1/storea/verify" && storeaUrl !== undefined) {
    const body = await request.json();
    url = `${storeaUrl}/inApps/v1/transactions/${encodeURIComponent(body.transactionId)}`;
    authorization = storeaAuthorization;
  } else if (path === "/v1/storeb/verify" && storebUrl !== undefined) {
    const body = await request.json();
    url = `${storebUrl}/androidpublisher/v3/applications/${
      encodeURIComponent(body.packageName)
    }/purchases/subscriptionsv2/tokens/${encodeURIComponent(body.purchaseToken)}`;
    authorization = storebAuthorization;
  } else {
    return new Response(null, { status: 404 });
  }
  const upstream = await fetch(url, { headers: { authorization, accept: "application/json" } });
  return new Response(await upstream.text(), { status: upstream.status, headers: JSON_HEADERS });
}
