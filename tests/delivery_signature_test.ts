/** The delivery signature (docs/deliveries.md, "What is signed"). */
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { sign, signatureHeader } from "../src/delivery/signature.ts";
import { checkSignature, verifySignature } from "../simulators/webhook_signature.ts";

const SECRET = "whsec_0123456789abcdef0123456789abcdef";
const BODY = '{"event":"test","eventId":"evt_01JD3Q8Z9V6B2M4K7T1XW5N0RC"}';

Deno.test("v1 is the hex HMAC-SHA256 of `<t>.<body>` keyed with the secret's UTF-8", () => {
  const expected = createHmac("sha256", Buffer.from(SECRET, "utf8"))
    .update(`1700000000.${BODY}`, "utf8").digest("hex");
  assert.equal(sign(SECRET, 1700000000, BODY), expected);
  assert.match(expected, /^[0-9a-f]{64}$/);
  assert.equal(signatureHeader([SECRET], 1700000000, BODY), `t=1700000000,v1=${expected}`);
});

Deno.test("during a rotation both signatures are sent, the new one first", () => {
  const header = signatureHeader(["new-secret", "old-secret"], 1700000000, BODY);
  assert.equal(
    header,
    `t=1700000000,v1=${sign("new-secret", 1700000000, BODY)},v1=${
      sign("old-secret", 1700000000, BODY)
    }`,
  );
  const options = { nowSeconds: 1700000010 };
  assert.ok(verifySignature("new-secret", header, BODY, options));
  assert.ok(verifySignature("old-secret", header, BODY, options));
  assert.ok(!verifySignature("other-secret", header, BODY, options));
});

Deno.test("a receiver refuses changed bodies, old timestamps and malformed headers", () => {
  const header = signatureHeader([SECRET], 1700000000, BODY);
  assert.ok(verifySignature(SECRET, header, BODY, { nowSeconds: 1700000299 }));
  assert.ok(!verifySignature(SECRET, header, BODY, { nowSeconds: 1700000301 }));
  assert.ok(!verifySignature(SECRET, header, BODY + " ", { nowSeconds: 1700000000 }));
  assert.ok(!verifySignature(SECRET, null, BODY));
  assert.ok(!verifySignature(SECRET, "v1=abc", BODY, { nowSeconds: 1700000000 }));
  assert.ok(!verifySignature(SECRET, "t=1700000000,v1=zz", BODY, { nowSeconds: 1700000000 }));
  // The timestamp is part of what is signed: moving it invalidates the signature.
  const moved = header.replace("t=1700000000", "t=1700000100");
  assert.ok(!verifySignature(SECRET, moved, BODY, { nowSeconds: 1700000100 }));
});

Deno.test("checkSignature says why it refuses, in the documented order", () => {
  const t0 = 1700000000;
  const header = signatureHeader([SECRET], t0, BODY);
  const at = { nowSeconds: t0 };
  const reason = (secret: string | string[], h: string | null, body = BODY, options = at) =>
    checkSignature(secret, h, body, options).reason;
  assert.deepEqual(checkSignature(SECRET, header, BODY, at), { valid: true, reason: null });
  assert.equal(reason(SECRET, null), "no_header");
  assert.equal(reason(SECRET, ""), "no_header");
  for (
    const malformed of [
      "garbage",
      header.split(",")[1], // no t
      `t=${t0}`, // no v1
      `t=abc,${header.split(",")[1]}`,
      `t=${t0}.5,${header.split(",")[1]}`,
      `t=${t0},t=${t0},${header.split(",")[1]}`, // two timestamps
      `t=${t0},v1=zz`, // a v1 that is not hex
      `t=${t0},v1=abc`, // odd length
      `t=${t0},v2=${sign(SECRET, t0, BODY)}`, // only an unknown scheme
    ]
  ) {
    assert.equal(reason(SECRET, malformed), "malformed_header", malformed);
  }
  // The timestamp is checked before any HMAC, whatever the secret.
  assert.equal(
    reason(SECRET, header, BODY, { nowSeconds: t0 + 301 }),
    "timestamp_outside_tolerance",
  );
  assert.equal(
    reason("other", header, BODY, { nowSeconds: t0 - 301 }),
    "timestamp_outside_tolerance",
  );
  assert.equal(reason(SECRET, header, BODY + " "), "no_matching_signature");
  assert.equal(reason("other-secret", header), "no_matching_signature");
  assert.equal(reason([], header), "no_matching_signature");
  assert.equal(reason(SECRET, `t=${t0},v1=${"0".repeat(64)}`), "no_matching_signature");
  // Several secrets, as a receiver holds during a rotation: any one matching is enough.
  assert.equal(reason(["other-secret", SECRET], header), null);
  // Unknown keys and spaces around the parts are tolerated.
  assert.equal(reason(SECRET, ` ${header.replace(",", " , v2=00 , ")} `), null);
});
