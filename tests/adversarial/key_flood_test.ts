/**
 * An attacker floods the service with identifiers it makes up: thousands of random well-formed
 * API keys (`service_live_...`) on a verify endpoint, and thousands of random well-formed tenant
 * ids in a receiver's URL. Every one is refused as unknown, real callers keep being served
 * throughout, and the database sees a bounded number of queries: unknown identifiers are looked
 * up in shared batches (src/lib/cache.ts), not one query each. So does a flood of `/ready` probes,
 * which need no key: they share one database check at a time (src/api/readiness.ts).
 *
 * The database's load is read from PostgreSQL's own count of transactions in the test database
 * (`pg_stat_database`): every statement the service runs outside a transaction is one.
 */
import assert from "node:assert/strict";
import postgres from "postgres";
import {
  createTenantWithKey,
  databaseOf,
  ENGINE,
  type RunningService,
  startService,
  type TestDatabase,
} from "../helpers/service.ts";
import { assertError, postJson } from "../helpers/relay.ts";

const FLOOD = 3_000;
const CONCURRENCY = 32;
/** A real caller's request is sent after every this many flood requests. */
const REAL_EVERY = 100;
/**
 * The most queries a flood may cause: at most one batch of unknown identifiers per 20 ms (50 per
 * second), plus room for what the service does on its own meanwhile (its boot, on PostgreSQL).
 * One query per identifier would be FLOOD.
 */
function allowedQueries(elapsedMs: number): number {
  return Math.ceil(elapsedMs / 20) + 100;
}

function randomBase64url(bytes: number): string {
  return crypto.getRandomValues(new Uint8Array(bytes)).toBase64({
    alphabet: "base64url",
    omitPadding: true,
  });
}

function randomTenantId(): string {
  const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  const body = Array.from(crypto.getRandomValues(new Uint8Array(26)), (b) => alphabet[b % 32]);
  return `tenant_${body.join("")}`;
}

/** Transactions of `db` so far, once every connection that ran them has reported them. */
async function transactionsOf(db: TestDatabase, service: RunningService | null): Promise<number> {
  if (ENGINE === "embedded") {
    // One backend serves every connection of the embedded engine: it reports on demand.
    const sql = databaseOf(service!);
    try {
      await sql`SELECT pg_stat_force_next_flush()`;
      const [row] = await sql`
        SELECT xact_commit + xact_rollback AS count FROM pg_stat_database
        WHERE datname = current_database()`;
      return Number(row.count);
    } finally {
      await sql.end();
    }
  }
  // A PostgreSQL backend reports at most once a second while its connection lives, and always
  // when it closes: the service has been stopped.
  assert.equal(service, null);
  const sql = postgres(db.env.DATABASE_URL, { max: 1, onnotice: () => {} });
  try {
    const [row] = await sql`
      SELECT xact_commit + xact_rollback AS count FROM pg_stat_database
      WHERE datname = current_database()`;
    // This connection's own statements are not reported yet.
    return Number(row.count);
  } finally {
    await sql.end();
  }
}

/**
 * Runs `setUp` on a fresh service, then `flood`, and returns how many transactions the flood
 * cost the database and how long it took.
 */
async function measureFlood(
  setUp: (service: RunningService) => Promise<void>,
  flood: (service: RunningService) => Promise<void>,
): Promise<{ transactions: number; elapsedMs: number }> {
  let service: RunningService | null = await startService();
  const db = service.db;
  try {
    await setUp(service);
    if (ENGINE === "postgresql") {
      await service.stop();
      service = null;
    }
    const before = await transactionsOf(db, service);
    service ??= await startService({ db });
    const started = performance.now();
    await flood(service);
    const elapsedMs = performance.now() - started;
    if (ENGINE === "postgresql") {
      await service.stop();
      service = null;
    }
    const after = await transactionsOf(db, service);
    return { transactions: after - before, elapsedMs };
  } finally {
    await service?.stop();
    await db.drop();
  }
}

/** Sends `requests` with at most CONCURRENCY in flight. */
async function sendAll(requests: (() => Promise<void>)[]): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < requests.length) await requests[next++]();
  }));
}

Deno.test(`a flood of random API keys is refused at a bounded database cost (${ENGINE})`, async () => {
  let realKey = "";
  let realAnswers = 0;
  const { transactions, elapsedMs } = await measureFlood(
    async (service) => {
      realKey = (await createTenantWithKey(service)).key;
    },
    async (service) => {
      const url = `${service.url}/v1/storea/verify`;
      // The real key passes authentication: its request fails later, on the empty body.
      const real = async () => {
        assertError(
          await postJson(url, {}, { authorization: `Bearer ${realKey}` }),
          400,
          "INVALID_REQUEST",
        );
        realAnswers++;
      };
      const requests: (() => Promise<void>)[] = [];
      for (let i = 0; i < FLOOD; i++) {
        if (i % REAL_EVERY === 0) requests.push(real);
        const key = `service_live_${randomBase64url(32)}`;
        requests.push(async () => {
          assertError(
            await postJson(url, {}, { authorization: `Bearer ${key}` }),
            401,
            "UNAUTHENTICATED",
          );
        });
      }
      await sendAll(requests);
    },
  );
  console.log(
    `resilience key-flood: ${FLOOD} random keys in ${(elapsedMs / 1000).toFixed(1)} s ` +
      `(${ENGINE}), database transactions +${transactions}`,
  );
  assert.equal(realAnswers, FLOOD / REAL_EVERY);
  assert.ok(
    transactions <= allowedQueries(elapsedMs),
    `${FLOOD} random keys cost ${transactions} transactions in ${elapsedMs.toFixed(0)} ms`,
  );
});

Deno.test(`a flood of random tenant ids is refused at a bounded database cost (${ENGINE})`, async () => {
  let realTenant = "";
  let realAnswers = 0;
  const { transactions, elapsedMs } = await measureFlood(
    async (service) => {
      realTenant = (await createTenantWithKey(service)).tenantId;
    },
    async (service) => {
      const receiver = (tenantId: string) => `${service.url}/v1/webhooks/storea/${tenantId}`;
      const body = { signedPayload: "x.y.z" };
      // The real tenant is found: its request fails later, as it has no store A credentials.
      const real = async () => {
        assertError(await postJson(receiver(realTenant), body), 400, "CREDENTIALS_MISSING");
        realAnswers++;
      };
      const requests: (() => Promise<void>)[] = [];
      for (let i = 0; i < FLOOD; i++) {
        if (i % REAL_EVERY === 0) requests.push(real);
        const tenantId = randomTenantId();
        requests.push(async () => {
          assertError(await postJson(receiver(tenantId), body), 404, "TENANT_NOT_FOUND");
        });
      }
      await sendAll(requests);
    },
  );
  console.log(
    `resilience tenant-flood: ${FLOOD} random tenant ids in ${(elapsedMs / 1000).toFixed(1)} s ` +
      `(${ENGINE}), database transactions +${transactions}`,
  );
  assert.equal(realAnswers, FLOOD / REAL_EVERY);
  assert.ok(
    transactions <= allowedQueries(elapsedMs),
    `${FLOOD} random tenant ids cost ${transactions} transactions in ${elapsedMs.toFixed(0)} ms`,
  );
});

Deno.test(`a flood of /ready probes costs the database about two queries a second (${ENGINE})`, async () => {
  let answers = 0;
  const { transactions, elapsedMs } = await measureFlood(
    async () => {},
    async (service) => {
      // /ready needs no key: each probe used to be a query of its own.
      const probe = async () => {
        const answer = await fetch(`${service.url}/ready`);
        assert.equal(answer.status, 200);
        assert.equal((await answer.json()).checks.db, "ok");
        answers++;
      };
      await sendAll(Array.from({ length: FLOOD }, () => probe));
    },
  );
  console.log(
    `resilience ready-flood: ${FLOOD} probes in ${(elapsedMs / 1000).toFixed(1)} s ` +
      `(${ENGINE}), database transactions +${transactions}`,
  );
  assert.equal(answers, FLOOD);
  // One check per half second, and room for what the service does on its own meanwhile.
  const allowed = Math.ceil(elapsedMs / 500) + 100;
  assert.ok(
    transactions <= allowed,
    `${FLOOD} probes cost ${transactions} transactions in ${elapsedMs.toFixed(0)} ms`,
  );
});
