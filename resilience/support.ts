/**
 * What the resilience tests share: a relay fixture (store A test PKI, signer, a tenant with a
 * callback and credentials), a load generator that sends notifications the way a store does
 * (and remembers which were acknowledged), a TCP proxy in front of PostgreSQL that a test can cut
 * or partition, and the per-event tally of what a callback receiver accepted.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { RunningService } from "../tests/helpers/service.ts";
import { storeaCredentialArgs, writeStoreaKeyFile } from "../tests/helpers/fixtures.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../simulators/storea_pki.ts";
import { StoreaSigner } from "../simulators/storea_signer.ts";
import type { CallbackReceiver } from "../simulators/callback_receiver.ts";

/** A store A signer and the service settings that make it trusted. */
export interface RelayFixture {
  signer: StoreaSigner;
  /** Service variables: the test root, a short retry schedule and delivery timeout. */
  env: Record<string, string>;
  /** A temporary directory holding the root certificate and the key file. */
  dir: string;
  keyFile: string;
  cleanup(): Promise<void>;
}

/** Makes a test PKI, its signer and the service variables that trust it. */
export async function relayFixture(env: Record<string, string> = {}): Promise<RelayFixture> {
  const dir = await Deno.makeTempDir({ prefix: "pr-resilience-" });
  const pki = await createStoreaTestPki();
  return {
    signer: new StoreaSigner(pki, { bundleId: "com.example.app" }),
    env: {
      STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
      DELIVERY_RETRY_SCHEDULE: "1s,1s,2s,5s",
      DELIVERY_TIMEOUT: "2s",
      LOG_LEVEL: "info",
      ...env,
    },
    dir,
    keyFile: await writeStoreaKeyFile(dir),
    cleanup: () => Deno.remove(dir, { recursive: true }).catch(() => {}),
  };
}

/** Creates a tenant with `callbackUrl` and store A credentials; the receiver learns its secret. */
export async function relayTenant(
  service: RunningService,
  fixture: RelayFixture,
  receiver: CallbackReceiver,
): Promise<string> {
  const created = await service.cli(
    "tenant",
    "create",
    "--name",
    "Resilience",
    "--callback-url",
    receiver.url,
  );
  assert.equal(created.code, 0, created.stderr);
  receiver.setSecrets([created.json.webhookSecret]);
  const credentials = await service.cli(...storeaCredentialArgs(created.json.id, fixture.keyFile));
  assert.equal(credentials.code, 0, credentials.stderr);
  return created.json.id;
}

/** A signed DID_RENEW notification of a fresh transaction, as the store sends it. */
export async function signedRenewal(signer: StoreaSigner): Promise<string> {
  return await signer.signNotification(
    await signer.notificationPayload({
      notificationType: "DID_RENEW",
      transaction: signer.sampleTransaction({}),
    }),
  );
}

/** Signs `count` distinct notifications (signing is not what these tests measure). */
export async function signedNotifications(signer: StoreaSigner, count: number): Promise<string[]> {
  const payloads: string[] = [];
  for (let i = 0; i < count; i++) payloads.push(await signedRenewal(signer));
  return payloads;
}

/** What the store saw for one notification: the last answer, and the event id once acknowledged. */
export interface SendOutcome {
  status: number | "network-error" | "timeout";
  eventId: string | null;
  /** How long the answer took, milliseconds. */
  latencyMs: number;
}

/**
 * POSTs one signed notification to a store A receiver as the store does: bounded by `timeoutMs`,
 * never throwing.
 */
export async function sendNotification(
  baseUrl: string,
  tenantId: string,
  signedPayload: string,
  timeoutMs = 15_000,
): Promise<SendOutcome> {
  const started = performance.now();
  try {
    const response = await fetch(`${baseUrl}/v1/webhooks/storea/${tenantId}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ signedPayload }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const body = await response.json();
    return {
      status: response.status,
      eventId: response.status === 200 ? body.eventId : null,
      latencyMs: performance.now() - started,
    };
  } catch (error) {
    const timedOut = error instanceof DOMException && error.name === "TimeoutError";
    return {
      status: timedOut ? "timeout" : "network-error",
      eventId: null,
      latencyMs: performance.now() - started,
    };
  }
}

/** Runs `work` over `items` with at most `concurrency` at a time. */
export async function forEachConcurrently<T>(
  items: readonly T[],
  concurrency: number,
  work: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, async () => {
    while (next < items.length) {
      const index = next++;
      await work(items[index], index);
    }
  }));
}

/** How many times the receiver accepted (answered 2xx) each event id. */
export function acceptedPerEvent(receiver: CallbackReceiver): Map<string, number> {
  const counts = new Map<string, number>();
  for (const delivery of receiver.accepted()) {
    const id = delivery.headers["x-service-event-id"];
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  return counts;
}

/** Waits until every event id in `eventIds` was accepted at least once, or fails. */
export async function waitUntilAllAccepted(
  receiver: CallbackReceiver,
  eventIds: Iterable<string>,
  timeoutMs: number,
): Promise<Map<string, number>> {
  const wanted = [...eventIds];
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const counts = acceptedPerEvent(receiver);
    const missing = wanted.filter((id) => !counts.has(id));
    if (missing.length === 0) return counts;
    if (Date.now() > deadline) {
      throw new Error(
        `${missing.length} of ${wanted.length} acknowledged events not delivered within ` +
          `${timeoutMs} ms (first: ${missing.slice(0, 3).join(", ")})`,
      );
    }
    await sleep(100);
  }
}

/** Percentile `p` (0..100) of `values`, nearest rank. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

/**
 * Prints one figure line of a resilience test, `resilience <test>: {json}`, so a run's output
 * carries the numbers reported in docs/benchmarks.md.
 */
export function reportFigures(test: string, figures: Record<string, unknown>): void {
  console.log(`resilience ${test}: ${JSON.stringify(figures)}`);
}

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * A TCP proxy on loopback in front of one target (PostgreSQL), which a test controls:
 * - `down()`: the database is gone. Open connections are dropped; new ones are accepted and
 *   closed at once, as a stopped server's host would refuse them.
 * - `partition()`: the network is gone. Connections stay open but nothing passes, either way,
 *   and new ones are held without reaching the target, until `restore()`.
 * - `restore()`: traffic flows again; held bytes are delivered, as TCP retransmission would.
 */
export class TcpProxy {
  readonly port: number;
  #listener: Deno.Listener;
  #targetPort: number;
  #state: "up" | "down" | "partitioned" = "up";
  #open = new Set<Deno.Conn>();
  #released: Promise<void> = Promise.resolve();
  #release: () => void = () => {};

  private constructor(listener: Deno.Listener, targetPort: number) {
    this.#listener = listener;
    this.#targetPort = targetPort;
    this.port = (listener.addr as Deno.NetAddr).port;
    void this.#acceptLoop();
  }

  /** Starts a proxy on a free loopback port forwarding to `127.0.0.1:targetPort`. */
  static start(targetPort: number): TcpProxy {
    return new TcpProxy(Deno.listen({ hostname: "127.0.0.1", port: 0 }), targetPort);
  }

  down(): void {
    this.#state = "down";
    for (const conn of this.#open) closeQuietly(conn);
    this.#open.clear();
    this.#release(); // pumps waiting in a partition see the closed sockets and stop
  }

  partition(): void {
    if (this.#state === "partitioned") return;
    this.#state = "partitioned";
    this.#released = new Promise((resolve) => this.#release = resolve);
  }

  restore(): void {
    this.#state = "up";
    this.#release();
  }

  close(): void {
    this.down();
    try {
      this.#listener.close();
    } catch {
      // already closed
    }
  }

  async #acceptLoop(): Promise<void> {
    while (true) {
      let client: Deno.Conn;
      try {
        client = await this.#listener.accept();
      } catch {
        return; // listener closed
      }
      if (this.#state === "down") {
        closeQuietly(client);
        continue;
      }
      void this.#connect(client);
    }
  }

  async #connect(client: Deno.Conn): Promise<void> {
    this.#open.add(client);
    await this.#gate();
    if (this.#state === "down" || !this.#open.has(client)) {
      this.#forget(client);
      return;
    }
    let target: Deno.Conn;
    try {
      target = await Deno.connect({ hostname: "127.0.0.1", port: this.#targetPort });
    } catch {
      this.#forget(client);
      return;
    }
    this.#open.add(target);
    const done = () => {
      this.#forget(client);
      this.#forget(target);
    };
    void Promise.all([this.#pump(client, target), this.#pump(target, client)]).finally(done);
  }

  /** Copies `from` to `to`, holding bytes while partitioned. */
  async #pump(from: Deno.Conn, to: Deno.Conn): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    try {
      while (true) {
        const n = await from.read(buffer);
        if (n === null) break;
        await this.#gate();
        if (!this.#open.has(from) || !this.#open.has(to)) break;
        let written = 0;
        while (written < n) written += await to.write(buffer.subarray(written, n));
      }
    } catch {
      // a side closed or reset
    } finally {
      this.#forget(from);
      this.#forget(to);
    }
  }

  async #gate(): Promise<void> {
    while (this.#state === "partitioned") await this.#released;
  }

  #forget(conn: Deno.Conn): void {
    if (this.#open.delete(conn)) closeQuietly(conn);
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}
