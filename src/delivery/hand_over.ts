/**
 * The hand-over of a new delivery's first attempt from the receivers' batch to this process's
 * dispatcher, without a claim (docs/architecture.md, "Handing over the first attempt"): the batch
 * (`events/ingest_batch.ts`) commits the delivery leased and calls {@linkcode DeliveryHandOver},
 * which the dispatcher implements.
 */
import type { SealedTarget } from "./targets.ts";

/** A delivery committed leased to the dispatcher, with what its first attempt needs. */
export interface HandedOverDelivery {
  id: string;
  eventId: string;
  tenantId: string;
  event: string;
  attempts: 0;
  payload: string;
  /** Its payload still waits for the store B purchase's state (see `DeliveryStateSource`). */
  statePending: boolean;
  receivedAt: Date;
  /** The tenant's target as the statement read it, its secrets still sealed. */
  target: SealedTarget;
}

/**
 * The dispatcher's side of a hand-over. A batch reserves a slot per new delivery it may hand
 * over; the statement leases a delivery only within the tenant's cap, counted as a claim counts
 * it, and only while the tenant's callback is healthy and nothing of the tenant's is waiting;
 * after the commit, each reservation is either started or released.
 */
export interface DeliveryHandOver {
  /** The lease's owner, and its length. */
  readonly owner: string;
  readonly leaseMs: number;
  /** The most leases one tenant may hold at once, across every process. */
  readonly tenantCap: number;
  /** Reserves a slot for a new delivery of `tenantId`; false when it should be claimed instead. */
  reserve(tenantId: string): boolean;
  /** Gives back a reservation whose delivery was not handed over. */
  release(tenantId: string): void;
  /** Starts the first attempt of a delivery committed with the lease, using its reservation. */
  start(delivery: HandedOverDelivery): void;
}
