/**
 * Callback URLs as written (src/delivery/callback_url.ts) under each policy, and URLs cut to
 * what may be logged or stored.
 */
import assert from "node:assert/strict";
import { callbackUrlProblem, withoutUrlSecrets } from "../src/delivery/callback_url.ts";
import type { CallbackPolicy } from "../src/delivery/callback_policy.ts";

const STRICT: CallbackPolicy = { allowHttp: false, allowPrivateNetworks: false };
const HTTP_ONLY: CallbackPolicy = { allowHttp: true, allowPrivateNetworks: false };
const PRIVATE_ONLY: CallbackPolicy = { allowHttp: false, allowPrivateNetworks: true };
const OPEN: CallbackPolicy = { allowHttp: true, allowPrivateNetworks: true };

Deno.test("callback URLs: always an http(s) URL without credentials or fragment", () => {
  for (const policy of [STRICT, OPEN]) {
    assert.equal(callbackUrlProblem("not a url", policy), "is not a URL");
    assert.equal(callbackUrlProblem("ftp://hooks.example.com/x", policy), "must be an http(s) URL");
    assert.equal(
      callbackUrlProblem("https://user:pass@hooks.example.com/x", policy),
      "must not carry credentials",
    );
    assert.equal(
      callbackUrlProblem("https://hooks.example.com/x#top", policy),
      "must not have a fragment",
    );
    assert.equal(callbackUrlProblem("https://hooks.example.com/relay?token=1", policy), null);
  }
});

Deno.test("callback URLs: http and private addresses are allowed separately", () => {
  const http = "http://hooks.example.com/x";
  const loopback = "https://127.0.0.1:8443/x";
  assert.equal(callbackUrlProblem(http, STRICT), "must use https");
  assert.equal(callbackUrlProblem(http, HTTP_ONLY), null);
  assert.equal(callbackUrlProblem(http, PRIVATE_ONLY), "must use https");
  assert.match(callbackUrlProblem(loopback, STRICT) ?? "", /127\.0\.0\.0\/8 \(Loopback\)/);
  assert.match(callbackUrlProblem(loopback, HTTP_ONLY) ?? "", /Loopback/);
  assert.equal(callbackUrlProblem(loopback, PRIVATE_ONLY), null);
  // Development's default: both on, so a local receiver works.
  assert.equal(callbackUrlProblem("http://localhost:3000/webhooks", OPEN), null);
  assert.equal(
    callbackUrlProblem("http://localhost:3000/webhooks", HTTP_ONLY),
    "must not point at localhost",
  );
});

Deno.test("callback URLs: every special-purpose address form is refused as written", () => {
  for (
    const url of [
      "https://localhost/x",
      "https://localhost./x",
      "https://api.localhost/x",
      "https://127.0.0.1/x",
      "https://10.1.2.3/x",
      "https://100.64.0.1/x",
      "https://172.16.0.1/x",
      "https://192.168.1.1/x",
      "https://169.254.169.254/latest",
      "https://198.18.0.1/",
      "https://192.0.2.1/",
      "https://0.0.0.0/",
      "https://240.0.0.1/",
      "https://255.255.255.255/",
      "https://224.0.0.1/",
      "https://2852039166/",
      "https://0xa9.0xfe.0xa9.0xfe/",
      "https://0251.0376.0251.0376/",
      "https://[::1]/x",
      "https://[::]/x",
      "https://[fd00::1]/x",
      "https://[fe80::1]/x",
      "https://[ff02::1]/x",
      "https://[100::1]/x",
      "https://[2001:db8::1]/x",
      "https://[::ffff:127.0.0.1]/x",
      "https://[::ffff:8.8.8.8]/x",
      "https://[64:ff9b::a9fe:a9fe]/",
      "https://[64:ff9b:1::808:808]/",
      "https://[::a9fe:a9fe]/",
      "https://[2002:a9fe:a9fe::]/",
      "https://[2001::1]/",
    ]
  ) {
    assert.notEqual(callbackUrlProblem(url, STRICT), null, url);
    assert.notEqual(callbackUrlProblem(url, HTTP_ONLY), null, url);
  }
  for (
    const url of [
      "https://hooks.example.com/x",
      "https://8.8.8.8/x",
      "https://[2606:4700:4700::1111]/x",
      "https://[64:ff9b::808:808]/x",
      "https://192.0.0.9/x",
    ]
  ) {
    assert.equal(callbackUrlProblem(url, STRICT), null, url);
  }
});

Deno.test("callback URLs: what may be logged or stored has no query, credentials or fragment", () => {
  const cases: [string, string][] = [
    [
      "error sending request for url (https://hooks.example.com/x?token=s3cret): client error",
      "error sending request for url (https://hooks.example.com/x): client error",
    ],
    [
      "for https://user:pw@hooks.example.com:8443/x?token=s3cret#frag (10.0.0.1:8443): reset",
      "for https://hooks.example.com:8443/x (10.0.0.1:8443): reset",
    ],
    ["see HTTP://U:P@H.example/A?B=s3cret.", "see HTTP://H.example/A."],
    ["http://h.example?x=s3cret", "http://h.example"],
    ["tricky https://h.example/x?a=b)s3cret end", "tricky https://h.example/x end"],
    ["connect ECONNREFUSED 127.0.0.1:9", "connect ECONNREFUSED 127.0.0.1:9"],
    ["a question? token=1", "a question? token=1"],
  ];
  for (const [text, expected] of cases) {
    assert.equal(withoutUrlSecrets(text), expected);
    assert.ok(!withoutUrlSecrets(text).includes("s3cret"));
  }
});
