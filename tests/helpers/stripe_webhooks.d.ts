/**
 * The part of the stripe npm package's types that tests/delivery_examples_test.ts uses. The
 * package's own types pull in Node's, whose `CryptoKey` conflicts with Deno's in `deno check`.
 */
declare const Stripe: {
  webhooks: {
    /** Verifies a `t=...,v1=...` header over `payload` and returns the parsed payload. */
    constructEventAsync(
      payload: string | Uint8Array,
      header: string,
      secret: string,
      toleranceSeconds?: number,
    ): Promise<unknown>;
  };
};
export default Stripe;
