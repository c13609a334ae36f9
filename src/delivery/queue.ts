/**
 * The delivery queue, designed in SQL first: the `deliveries` table is the queue, `status` and
 * `next_attempt_at` say what is due, and a lease (`lease_owner`, `lease_expires_at`) says which
 * process is sending it. Claims take rows with `FOR UPDATE SKIP LOCKED`, so replicas never claim
 * the same delivery, and a dead process's claim is taken over once its lease ends.
 */
import type postgres from "postgres";
import type { Sql } from "../db/connect.ts";
import { leasesHeld, type SealedTarget, sealedTargetColumns, sealedTargetOf } from "./targets.ts";

/** The channel on which a requeue wakes the dispatchers of every running process. */
export const DELIVERY_QUEUE_CHANNEL = "purchase_relay_deliveries";

/** Wakes every dispatcher listening on {@linkcode DELIVERY_QUEUE_CHANNEL}. */
export async function notifyDispatchers(sql: Sql): Promise<void> {
  await sql`SELECT pg_notify(${DELIVERY_QUEUE_CHANNEL}, '')`;
}

/** Delivery states: `pending` until a 2xx (`delivered`) or the last retry fails (`failed`). */
export type DeliveryStatus = "pending" | "delivered" | "failed";

/** A delivery claimed for one attempt. */
export interface ClaimedDelivery {
  id: string;
  eventId: string;
  tenantId: string;
  /** The unified event name, for `X-Service-Event`. */
  event: string;
  /** Attempts made since it was (re)queued. */
  attempts: number;
  /** The JSON body to send. */
  payload: string;
  /**
   * The payload still waits for the purchase's state, fetched from the store before the first
   * attempt (docs/deliveries.md, "State on every delivery").
   */
  statePending: boolean;
  /** When the notification was received, for the delivery lag. */
  receivedAt: Date;
  /** The tenant's delivery target as the claim read it, its secrets still sealed. */
  target: SealedTarget;
}

/** What one attempt produced. */
export interface AttemptResult {
  attemptedAt: Date;
  durationMs: number;
  /** The callback's HTTP status, or null when no answer came. */
  responseCode: number | null;
  /** The first 4 KB of the answer's body. */
  responseBody: string | null;
  /** Why no usable answer came (network error, timeout, refused target), or null. */
  error: string | null;
  /** A `Retry-After` of a 429 or 503 answer, in milliseconds. */
  retryAfterMs: number | null;
}

/** What becomes of a delivery after an attempt. */
export type AttemptVerdict =
  | { status: "delivered" }
  | { status: "pending"; nextAttemptAt: Date }
  | { status: "failed" };

/**
 * After this many failed attempts in a row to a tenant's callback, the tenant is sent one
 * delivery at a time until an attempt succeeds (docs/relay.md, "Delivery scheduling across
 * tenants").
 */
export const FAILING_CALLBACK_STREAK = 5;

/** How a claim shares the delivery slots among tenants. */
export interface ClaimShare {
  /** The most leases one tenant may hold at once, across every process. */
  tenantCap: number;
}

/**
 * Claims up to `limit` due deliveries of active tenants for `owner`, for `leaseMs`, sharing them
 * fairly among tenants, in one statement:
 *
 * - a tenant gets at most its free slots: `tenantCap` (1 while its callback is failing, see
 *   {@linkcode FAILING_CALLBACK_STREAK}) less the leases it holds now, whichever process holds
 *   them, so a tenant whose callback hangs ties up at most that many slots in the cluster;
 * - tenants are interleaved: every tenant's oldest due delivery comes before any tenant's
 *   second, so one tenant's backlog never queues another tenant's deliveries behind it.
 *
 * Each tenant is probed on `deliveries_tenant_due`, a few rows however long its backlog. The
 * candidates are chosen without locks and then locked with `SKIP LOCKED`: two processes claiming
 * at once pick the same oldest rows of a tenant, so the one that loses gets fewer rather than
 * exceeding the cap.
 *
 * Every step reads by index whatever the planner believes of the table (docs/architecture.md,
 * "Queue statements and stale statistics"): the leases are counted by an ordered scan that stops
 * at the cap, and each candidate is locked by its primary key. Deliveries of an inactive tenant
 * are not claimed: they wait until it is activated (docs/relay.md, "Inactive tenants").
 *
 * The cap and the turns live in this statement, so a claim of any size keeps them; anything
 * else that leases deliveries counts a tenant's leases with the same `leasesHeld`.
 */
export async function claimDueDeliveries(
  sql: Sql,
  claim: Claim,
): Promise<ClaimedDelivery[]> {
  const rows = await sql`
    WITH ${claimSteps(sql, claim, { streak: sql`t.delivery_failure_streak`, released: null })}
    ${claimUpdate(sql, claim)}`;
  return rows.map(claimedDelivery);
}

/** What {@linkcode claimDueDeliveries} is asked for. */
export type Claim = { owner: string; limit: number; leaseMs: number } & ClaimShare;

/**
 * The claim's `candidates` and `chosen` steps. `streak` is a tenant's failure streak, `released`
 * (when the same statement records attempts) a step of the leases it gives back per tenant: the
 * snapshot still counts them as held, so they are counted out again.
 */
function claimSteps(
  sql: Sql,
  claim: Claim,
  tenant: { streak: postgres.Fragment; released: postgres.Fragment | null },
) {
  const released = tenant.released ?? sql`(SELECT 0 AS n)`;
  return sql`
    candidates AS (
      SELECT c.id, c.next_attempt_at, c.turn
      FROM tenants t
      CROSS JOIN LATERAL (
        SELECT CASE WHEN ${tenant.streak} >= ${FAILING_CALLBACK_STREAK}
                    THEN 1 ELSE ${claim.tenantCap}::int END AS cap
      ) tenant
      CROSS JOIN LATERAL ${released} mine
      CROSS JOIN LATERAL (
        SELECT tenant.cap - (${leasesHeld(sql, sql`tenant.cap + mine.n`)} - mine.n) AS free
      ) slots
      CROSS JOIN LATERAL (
        SELECT due.id, due.next_attempt_at,
               row_number() OVER (ORDER BY due.next_attempt_at, due.id) AS turn
        FROM (
          SELECT d.id, d.next_attempt_at
          FROM deliveries d
          WHERE d.tenant_id = t.id
            AND d.status = 'pending'
            AND d.next_attempt_at <= now()
            AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
          ORDER BY d.next_attempt_at, d.id
          LIMIT greatest(slots.free, 0)
        ) due
      ) c
      WHERE t.active
    ), chosen AS (
      SELECT locked.id
      FROM (SELECT id FROM candidates ORDER BY turn, next_attempt_at, id LIMIT ${claim.limit}) pick
      CROSS JOIN LATERAL (
        SELECT d.id
        FROM deliveries d
        WHERE d.id = pick.id
          AND d.status = 'pending'
          AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
        FOR UPDATE SKIP LOCKED
      ) locked
    )`;
}

/** The claim's last step: leases what `chosen` locked, returning what an attempt needs. */
function claimUpdate(sql: Sql, claim: Claim) {
  return sql`
    UPDATE deliveries d
    SET lease_owner = ${claim.owner},
        lease_expires_at = now() + ${claim.leaseMs} * interval '1 millisecond'
    FROM chosen, events e, tenants t
    WHERE d.id = chosen.id AND e.id = d.event_id AND t.id = d.tenant_id
    RETURNING d.id, d.event_id, d.tenant_id, d.attempts, d.state_pending, e.event, e.payload,
              e.received_at, ${sealedTargetColumns(sql, sql`d.sandbox`)}`;
}

function claimedDelivery(row: postgres.Row): ClaimedDelivery {
  return {
    id: row.id,
    eventId: row.event_id,
    tenantId: row.tenant_id,
    event: row.event,
    attempts: row.attempts,
    payload: row.payload,
    statePending: row.state_pending,
    receivedAt: new Date(row.received_at),
    target: sealedTargetOf(row),
  };
}

/**
 * Stores a delivery's payload completed with the purchase's state, in one statement, so that every
 * attempt after this one sends the same bytes; only while this process holds the delivery's lease
 * (another process that took it over completes it itself). Returns whether it was stored.
 */
export async function storeCompletedPayload(
  sql: Sql,
  delivery: { id: string; eventId: string; owner: string; payload: string },
): Promise<boolean> {
  const [row] = await sql`
    WITH done AS (
      UPDATE deliveries SET state_pending = false
      WHERE id = ${delivery.id} AND lease_owner = ${delivery.owner} AND state_pending
      RETURNING event_id
    )
    UPDATE events e SET payload = ${delivery.payload}
    FROM done WHERE e.id = done.event_id
    RETURNING e.id`;
  return row !== undefined;
}

/**
 * The deliveries waiting, for the backlog gauge: all pending ones, and those already due of active
 * tenants (an inactive tenant's wait for it, unclaimed, and would keep the due count up for good).
 * It reads the pending deliveries' partial index, so it costs in proportion to the backlog; the
 * gauge reuses its answer (docs/observability.md, "Telemetry").
 */
export async function countBacklog(sql: Sql): Promise<{ pending: number; due: number }> {
  const [row] = await sql`
    SELECT count(*)::int AS pending,
           (count(*) FILTER (WHERE d.next_attempt_at <= now() AND t.active))::int AS due
    FROM deliveries d JOIN tenants t ON t.id = d.tenant_id
    WHERE d.status = 'pending'`;
  return { pending: row.pending, due: row.due };
}

/**
 * When a claim will next find something for an active tenant, if that is within `horizonMs`;
 * null otherwise. The dispatcher sets a timer for it. A tenant with a free slot is due at its
 * oldest unleased delivery's due time; a tenant at its cap only when one of its leases ends
 * (an attempt that finishes sooner makes its own process claim again).
 */
export async function nextDueAt(
  sql: Sql,
  horizonMs: number,
  share: ClaimShare,
): Promise<Date | null> {
  const [row] = await sql`
    SELECT min(tenant.due) AS due
    FROM (
      SELECT CASE WHEN held.count < held.cap THEN least(waiting.due, held.ends)
                  ELSE held.ends END AS due
      FROM tenants t
      CROSS JOIN LATERAL (
        SELECT count(*)::int AS count, min(l.lease_expires_at) AS ends,
               CASE WHEN t.delivery_failure_streak >= ${FAILING_CALLBACK_STREAK}
                    THEN 1 ELSE ${share.tenantCap}::int END AS cap
        FROM deliveries l
        WHERE l.tenant_id = t.id AND l.lease_expires_at > now()
      ) held
      LEFT JOIN LATERAL (
        SELECT d.next_attempt_at AS due
        FROM deliveries d
        WHERE d.tenant_id = t.id
          AND d.status = 'pending'
          AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
        ORDER BY d.next_attempt_at, d.id
        LIMIT 1
      ) waiting ON true
      WHERE t.active
    ) tenant
    WHERE tenant.due <= now() + ${horizonMs} * interval '1 millisecond'`;
  return row?.due ? new Date(row.due) : null;
}

/** What recording an attempt did. */
export interface RecordedAttempt {
  /** False when the lease had been lost: the attempt is recorded, the state left alone. */
  kept: boolean;
  /** The tenant's failed attempts in a row, this one included; 0 after a success. */
  failureStreak: number;
  /** The tenant's streak before this attempt, when this attempt changed it. */
  previousStreak: number | null;
}

/**
 * Records one attempt and moves its delivery to its next state, as {@linkcode recordAttempts}
 * does for many: the state changes only while `owner` still holds the lease; the attempt is
 * recorded either way, and so is its effect on the tenant's failure streak.
 */
export async function recordAttempt(
  sql: Sql,
  owner: string,
  attempt: AttemptToRecord,
): Promise<RecordedAttempt> {
  const [recorded] = await recordAttempts(sql, owner, [attempt]);
  return recorded;
}

/** Gives a claimed delivery back unattempted (shutdown, or its tenant became inactive). */
export async function releaseClaim(sql: Sql, deliveryId: string, owner: string): Promise<void> {
  await sql`
    UPDATE deliveries SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = ${deliveryId} AND lease_owner = ${owner}`;
}

/** A delivery as the admin CLI shows it. */
export interface DeliveryRecord {
  id: string;
  eventId: string;
  tenantId: string;
  event: string;
  platformEvent: string;
  externalId: string;
  source: string;
  status: DeliveryStatus;
  attempts: number;
  nextAttemptAt: string | null;
  lastAttemptAt: string | null;
  lastResponseCode: number | null;
  lastResponseBody: string | null;
  lastError: string | null;
  deliveredAt: string | null;
  createdAt: string;
}

/** One recorded attempt. */
export interface AttemptRecord {
  attemptedAt: string;
  durationMs: number;
  responseCode: number | null;
  responseBody: string | null;
  error: string | null;
}

// deno-lint-ignore no-explicit-any
function toDelivery(row: any): DeliveryRecord {
  const iso = (value: unknown) => value === null ? null : new Date(value as string).toISOString();
  return {
    id: row.id,
    eventId: row.event_id,
    tenantId: row.tenant_id,
    event: row.event,
    platformEvent: row.platform_event,
    externalId: row.external_id,
    source: row.source,
    status: row.status,
    attempts: row.attempts,
    nextAttemptAt: iso(row.next_attempt_at),
    lastAttemptAt: iso(row.last_attempt_at),
    lastResponseCode: row.last_response_code,
    lastResponseBody: row.last_response_body,
    lastError: row.last_error,
    deliveredAt: iso(row.delivered_at),
    createdAt: iso(row.created_at)!,
  };
}

/** Deliveries, newest first, optionally of one tenant and in one status. */
export async function listDeliveries(
  sql: Sql,
  filter: { tenantId: string | null; status: DeliveryStatus | null; limit: number },
): Promise<DeliveryRecord[]> {
  const rows = await sql`
    SELECT d.*, e.event, e.platform_event, e.external_id, e.source
    FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE (${filter.tenantId}::text IS NULL OR d.tenant_id = ${filter.tenantId})
      AND (${filter.status}::text IS NULL OR d.status = ${filter.status})
    ORDER BY d.created_at DESC, d.id DESC
    LIMIT ${filter.limit}`;
  return rows.map(toDelivery);
}

/** One delivery with its attempts (oldest first) and payload, or null. */
export async function findDelivery(
  sql: Sql,
  id: string,
): Promise<(DeliveryRecord & { attemptLog: AttemptRecord[]; payload: unknown }) | null> {
  const [row] = await sql`
    SELECT d.*, e.event, e.platform_event, e.external_id, e.source, e.payload
    FROM deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.id = ${id}`;
  if (!row) return null;
  const attempts = await sql`
    SELECT * FROM delivery_attempts WHERE delivery_id = ${id} ORDER BY id`;
  return {
    ...toDelivery(row),
    payload: JSON.parse(row.payload),
    attemptLog: attempts.map((a) => ({
      attemptedAt: new Date(a.attempted_at).toISOString(),
      durationMs: a.duration_ms,
      responseCode: a.response_code,
      responseBody: a.response_body,
      error: a.error,
    })),
  };
}

/**
 * Queues deliveries again for an immediate attempt and a fresh retry schedule (manual
 * re-delivery): one by id, or every delivery of a tenant in a status since a time. A delivery
 * being sent right now (leased) is left alone. Returns the ids queued.
 */
export async function requeueDeliveries(
  sql: Sql,
  selection: { id: string } | { tenantId: string; status: DeliveryStatus; since: Date | null },
): Promise<string[]> {
  const rows = "id" in selection
    ? await sql`
      UPDATE deliveries
      SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
          updated_at = now()
      WHERE id = ${selection.id}
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())
      RETURNING id`
    : await sql`
      UPDATE deliveries
      SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
          updated_at = now()
      WHERE tenant_id = ${selection.tenantId} AND status = ${selection.status}
        AND (${selection.since}::timestamptz IS NULL OR created_at >= ${selection.since})
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())
      RETURNING id`;
  return rows.map((row) => row.id);
}

/** One attempt to record in a batch: see {@linkcode recordAttempts}. */
export interface AttemptToRecord {
  deliveryId: string;
  tenantId: string;
  result: AttemptResult;
  verdict: AttemptVerdict;
}

/**
 * Records many attempts of `owner` in one statement, each as {@linkcode recordAttempt} would in
 * turn: the state moves only where `owner` still holds the lease, every attempt is recorded, and
 * each tenant's failure streak becomes what the attempts, in order, make of it (written only when
 * it changes). Returns what each attempt did, in the order given.
 *
 * The streak counted on is the one the row lock reads, not the statement's snapshot: when another
 * record commits while this one waits for the row, the snapshot still holds the streak from before
 * it, and counting on from that would skip the failure that says the callback is failing. Only
 * rows whose streak changes are locked (in id order, so two records lock them in one order): a
 * healthy tenant's row is neither locked nor written at every delivery.
 */
export async function recordAttempts(
  sql: Sql,
  owner: string,
  attempts: AttemptToRecord[],
): Promise<RecordedAttempt[]> {
  if (attempts.length === 0) return [];
  // One statement, so one atomic transaction without a client-side BEGIN (see ingest.ts).
  const rows = await sql`WITH ${recordSteps(sql, owner, attempts)} ${recordRows(sql)}`;
  return recordedAttempts(attempts, rows);
}

/**
 * Records `attempts` as {@linkcode recordAttempts} does and, given a `claim`, claims up to
 * `claim.limit` due deliveries as {@linkcode claimDueDeliveries} does, in one statement: the
 * dispatcher's one statement per cycle (docs/architecture.md, "Batched delivery"). The claim counts
 * the leases the records give back as free, and a tenant whose callback the records find failing
 * gets its one slot at once. The records' rows are leased to `owner`, so the claim never takes them.
 */
export async function recordAndClaim(
  sql: Sql,
  owner: string,
  attempts: AttemptToRecord[],
  claim: Claim | null,
): Promise<{ recorded: RecordedAttempt[]; claimed: ClaimedDelivery[] }> {
  if (claim === null) return { recorded: await recordAttempts(sql, owner, attempts), claimed: [] };
  if (attempts.length === 0) return { recorded: [], claimed: await claimDueDeliveries(sql, claim) };
  const rows = await sql`
    WITH ${recordSteps(sql, owner, attempts)}, released AS (
      SELECT l.tenant_id, count(*)::int AS n
      FROM input JOIN deliveries l ON l.id = input.delivery_id
      WHERE l.lease_owner = ${owner} AND l.lease_expires_at > now()
      GROUP BY l.tenant_id
    ), ${
    claimSteps(sql, claim, {
      streak: sql`coalesce((SELECT s.after FROM streak s WHERE s.id = t.id),
                           t.delivery_failure_streak)`,
      released: sql`(SELECT coalesce(sum(r.n), 0)::int AS n FROM released r
                     WHERE r.tenant_id = t.id)`,
    })
  }, claimed AS (${claimUpdate(sql, claim)})
    SELECT 'claimed' AS kind, NULL AS record_id, NULL::int AS before, c.* FROM claimed c
    UNION ALL
    -- The records' rows, widened to the claim's columns (all null) by a join that matches none.
    SELECT r.*, c.* FROM (${recordRows(sql)}) r LEFT JOIN claimed c ON false`;
  return {
    recorded: recordedAttempts(attempts, rows.filter((row) => row.kind !== "claimed")),
    claimed: rows.filter((row) => row.kind === "claimed").map(claimedDelivery),
  };
}

/**
 * The steps that record `attempts`: `input` (one row each, in order), the attempts' rows, `moved`
 * (deliveries whose lease `owner` still held, moved to their next state) and `streak` (tenants
 * whose failure streak changed: `before` and `after` it).
 */
function recordSteps(sql: Sql, owner: string, attempts: AttemptToRecord[]) {
  // Per tenant: whether some attempt succeeded, and the failures after the last success.
  const streaks = new Map<string, { reset: boolean; add: number }>();
  for (const attempt of attempts) {
    const streak = streaks.get(attempt.tenantId) ?? { reset: false, add: 0 };
    if (attempt.verdict.status === "delivered") {
      streak.reset = true;
      streak.add = 0;
    } else {
      streak.add++;
    }
    streaks.set(attempt.tenantId, streak);
  }
  const tenants = [...streaks.keys()];
  const col = <T>(pick: (a: AttemptToRecord) => T) => attempts.map(pick);
  const iso = (date: Date | null) => date === null ? null : date.toISOString();
  return sql`
    input AS (
      SELECT * FROM unnest(
        ${col((a) => a.deliveryId)}::text[],
        ${col((a) => a.result.attemptedAt.toISOString())}::timestamptz[],
        ${col((a) => String(Math.round(a.result.durationMs)))}::text[]::int[],
        ${col((a) => a.result.responseCode?.toString() ?? null)}::text[]::int[],
        ${col((a) => storable(a.result.responseBody))}::text[],
        ${col((a) => storable(a.result.error))}::text[],
        ${col((a) => a.verdict.status)}::text[],
        ${
    col((a) => iso(a.verdict.status === "pending" ? a.verdict.nextAttemptAt : null))
  }::timestamptz[]
      ) WITH ORDINALITY AS i(delivery_id, attempted_at, duration_ms, response_code, response_body,
                             error, status, next_attempt_at, ord)
    ), attempt AS (
      INSERT INTO delivery_attempts
        (delivery_id, attempted_at, duration_ms, response_code, response_body, error)
      SELECT delivery_id, attempted_at, duration_ms, response_code, response_body, error
      FROM input ORDER BY ord
    ), moved AS (
      UPDATE deliveries d
      SET status = input.status,
          attempts = d.attempts + 1,
          next_attempt_at = input.next_attempt_at,
          delivered_at = CASE WHEN input.status = 'delivered' THEN input.attempted_at END,
          lease_owner = NULL,
          lease_expires_at = NULL,
          last_attempt_at = input.attempted_at,
          last_response_code = input.response_code,
          last_response_body = input.response_body,
          last_error = input.error,
          updated_at = now()
      FROM input
      WHERE d.id = input.delivery_id AND d.lease_owner = ${owner}
      RETURNING d.id
    ), change AS (
      SELECT * FROM unnest(${tenants}::text[],
                           ${
    tenants.map((id) => String(streaks.get(id)!.reset))
  }::text[]::boolean[],
                           ${tenants.map((id) => String(streaks.get(id)!.add))}::text[]::int[])
        AS u(tenant_id, reset, add)
    ), locked AS (
      SELECT t.id, t.delivery_failure_streak AS before
      FROM tenants t JOIN change c ON c.tenant_id = t.id
      WHERE c.add > 0 OR t.delivery_failure_streak <> 0
      ORDER BY t.id
      FOR UPDATE OF t
    ), streak AS (
      UPDATE tenants t
      SET delivery_failure_streak = CASE WHEN c.reset THEN c.add
                                         ELSE t.delivery_failure_streak + c.add END
      FROM change c JOIN locked ON locked.id = c.tenant_id
      WHERE t.id = c.tenant_id
      RETURNING t.id, locked.before, t.delivery_failure_streak AS after
    )`;
}

/**
 * Text as PostgreSQL can store it: its `text` cannot hold U+0000, and a callback's answer may (a
 * binary or compressed body). Stored as it came, the NUL failed the record: the attempt went
 * unrecorded and the delivery was sent again each time its lease ended.
 */
function storable(text: string | null): string | null {
  return text?.replaceAll("\u0000", "\uFFFD") ?? null;
}

/** What the record steps did: a row per moved delivery and per tenant whose streak changed. */
function recordRows(sql: Sql) {
  return sql`
    SELECT 'moved' AS kind, id AS record_id, NULL::int AS before FROM moved
    UNION ALL
    SELECT 'streak', id, before FROM streak`;
}

/** What each attempt did, in order, from the {@linkcode recordRows} of its statement. */
function recordedAttempts(attempts: AttemptToRecord[], rows: postgres.Row[]): RecordedAttempt[] {
  const moved = new Set<string>();
  const before = new Map<string, number>();
  for (const row of rows) {
    if (row.kind === "moved") moved.add(row.record_id);
    else before.set(row.record_id, row.before);
  }
  // Replays each tenant's attempts in order from the streak the statement started from.
  const streakNow = new Map<string, number>();
  return attempts.map((attempt) => {
    const previous = streakNow.get(attempt.tenantId) ?? before.get(attempt.tenantId) ?? 0;
    const now = attempt.verdict.status === "delivered" ? 0 : previous + 1;
    streakNow.set(attempt.tenantId, now);
    return {
      kept: moved.has(attempt.deliveryId),
      failureStreak: now,
      previousStreak: now === previous ? null : previous,
    };
  });
}
