/**
 * The floor of store A's endpoints that answer signed data, for `bench/verify.ts` and
 * `bench/gateway.ts`: the bare proxy (`bench/bare_verify_proxy.ts`) plus the one piece of work
 * such an endpoint cannot do without, the ES256 check of every JWS the App Store returned, done
 * with the service's own OpenSSL binding (`src/crypto/es256.ts`). Nothing else: no API key,
 * schema, rate limit, chain check, payload decoding, normalization or log.
 *
 * - `POST /v1/storea/verify` `{ transactionId }` -> `GET ${STOREA_URL}/inApps/v1/transactions/
 *   ${transactionId}`; checks `signedTransactionInfo`;
 * - `POST /v1/storea/subscriptions` -> `GET .../inApps/v1/subscriptions/${transactionId}`; checks
 *   each `signedTransactionInfo` and `signedRenewalInfo` of each group's `lastTransactions`;
 * - `POST /v1/storea/history` -> `GET .../inApps/v2/history/${transactionId}?sort=ASCENDING`;
 *   checks each of `signedTransactions`.
 *
 * Per POST it reads the JSON body, makes the same upstream call as the bare proxy, parses the
 * answer, finds each JWS's leaf key (imported once per distinct JWS header, that is per
 * certificate chain, as the service caches its chains), checks each signature over
 * `header.payload`, and returns the upstream's body as is; 502 if a signature does not verify.
 * It is the cheapest honest way we know to do what these endpoints must do per request: the gap
 * between it and the service is what the service's pipeline adds to the required work.
 *
 * `STOREA_URL` and `STOREA_TOKEN` as for the bare proxy; `PORT` and `HOST` where it listens. It
 * needs `--allow-ffi` for libcrypto and fails to start without it.
 *
 * @module
 */
import { X509Certificate } from "node:crypto";
import { type Es256VerifyingKey, importEs256Key, openLibcrypto } from "../src/crypto/es256.ts";
import { baselineAddress } from "./baseline.ts";

const JSON_HEADERS = { "content-type": "application/json" };
const encoder = new TextEncoder();

const { port, hostname } = baselineAddress(8080);
const storeaUrl = Deno.env.get("STOREA_URL");
const authorization = `Bearer ${Deno.env.get("STOREA_TOKEN")}`;

const failure = await openLibcrypto();
if (failure !== null) throw new Error(`the floor needs OpenSSL: ${failure}`);

/** Leaf keys by JWS header (the header holds the x5c chain); the bench uses one chain. */
const keys = new Map<string, Promise<Es256VerifyingKey>>();

Deno.serve({ port, hostname, onListen: () => {} }, handle);

/** The fields of the App Store's answers that hold JWS. */
interface StoreaAnswer {
  signedTransactionInfo: string;
  data: { lastTransactions: { signedTransactionInfo: string; signedRenewalInfo: string }[] }[];
  signedTransactions: string[];
}

/** Where each endpoint's call goes, and where its answer holds the JWS to check. */
const ROUTES: Record<
  string,
  { path: (id: string) => string; jws: (answer: StoreaAnswer) => string[] }
> = {
  "/v1/storea/verify": {
    path: (id) => `/inApps/v1/transactions/${id}`,
    jws: (answer) => [answer.signedTransactionInfo],
  },
  "/v1/storea/subscriptions": {
    path: (id) => `/inApps/v1/subscriptions/${id}`,
    jws: (answer) =>
      answer.data.flatMap((group) =>
        group.lastTransactions.flatMap((last) => [
          last.signedTransactionInfo,
          last.signedRenewalInfo,
        ])
      ),
  },
  "/v1/storea/history": {
    path: (id) => `/inApps/v2/history/${id}?sort=ASCENDING`,
    jws: (answer) => answer.signedTransactions,
  },
};

/** Forwards one request upstream, checks each returned JWS's signature, answers the body. */
async function handle(request: Request): Promise<Response> {
  const route = ROUTES[new URL(request.url).pathname];
  if (request.method !== "POST" || route === undefined || storeaUrl === undefined) {
    return new Response(null, { status: 404 });
  }
  const body = await request.json();
  const url = `${storeaUrl}${route.path(encodeURIComponent(body.transactionId))}`;
  const upstream = await fetch(url, { headers: { authorization, accept: "application/json" } });
  const text = await upstream.text();
  for (const jws of route.jws(JSON.parse(text))) {
    const [header, payload, signature] = jws.split(".");
    const key = await leafKey(header);
    const valid = await key.verify(
      Uint8Array.fromBase64(signature, { alphabet: "base64url" }),
      encoder.encode(`${header}.${payload}`),
    );
    if (!valid) return new Response(null, { status: 502 });
  }
  return new Response(text, { status: upstream.status, headers: JSON_HEADERS });
}

/** The OpenSSL key of the leaf certificate `x5c[0]` of a JWS header, imported once. */
function leafKey(header: string): Promise<Es256VerifyingKey> {
  let key = keys.get(header);
  if (key === undefined) {
    const { x5c } = JSON.parse(
      new TextDecoder().decode(Uint8Array.fromBase64(header, { alphabet: "base64url" })),
    );
    const leaf = new X509Certificate(Uint8Array.fromBase64(x5c[0]));
    const spki = leaf.publicKey.export({ type: "spki", format: "der" });
    key = importEs256Key(new Uint8Array(spki), "openssl");
    keys.set(header, key);
  }
  return key;
}
