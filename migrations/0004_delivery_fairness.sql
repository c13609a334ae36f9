-- Fair delivery across tenants: a claim takes, for each active tenant, its oldest due deliveries
-- up to the tenant's free slots (its cap less the leases it holds), and interleaves tenants. See
-- "Delivery scheduling across tenants" in docs/operations.md.

-- Matches the claim's per-tenant probe: a tenant's pending deliveries by due time. The claim
-- reads a few rows per tenant from it however long a tenant's backlog is.
CREATE INDEX deliveries_tenant_due ON deliveries (tenant_id, next_attempt_at, id)
  WHERE status = 'pending';

-- The claim and the dispatcher's wake-up time no longer read pending deliveries by due time
-- alone: the index that served them would only cost writes.
DROP INDEX deliveries_due;

-- The leases held, per tenant, which the claim counts against the cap. Only deliveries being
-- sent (or left by a process that died) carry a lease, so this index stays small.
CREATE INDEX deliveries_tenant_leased ON deliveries (tenant_id, lease_expires_at)
  WHERE lease_expires_at IS NOT NULL;

-- Delivery attempts to the tenant's callback that failed in a row; the first 2xx resets it. A
-- tenant whose callback keeps failing is sent one delivery at a time until it answers again.
ALTER TABLE tenants ADD COLUMN delivery_failure_streak integer NOT NULL DEFAULT 0;
