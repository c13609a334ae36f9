/**
 * The callback client against callbacks that answer byte by byte as scripted: well-formed answers
 * in every framing HTTP/1.1 has, and the malformed, endless and conflicting ones a hostile callback
 * can send. Every answer must end in a status or a clear error within bounded reads, and a
 * connection is kept only when its answer was read to its end.
 */
import assert from "node:assert/strict";
import {
  CallbackAnswerError,
  CallbackConnections,
  type CallbackPost,
  IDLE_CONNECTION_MS,
  postToCallback,
} from "../src/delivery/callback_client.ts";
import { type Script, scriptedCallback, text } from "./helpers/scripted_callback.ts";

function target(url: string) {
  return { url: new URL(url), host: "127.0.0.1", addresses: ["127.0.0.1"] };
}

function post(overrides: Partial<CallbackPost> = {}): CallbackPost {
  return {
    headers: { "content-type": "application/json" },
    body: text('{"event":"test"}'),
    bodyLimit: 4096,
    signal: AbortSignal.timeout(5_000),
    ...overrides,
  };
}

/** Sends `count` POSTs one after the other on one pool; returns the answers. */
async function postTimes(url: string, count: number) {
  const connections = new CallbackConnections();
  try {
    const answers = [];
    for (let i = 0; i < count; i++) {
      answers.push(await postToCallback(target(url), post(), connections));
    }
    return answers;
  } finally {
    connections.close();
  }
}

/**
 * `count` POSTs one after the other on one pool to a callback answering as `script` says, or with
 * the same text to every request.
 */
async function exchanges(script: Script | string, count: number) {
  const callback = scriptedCallback(typeof script === "string" ? () => text(script) : script);
  try {
    return { answers: await postTimes(callback.url, count), requests: callback.requests };
  } finally {
    await callback.close();
  }
}

Deno.test("callback client: every framing of a body is read, and its connection kept when whole", async (t) => {
  await t.step("content-length", async () => {
    const { answers, requests } = await exchanges(
      "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
      3,
    );
    assert.deepEqual(answers.map((a) => [a.status, a.bodyPrefix]), [[200, "ok"], [200, "ok"], [
      200,
      "ok",
    ]]);
    assert.deepEqual(requests, [3]);
  });
  await t.step("chunked, with extensions and trailers, in pieces", async () => {
    const { answers, requests } = await exchanges(async function* () {
      yield text("HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n");
      yield text("4\r\ndefg\r\n0\r\nx-trailer: 1\r\n\r\n");
    }, 2);
    assert.deepEqual(answers.map((a) => [a.status, a.bodyPrefix]), [[202, "abcdefg"], [
      202,
      "abcdefg",
    ]]);
    assert.deepEqual(requests, [2]);
  });
  await t.step("no body: 204, and interim answers before the final one", async () => {
    const { answers, requests } = await exchanges(
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" +
        "HTTP/1.1 204 No Content\r\nretry-after: 3\r\n\r\n",
      2,
    );
    assert.deepEqual(answers, [{ status: 204, retryAfter: "3", bodyPrefix: null }, {
      status: 204,
      retryAfter: "3",
      bodyPrefix: null,
    }]);
    assert.deepEqual(requests, [2]);
  });
  await t.step("ended by closing the connection: read up to the limit, never kept", async () => {
    const { answers, requests } = await exchanges(async function* () {
      yield text("HTTP/1.1 500 Oops\r\n\r\nshort body");
      yield new Uint8Array(0);
    }, 2);
    assert.deepEqual(answers.map((a) => [a.status, a.bodyPrefix]), [[500, "short body"], [
      500,
      "short body",
    ]]);
    assert.deepEqual(requests, [1, 1]);
  });
});

Deno.test("callback client: an answer not read to its end closes its connection", async (t) => {
  await t.step("a body longer than the limit", async () => {
    const { answers, requests } = await exchanges(
      `HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n${"é".repeat(5000)}`,
      2,
    );
    // 4096 bytes: 2048 two-byte characters.
    assert.equal(answers[0].bodyPrefix, "é".repeat(2048));
    assert.deepEqual(requests, [1, 1]);
  });
  await t.step("bytes beyond the answer", async () => {
    const { requests } = await exchanges("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", 2);
    assert.deepEqual(requests, [1, 1]);
  });
  await t.step("both a content-length and chunks", async () => {
    const { answers, requests } = await exchanges(
      "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n" +
        "2\r\nok\r\n0\r\n\r\n",
      2,
    );
    assert.equal(answers[0].bodyPrefix, "ok", "read as chunked");
    assert.deepEqual(requests, [1, 1]);
  });
  await t.step("the callback asked to close it", async () => {
    const { requests } = await exchanges(
      "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
      2,
    );
    assert.deepEqual(requests, [1, 1]);
  });
});

Deno.test("callback client: a connection idle for 30 s is not used again", async () => {
  const callback = scriptedCallback(() => text("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"));
  let clock = 0;
  const connections = new CallbackConnections({ now: () => clock });
  try {
    await postToCallback(target(callback.url), post(), connections);
    clock += IDLE_CONNECTION_MS - 1;
    await postToCallback(target(callback.url), post(), connections);
    assert.deepEqual(callback.requests, [2], "reused within the period");
    clock += IDLE_CONNECTION_MS;
    await postToCallback(target(callback.url), post(), connections);
    assert.deepEqual(callback.requests, [2, 1], "a new connection after it");
  } finally {
    connections.close();
    await callback.close();
  }
});

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Rejects when `promise` has not settled within `ms`. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("callback client: bytes nobody asked for never answer the next request", async (t) => {
  // A callback answers 500 and then writes, unasked, a 200 on the connection the client keeps:
  // the next request on that connection, which may be another tenant's delivery to the same
  // host, would read that 200 as its answer. Every other request is answered 503 "real".
  const stray = "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ndelivered";
  const real = { status: 503, retryAfter: null, bodyPrefix: "real" };
  const strayAfter500 = async (options: { strayAfterMs: number; nextAfterMs: number }) => {
    const { promise: strayWritten, resolve } = Promise.withResolvers<void>();
    const callback = scriptedCallback((request, connection) =>
      connection === 0 && request === 0
        ? (async function* () {
          yield text("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops");
          if (options.strayAfterMs > 0) await delay(options.strayAfterMs);
          yield text(stray);
          resolve();
        })()
        : text("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nreal")
    );
    const connections = new CallbackConnections();
    try {
      const first = await postToCallback(target(callback.url), post(), connections);
      assert.equal(first.status, 500);
      await strayWritten;
      if (options.nextAfterMs > 0) await delay(options.nextAfterMs);
      const second = await postToCallback(target(callback.url), post(), connections);
      assert.deepEqual(second, real, "the unasked 200 was taken as the answer");
      assert.deepEqual(callback.requests, [1, 1], "the second request went on a new connection");
    } finally {
      connections.close();
      await callback.close();
    }
  };
  await t.step("written a few ms after the answer, the next request at once", async () => {
    // The 200 is in the client's socket, but the runtime has not yet delivered the idle read
    // that holds it when the next attempt takes the connection.
    await strayAfter500({ strayAfterMs: 5, nextAfterMs: 0 });
  });
  await t.step("written a few ms after the answer, the next request later", async () => {
    await strayAfter500({ strayAfterMs: 5, nextAfterMs: 50 });
  });
  await t.step("written at once after the answer, in a write of its own", async () => {
    await strayAfter500({ strayAfterMs: 0, nextAfterMs: 0 });
  });
});

Deno.test("callback client: a kept connection is closed by what it receives while idle", async (t) => {
  const ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
  const idleThen = async (after: Uint8Array) => {
    const callback = scriptedCallback((request, connection) =>
      connection === 0 && request === 0
        ? (async function* () {
          yield text(ok);
          await delay(10);
          yield after;
        })()
        : text(ok)
    );
    const connections = new CallbackConnections();
    try {
      assert.equal((await postToCallback(target(callback.url), post(), connections)).status, 200);
      if (after.length > 0) {
        // Closed by the client while idle, with no request on it.
        await within(callback.clientClosed(0), 2_000, "the client closing the connection");
      } else {
        await delay(50);
      }
      assert.deepEqual(callback.requests, [1]);
      const next = await postToCallback(target(callback.url), post(), connections);
      assert.deepEqual(next, { status: 200, retryAfter: null, bodyPrefix: "ok" });
      assert.deepEqual(callback.requests, [1, 1], "the next request went on a new connection");
    } finally {
      connections.close();
      await callback.close();
    }
  };
  await t.step("one byte", async () => {
    await idleThen(text("x"));
  });
  await t.step("the end of the stream", async () => {
    // The script's empty chunk closes the callback's end, as a callback's idle timeout does.
    await idleThen(new Uint8Array(0));
  });
});

Deno.test("callback client: a hostile answer is refused within bounded reads", async (t) => {
  const refused = async (script: Script, message: RegExp) => {
    const callback = scriptedCallback(script);
    try {
      const started = performance.now();
      await assert.rejects(
        postToCallback(target(callback.url), post()),
        (error: unknown) => error instanceof CallbackAnswerError && message.test(error.message),
      );
      assert.ok(performance.now() - started < 4_000, "refused well before the deadline");
      return callback.written();
    } finally {
      await callback.close();
    }
  };
  await t.step("headers that never end", async () => {
    const written = await refused(async function* () {
      yield text("HTTP/1.1 200 OK\r\n");
      for (let i = 0; i < 10_000; i++) yield text(`x-filler-${i}: ${"a".repeat(1000)}\r\n`);
    }, /headers are too large/);
    // Refused before the 10 MB offered were read: the rest never left the callback.
    assert.ok(written < 10_000 * 1000, `the callback wrote ${written} bytes`);
  });
  await t.step("a header line that never ends", async () => {
    await refused(async function* () {
      yield text("HTTP/1.1 200 OK\r\nx-long: ");
      for (let i = 0; i < 10_000; i++) yield text("a".repeat(1000));
    }, /line is too long|headers are too large/);
  });
  await t.step("interim answers that never end", async () => {
    await refused(async function* () {
      for (let i = 0; i < 100_000; i++) yield text("HTTP/1.1 100 Continue\r\n\r\n");
    }, /headers are too large/);
  });
  await t.step("two content-lengths that disagree", async () => {
    await refused(
      () => text("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nokk"),
      /content-length is not valid/,
    );
  });
  await t.step("a content-length that is not a number", async () => {
    await refused(
      () => text("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"),
      /content-length is not valid/,
    );
  });
  await t.step("an answer that is not HTTP", async () => {
    await refused(() => text("SSH-2.0-OpenSSH_9.2\r\n\r\n"), /not HTTP/);
  });
  await t.step("a header line without a name", async () => {
    await refused(() => text("HTTP/1.1 200 OK\r\n: nameless\r\n\r\n"), /no name/);
  });
});

Deno.test("callback client: a request header cannot carry a line of its own", async (t) => {
  // Each character alone, so that a check that forgot one of them fails here: a server may end a
  // line at a bare LF or CR, and a NUL cuts a value short in some of them.
  for (
    const [name, value] of [
      ["CRLF", "a\r\nx-injected: 1"],
      ["a lone LF", "a\nx-injected: 1"],
      ["a lone CR", "a\rx-injected: 1"],
      ["a NUL", "a\0x-injected: 1"],
    ]
  ) {
    await t.step(name, async () => {
      const callback = scriptedCallback(() => text("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
      try {
        await assert.rejects(
          postToCallback(target(callback.url), post({ headers: { "x-service-event": value } })),
          /invalid request header/,
        );
        assert.deepEqual(callback.requests, [], "nothing was sent");
      } finally {
        await callback.close();
      }
    });
  }
});

Deno.test("callback client: a body cut short or malformed keeps the status, not the body", async (t) => {
  const answered = async (script: Script | string) => {
    const { answers, requests } = await exchanges(script, 2);
    assert.deepEqual(requests, [1, 1], "the connection was not kept");
    return answers[0];
  };
  await t.step("the connection closed mid-body", async () => {
    const answer = await answered(async function* () {
      yield text("HTTP/1.1 503 Busy\r\nretry-after: 9\r\ncontent-length: 100\r\n\r\npartial");
      yield new Uint8Array(0);
    });
    assert.deepEqual(answer, { status: 503, retryAfter: "9", bodyPrefix: null });
  });
  await t.step("a chunk size that is not hex", async () => {
    const answer = await answered(
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    );
    assert.deepEqual(answer, { status: 200, retryAfter: null, bodyPrefix: null });
  });
  await t.step("a chunk that does not end where its size says", async () => {
    const answer = await answered(
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n",
    );
    assert.deepEqual(answer, { status: 200, retryAfter: null, bodyPrefix: null });
  });
});
