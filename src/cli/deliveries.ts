/**
 * The `deliveries` commands: list, show and retry. A delivery is named by its id (`dlv_...`) or
 * by its event's id (`evt_...`), the `eventId` and `X-Service-Event-Id` tenants see and quote.
 * @module
 */
import type { Database } from "../db/connect.ts";
import {
  type DeliveryStatus,
  findDelivery,
  listDeliveries,
  notifyDispatchers,
  requeueDeliveries,
} from "../delivery/queue.ts";
import {
  type CliContext,
  CommandError,
  type CommandInput,
  type CommandOutput,
  UsageError,
} from "./command.ts";
import { limitOption, mustFindTenant } from "./inputs.ts";

/** `deliveries list [--tenant ID] [--status STATUS] [--limit N]`, newest first. */
export async function listAllDeliveries(
  { options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const limit = limitOption(options.limit!);
  const { db } = await context.open();
  const deliveries = await listDeliveries(db.sql, {
    tenantId: options.tenant ?? null,
    status: (options.status ?? null) as DeliveryStatus | null,
    limit,
  });
  return { deliveries };
}

/** `deliveries show ID|EVENT_ID`: the delivery with its payload and every attempt. */
export async function showDelivery(
  { positionals: [reference] }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  const { db } = await context.open();
  const id = await mustFindDeliveryId(db, reference);
  const delivery = await findDelivery(db.sql, id);
  if (delivery === null) throw notFound(reference);
  return { ...delivery };
}

/**
 * `deliveries retry ID|EVENT_ID`, or `--tenant ID --status failed [--since TIME]`: an immediate
 * attempt and a fresh retry schedule. Running services are woken through the database; one that
 * cannot hear it picks the work up at its next sweep.
 */
export async function retryDeliveries(
  { positionals, options }: CommandInput,
  context: CliContext,
): Promise<CommandOutput> {
  if (positionals.length === 1 && options.tenant === undefined) {
    if (options.status !== undefined || options.since !== undefined) {
      throw new UsageError("deliveries retry ID takes no --status or --since");
    }
    const { db } = await context.open();
    const id = await mustFindDeliveryId(db, positionals[0]);
    const queued = await requeueDeliveries(db.sql, { id });
    if (queued.length === 0) {
      throw new CommandError("DELIVERY_IN_FLIGHT", `delivery ${id} is being sent right now`);
    }
    await notifyDispatchers(db.sql);
    return { queued };
  }
  if (positionals.length !== 0 || options.tenant === undefined) {
    throw new UsageError("expected a delivery ID, or --tenant ID --status failed [--since TIME]");
  }
  if (options.status === undefined || options.status.trim() === "") {
    throw new UsageError("--status is required");
  }
  let since: Date | null = null;
  if (options.since !== undefined) {
    since = new Date(options.since);
    if (Number.isNaN(since.getTime())) {
      throw new UsageError("--since must be an ISO-8601 time such as 2026-01-31T00:00:00Z");
    }
  }
  const { db } = await context.open();
  await mustFindTenant(db, options.tenant);
  const queued = await requeueDeliveries(db.sql, {
    tenantId: options.tenant,
    status: options.status as DeliveryStatus,
    since,
  });
  if (queued.length > 0) await notifyDispatchers(db.sql);
  return { queued };
}

/** The id of the delivery `reference` names: a delivery id, or its event's id (one each). */
async function mustFindDeliveryId(db: Database, reference: string): Promise<string> {
  const [row] = reference.startsWith("evt_")
    ? await db.sql`SELECT id FROM deliveries WHERE event_id = ${reference}`
    : await db.sql`SELECT id FROM deliveries WHERE id = ${reference}`;
  if (!row) throw notFound(reference);
  return row.id;
}

function notFound(reference: string): CommandError {
  return reference.startsWith("evt_")
    ? new CommandError("DELIVERY_NOT_FOUND", `no delivery of event ${reference}`)
    : new CommandError("DELIVERY_NOT_FOUND", `no delivery ${reference}`);
}
