/**
 * An attacker posts store A notifications whose `x5c` is Apple's real public chain, padded with
 * whitespace (a distinct padding each time) or swollen past any real certificate's size, with a
 * signature that cannot verify. Each is refused 401 `SIGNATURE_INVALID`, and the service's
 * memory and CPU stay flat: nothing is cached and no chain is checked for a JWS whose signature
 * failed. The figures are printed on a `resilience x5c-flood` line.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import type { Es256Engine } from "../../src/crypto/es256.ts";
import { ENGINE, readProcFile, startService, stopAndDrop } from "../helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "../helpers/fixtures.ts";
import { assertError, cliOk, postJson } from "../helpers/relay.ts";

const REQUESTS = 300;
/** Whitespace added to each certificate of a padded chain, on average. */
const PADDING_CHARS = 120_000;
/**
 * Generous bounds: refusing these costs about 20 MB of transient heap (the bodies are 0.5 MB
 * each) and 1 to 2 ms of CPU per request on PostgreSQL; checking and caching every presented
 * chain cost about 160 MB and 9 ms per request.
 *
 * The service on the embedded engine runs V8 with a 2 MB young generation (src/process/permissions.ts),
 * in which each 0.5 MB body costs several times the garbage collection: 6.5 to 9.4 ms per request
 * on a machine where PostgreSQL's run took 1.8 to 2.2 ms. The code that refuses them is the same
 * on both engines, so PostgreSQL's run holds the CPU bound that tells a chain check from none;
 * the embedded run's bounds catch gross regressions and any caching.
 */
const MAX_RSS_GROWTH_MB = 64;
const MAX_CPU_MS_PER_REQUEST = ENGINE === "embedded" ? 20 : 3;

const VECTORS = fileURLToPath(new URL("../fixtures/storea/", import.meta.url));

function segment(value: unknown): string {
  return new TextEncoder().encode(JSON.stringify(value)).toBase64({
    alphabet: "base64url",
    omitPadding: true,
  });
}

function decodeSegment(text: string): Record<string, unknown> {
  return JSON.parse(
    new TextDecoder().decode(Uint8Array.fromBase64(text, { alphabet: "base64url" })),
  );
}

/** A signature of the right length that verifies nothing. */
function garbageSignature(): string {
  return crypto.getRandomValues(new Uint8Array(64)).toBase64({
    alphabet: "base64url",
    omitPadding: true,
  });
}

/** `certificate` with whitespace spread through it: about `total` characters, never the same. */
function padded(certificate: string, total: number): string {
  const whitespace = [" ", "\n", "\t", "\r"];
  const pieces: string[] = [];
  const step = 64;
  const perPiece = Math.ceil(total / Math.ceil(certificate.length / step));
  for (let at = 0; at < certificate.length; at += step) {
    pieces.push(certificate.slice(at, at + step));
    const count = Math.floor(Math.random() * 2 * perPiece);
    pieces.push(whitespace[at % whitespace.length].repeat(count));
  }
  return pieces.join("");
}

/** The attack bodies: mostly padded chains, some with an oversized certificate. */
function attackPayloads(x5c: string[], payload: string, count: number): string[] {
  const payloads: string[] = [];
  for (let i = 0; i < count; i++) {
    let chain: string[];
    if (i % 10 === 9) {
      // An oversized leaf: Apple's leaf followed by 12 KB of other bytes, in canonical base64.
      const leaf = Uint8Array.fromBase64(x5c[0]);
      const swollen = new Uint8Array(leaf.length + 12 * 1024);
      swollen.set(leaf);
      swollen.set(crypto.getRandomValues(new Uint8Array(12 * 1024)), leaf.length);
      chain = [swollen.toBase64(), x5c[1], x5c[2]];
    } else if (i % 10 === 8) {
      // Lightly padded: a header small enough to be decoded, so strict base64 does the refusing.
      chain = x5c.map((certificate) => padded(certificate, 2_000));
    } else {
      chain = x5c.map((certificate) => padded(certificate, PADDING_CHARS));
    }
    payloads.push(`${segment({ alg: "ES256", x5c: chain })}.${payload}.${garbageSignature()}`);
  }
  return payloads;
}

/** Resident memory (VmRSS) and CPU time (utime + stime) of `pid`, from `/proc`. */
async function processUsage(pid: number): Promise<{ rssBytes: number; cpuMs: number }> {
  const status = await readProcFile(pid, "status");
  const rssKb = Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1]);
  // Fields 14 and 15 of /proc/<pid>/stat, counted after the command name's closing parenthesis.
  const stat = await readProcFile(pid, "stat");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  const { stdout } = await new Deno.Command("getconf", { args: ["CLK_TCK"] }).output();
  const ticksPerSecond = Number(new TextDecoder().decode(stdout).trim()) || 100;
  assert.ok(Number.isFinite(rssKb) && Number.isFinite(ticks), `unreadable /proc/${pid}`);
  return { rssBytes: rssKb * 1024, cpuMs: (ticks * 1000) / ticksPerSecond };
}

for (const cryptoEngine of ["openssl", "webcrypto"] satisfies Es256Engine[]) {
  Deno.test(`padded and oversized x5c with bad signatures are refused cheaply (${ENGINE}, ${cryptoEngine})`, async () => {
    // The genuine notification at the end was signed in 2025: an age limit that reaches it.
    const service = await startService({
      env: { CRYPTO_ENGINE: cryptoEngine, STOREA_NOTIFICATION_MAX_AGE: "36500d" },
    });
    const dir = await Deno.makeTempDir({ prefix: "pr-x5c-" });
    try {
      const tenant = await cliOk(service, "tenant", "create", "--name", "Target");
      const index = JSON.parse(await Deno.readTextFile(`${VECTORS}real-sandbox/index.json`));
      const credentials = storeaCredentialArgs(tenant.id, await writeStoreaKeyFile(dir));
      credentials[credentials.indexOf("--bundle-id") + 1] = index[0].bundleId;
      await cliOk(service, ...credentials);
      const url = `${service.url}/v1/webhooks/storea/${tenant.id}`;

      const real = (await Deno.readTextFile(`${VECTORS}real-sandbox/notification-01.jws`)).trim();
      const [realHeader, realPayload] = real.split(".");
      const x5c = decodeSegment(realHeader).x5c as string[];
      const attacks = attackPayloads(x5c, realPayload, REQUESTS);

      // Warm the service up on the same path, so the figures are the attack's alone.
      for (const signedPayload of attackPayloads(x5c, realPayload, 20)) {
        assertError(await postJson(url, { signedPayload }), 401, "SIGNATURE_INVALID");
      }
      const before = await processUsage(service.pid);
      for (const signedPayload of attacks) {
        const answer = await postJson(url, { signedPayload });
        assertError(answer, 401, "SIGNATURE_INVALID");
      }
      const after = await processUsage(service.pid);

      const rssGrowthMb = (after.rssBytes - before.rssBytes) / 1024 / 1024;
      const cpuMsPerRequest = (after.cpuMs - before.cpuMs) / REQUESTS;
      console.log(
        `resilience x5c-flood: ${REQUESTS} requests (${cryptoEngine}, ${ENGINE}), ` +
          `RSS +${rssGrowthMb.toFixed(1)} MB, CPU ${cpuMsPerRequest.toFixed(2)} ms/request`,
      );
      assert.ok(
        rssGrowthMb < MAX_RSS_GROWTH_MB,
        `RSS grew ${rssGrowthMb.toFixed(1)} MB over ${REQUESTS} refused requests`,
      );
      assert.ok(
        cpuMsPerRequest < MAX_CPU_MS_PER_REQUEST,
        `each refused request cost ${cpuMsPerRequest.toFixed(2)} ms of CPU`,
      );

      // Apple's own notification is still accepted: the refusals did not break the verifier.
      const genuine = await postJson(url, { signedPayload: real });
      assert.equal(genuine.status, 200, JSON.stringify(genuine.json));
    } finally {
      await stopAndDrop(service);
      await Deno.remove(dir, { recursive: true });
    }
  });
}
