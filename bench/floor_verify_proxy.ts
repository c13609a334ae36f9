/**
 * The floor of `POST /v1/storea/verify` for `bench/verify.ts`: the bare proxy
 * (`bench/bare_verify_proxy.ts`) plus the one piece of work a store A verification cannot do
 * without, the ES256 check of the `signedTransactionInfo` the App Store returned, done with the
 * service's own OpenSSL binding (`src/crypto/es256.ts`). Nothing else: no API key, schema, rate
 * limit, chain check, payload decoding, normalization or log.
 *
 * Per POST it reads the JSON body, makes the same upstream call as the bare proxy, parses the
 * answer, finds the leaf key of the JWS (imported once per distinct JWS header, that is per
 * certificate chain, as the service caches its chains), checks the signature over
 * `header.payload`, and returns the upstream's body as is; 502 if the signature does not verify.
 * It is the cheapest honest way we know to do what store A verification must do per request: the
 * gap between it and the service is what the service's pipeline adds to the required work.
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

/** Forwards one verify request upstream, checks the returned JWS's signature, answers the body. */
async function handle(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  if (request.method !== "POST" || path !== "/v1/storea/verify" || storeaUrl === undefined) {
    return new Response(null, { status: 404 });
  }
  const body = await request.json();
  const url = `${storeaUrl}/inApps/v1/transactions/${encodeURIComponent(body.transactionId)}`;
  const upstream = await fetch(url, { headers: { authorization, accept: "application/json" } });
  const text = await upstream.text();
  const jws: string = JSON.parse(text).signedTransactionInfo;
  const [header, payload, signature] = jws.split(".");
  const key = await leafKey(header);
  const valid = await key.verify(
    Uint8Array.fromBase64(signature, { alphabet: "base64url" }),
    encoder.encode(`${header}.${payload}`),
  );
  if (!valid) return new Response(null, { status: 502 });
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
