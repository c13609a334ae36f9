/** Store A normalization of the verify response's `transaction`, and the coalescing primitive. */
import assert from "node:assert/strict";
import { normalizeTransaction, priceInMinorUnits } from "../src/storea/transaction.ts";
import { SingleFlight } from "../src/lib/single_flight.ts";

Deno.test("price goes from milli-units to the currency's smallest unit", () => {
  assert.equal(priceInMinorUnits(9990, "USD"), 999);
  assert.equal(priceInMinorUnits(1200000, "JPY"), 1200);
  assert.equal(priceInMinorUnits(1990, "KWD"), 1990);
  assert.equal(priceInMinorUnits(4990, "EUR"), 499);
  assert.equal(priceInMinorUnits(0, "USD"), 0);
  // Rounded to an integer when Apple's milli-units carry more precision than the currency.
  assert.equal(priceInMinorUnits(9995, "USD"), 1000);
  assert.equal(priceInMinorUnits(1500, "JPY"), 2);
  // A code the table does not know falls back to two decimals rather than failing the request.
  assert.equal(priceInMinorUnits(9990, "XYZ"), 999);
  assert.equal(priceInMinorUnits(9990, "not a currency"), 999);
});

Deno.test("price exponents are ISO 4217's, where Intl (CLDR) disagrees too", () => {
  // 12.345 units of each currency in Apple's milli-units, in the currency's smallest unit.
  const byExponent = { 0: 12, 2: 1235, 3: 12_345, 4: 123_450 };
  const exponents: [string, keyof typeof byExponent][] = [
    ["IQD", 3],
    ["RSD", 2],
    ["LBP", 2],
    ["ALL", 2],
    ["MMK", 2],
    ["LAK", 2],
    ["YER", 2],
    ["SYP", 2],
    ["IRR", 2],
    ["AFN", 2],
    ["USD", 2],
    ["JPY", 0],
    ["KWD", 3],
    ["CLF", 4],
    ["XYZ", 2],
  ];
  for (const [currency, exponent] of exponents) {
    assert.equal(
      priceInMinorUnits(12_345, currency),
      byExponent[exponent],
      `${currency} has exponent ${exponent}`,
    );
  }
});

Deno.test("a full transaction is normalized field by field", () => {
  const payload = {
    transactionId: "2000000123",
    originalTransactionId: "2000000100",
    webOrderLineItemId: "2000000050",
    bundleId: "com.example.app",
    productId: "pro.monthly",
    subscriptionGroupIdentifier: "21345678",
    purchaseDate: 1700000000000,
    originalPurchaseDate: 1690000000000,
    expiresDate: 1702592000000,
    quantity: 1,
    type: "Auto-Renewable Subscription",
    appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
    inAppOwnershipType: "PURCHASED",
    signedDate: 1700000001000,
    revocationDate: 1701000000000,
    revocationReason: 1,
    offerType: 1,
    offerIdentifier: "intro",
    environment: "Sandbox",
    transactionReason: "RENEWAL",
    storefront: "USA",
    storefrontId: "143441",
    price: 9990,
    currency: "USD",
    appTransactionId: "704289337612484093",
  };
  const normalized = normalizeTransaction(payload, "jws-text");
  assert.deepEqual(normalized, {
    transactionId: "2000000123",
    originalTransactionId: "2000000100",
    bundleId: "com.example.app",
    productId: "pro.monthly",
    purchaseDate: "2023-11-14T22:13:20.000Z",
    originalPurchaseDate: "2023-07-22T04:26:40.000Z",
    expiresDate: "2023-12-14T22:13:20.000Z",
    type: "Auto-Renewable Subscription",
    inAppOwnershipType: "PURCHASED",
    quantity: 1,
    webOrderLineItemId: "2000000050",
    revocationDate: "2023-11-26T12:00:00.000Z",
    revocationReason: 1,
    offerType: 1,
    offerIdentifier: "intro",
    appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138",
    storefront: "USA",
    storefrontId: "143441",
    transactionReason: "RENEWAL",
    currency: "USD",
    price: 999,
    signedTransactionInfo: "jws-text",
    rawDecodedPayload: payload,
  });
  // Every upstream field survives unchanged, milli-units included.
  assert.equal(normalized.rawDecodedPayload.price, 9990);
  assert.equal(normalized.rawDecodedPayload.subscriptionGroupIdentifier, "21345678");
});

Deno.test("absent optional fields are null, never missing", () => {
  const normalized = normalizeTransaction({
    transactionId: "1",
    originalTransactionId: "1",
    bundleId: "com.example.app",
    productId: "coins.100",
    purchaseDate: 1700000000000,
    originalPurchaseDate: 1700000000000,
    type: "Consumable",
    inAppOwnershipType: "PURCHASED",
    quantity: 3,
  }, "jws");
  for (
    const field of [
      "expiresDate",
      "webOrderLineItemId",
      "revocationDate",
      "revocationReason",
      "offerType",
      "offerIdentifier",
      "appAccountToken",
      "storefront",
      "storefrontId",
      "transactionReason",
      "currency",
      "price",
    ] as const
  ) {
    assert.equal(normalized[field], null, field);
  }
  assert.equal(normalized.quantity, 3);
});

Deno.test("identical calls in flight share one execution; later calls start a new one", async () => {
  const flights = new SingleFlight();
  let calls = 0;
  const gate = Promise.withResolvers<void>();
  const call = async () => {
    calls++;
    await gate.promise;
    return { answer: calls };
  };
  const together = [flights.run("a", call), flights.run("a", call), flights.run("a", call)];
  const other = flights.run("b", call);
  assert.equal(flights.size, 2);
  gate.resolve();
  const results = await Promise.all(together);
  assert.equal(calls, 2);
  assert.ok(results.every((result) => result === results[0]));
  await other;
  assert.equal(flights.size, 0);
  await flights.run("a", call);
  assert.equal(calls, 3);

  // A failure reaches every waiter and is not remembered.
  const failing = () => Promise.reject(new Error("upstream down"));
  await Promise.all([
    assert.rejects(flights.run("c", failing), /upstream down/),
    assert.rejects(flights.run("c", failing), /upstream down/),
  ]);
  assert.equal(flights.size, 0);
});
