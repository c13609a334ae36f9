/**
 * The baseline of `bench/verify.ts` and `bench/gateway.ts`: a bare `Deno.serve` that does the one
 * thing each endpoint cannot do without, its upstream call(s), and nothing else. For each POST it
 * reads the JSON body, makes the same call(s) the service makes (same method and URL shape, a
 * bearer token, `accept: application/json`, the same request body), reads each whole answer, and
 * answers with the last upstream answer's body, or a short body of its own when that has none.
 *
 * - `POST /v1/storea/verify` `{ transactionId }` ->
 *   `GET ${STOREA_URL}/inApps/v1/transactions/${transactionId}`
 * - `POST /v1/storea/subscriptions` `{ transactionId }` ->
 *   `GET ${STOREA_URL}/inApps/v1/subscriptions/${transactionId}`
 * - `POST /v1/storea/history` `{ transactionId }` ->
 *   `GET ${STOREA_URL}/inApps/v2/history/${transactionId}?sort=ASCENDING` (the service's default)
 * - `POST /v1/storea/consumption` `{ transactionId, ...fields }` ->
 *   `PUT ${STOREA_URL}/inApps/v2/transactions/consumption/${transactionId}` with the fields as
 *   JSON; a 2xx (Apple's 202 has no body) answers 200 `{"sent":true}`
 * - `POST /v1/storeb/verify` `{ packageName, purchaseToken, ... }` -> `GET ${STOREB_URL}/
 *   androidpublisher/v3/applications/${packageName}/purchases/subscriptionsv2/tokens/${purchaseToken}`
 * - `POST /v1/storeb/acknowledge` `{ packageName, productId, purchaseToken, type: "subscription" }`
 *   -> the same GET, then `POST .../purchases/subscriptions/${productId}/tokens/${purchaseToken}
 *   :acknowledge` with `{}`; a 2xx answers 200 `{"acknowledged":true}`
 * - `POST /v1/storeb/consume` `{ packageName, productId, purchaseToken }` ->
 *   `GET .../purchases/products/${productId}/tokens/${purchaseToken}`, then `POST
 *   .../purchases/products/${productId}/tokens/${purchaseToken}:consume` without a body; a 2xx
 *   answers 200 `{"consumed":true}`
 *
 * The store B actions read the purchase and then write without looking at what they read: the
 * benchmark measures purchases not yet acknowledged or consumed, whose every request the service
 * answers with that read and that write. Each token is fixed, obtained once by the bench (store A:
 * signed with the tenant's key; store B: an access token from the token endpoint): the service
 * also reuses one token for most of its hour. It checks no API key, no rate limit, no schema, no
 * signature, and logs nothing, so the gap between the two is what the service adds. A failed
 * upstream call is answered with its status and body. It takes its port from `PORT`.
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

/** One upstream call: where, how, and with what body. */
interface Call {
  url: string;
  method: "GET" | "POST" | "PUT";
  body?: string;
}

// deno-lint-ignore no-explicit-any
type Body = any;

/** The upstream calls of each endpoint, in order, built from the request's JSON body. */
const ROUTES: Record<string, { store: "storea" | "storeb"; calls: (body: Body) => Call[] }> = {
  "/v1/storea/verify": {
    store: "storea",
    calls: (body) => [{ method: "GET", url: transactionUrl("/v1/transactions/", body) }],
  },
  "/v1/storea/subscriptions": {
    store: "storea",
    calls: (body) => [{ method: "GET", url: transactionUrl("/v1/subscriptions/", body) }],
  },
  "/v1/storea/history": {
    store: "storea",
    calls: (body) => [{
      method: "GET",
      url: `${transactionUrl("/v2/history/", body)}?sort=ASCENDING`,
    }],
  },
  "/v1/storea/consumption": {
    store: "storea",
    calls: (body) => {
      const { transactionId: _, ...fields } = body;
      return [{
        method: "PUT",
        url: transactionUrl("/v2/transactions/consumption/", body),
        body: JSON.stringify(fields),
      }];
    },
  },
  "/v1/storeb/verify": {
    store: "storeb",
    calls: (body) => [{
      method: "GET",
      url: `${purchasesUrl(body)}/subscriptionsv2/tokens/${encodeURIComponent(body.purchaseToken)}`,
    }],
  },
  "/v1/storeb/acknowledge": {
    store: "storeb",
    calls: (body) => [
      {
        method: "GET",
        url: `${purchasesUrl(body)}/subscriptionsv2/tokens/${
          encodeURIComponent(body.purchaseToken)
        }`,
      },
      { method: "POST", url: `${productTokenUrl("subscriptions", body)}:acknowledge`, body: "{}" },
    ],
  },
  "/v1/storeb/consume": {
    store: "storeb",
    calls: (body) => [
      { method: "GET", url: productTokenUrl("products", body) },
      { method: "POST", url: `${productTokenUrl("products", body)}:consume` },
    ],
  },
};

/** What each endpoint whose last call answers without a body answers after a 2xx. */
const DONE_BODIES: Record<string, string> = {
  "/v1/storea/consumption": '{"sent":true}',
  "/v1/storeb/acknowledge": '{"acknowledged":true}',
  "/v1/storeb/consume": '{"consumed":true}',
};

function transactionUrl(path: string, body: Body): string {
  return `${storeaUrl}/inApps${path}${encodeURIComponent(body.transactionId)}`;
}

function purchasesUrl(body: Body): string {
  return `${storebUrl}/androidpublisher/v3/applications/${
    encodeURIComponent(body.packageName)
  }/purchases`;
}

function productTokenUrl(collection: string, body: Body): string {
  return `${purchasesUrl(body)}/${collection}/${encodeURIComponent(body.productId)}/tokens/${
    encodeURIComponent(body.purchaseToken)
  }`;
}

Deno.serve(
  { port, hostname, onListen: () => {} },
  handle,
);

/** Makes the endpoint's upstream calls and answers with the last one's status and body. */
async function handle(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  const route = request.method === "POST" ? ROUTES[path] : undefined;
  const base = route?.store === "storea" ? storeaUrl : storebUrl;
  if (route === undefined || base === undefined) return new Response(null, { status: 404 });
  const authorization = route.store === "storea" ? storeaAuthorization : storebAuthorization;
  const calls = route.calls(await request.json());
  let status = 502;
  let text = "";
  for (const call of calls) {
    const upstream = await fetch(call.url, {
      method: call.method,
      headers: call.body === undefined
        ? { authorization, accept: "application/json" }
        : { authorization, accept: "application/json", "content-type": "application/json" },
      body: call.body,
    });
    status = upstream.status;
    text = await upstream.text();
    if (!upstream.ok) break;
  }
  if (status >= 200 && status < 300 && text === "" && DONE_BODIES[path] !== undefined) {
    return new Response(DONE_BODIES[path], { headers: JSON_HEADERS });
  }
  return new Response(text, { status, headers: JSON_HEADERS });
}
