/**
 * One delivery attempt in a process of its own, so that it can trust a test CA (`DENO_CERT` is
 * read at startup): `deno run --allow-net tests/helpers/send_delivery_child.ts JSON`, where JSON is
 * `{"url": ..., "addresses": [...]}`, the addresses being what the name resolves to. Prints the
 * attempt's result as JSON.
 */
import { sendDelivery } from "../../src/delivery/sender.ts";

const { url, addresses } = JSON.parse(Deno.args[0]);
const result = await sendDelivery({
  callbackUrl: url,
  payload: '{"event":"test"}',
  event: "test",
  eventId: "evt_X",
  secrets: ["whsec_test_secret_of_at_least_32_characters"],
}, {
  version: "dev",
  timeoutMs: 5_000,
  policy: { allowHttp: true, allowPrivateNetworks: true },
  resolve: () => Promise.resolve(addresses),
});
console.log(JSON.stringify(result));
