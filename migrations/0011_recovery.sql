-- Where the recovery of missed notifications stands, per tenant, store and environment
-- (docs/recovery.md, "Recovering missed notifications"): the service reads the stores' own
-- records (store A's notification history, store B's voided purchases) every RECOVERY_INTERVAL,
-- from where the last run ended, and one replica at a time reads each.
--
-- checked_until: the end of the last window read to its end; the next window starts there, minus
--   an overlap. Null: never read, so the first window looks back a few days.
-- window_start, window_end, page_token: a window left unfinished (a run reads a bounded number of
--   pages): the next run goes on from the page token. Null when there is none.
-- lease_owner, lease_until: the process reading it now, and until when; another takes it only
--   once the lease has run out. A lease, not a session advisory lock: a transaction pooler may sit
--   in front of PostgreSQL.
-- next_run_at, failures, last_error: the schedule, and the backoff after failures (a store's
--   Retry-After included).
-- send_failures_until: store A's failed send attempts up to this time were reported already.
-- warned_orders: store B order ids already reported voided for want of an acknowledgement.
-- A new table: nothing that serves reads it until this version.
CREATE TABLE recovery_checkpoints (
  tenant_id           text NOT NULL REFERENCES tenants (id),
  store               text NOT NULL CHECK (store IN ('storea', 'storeb')),
  environment         text NOT NULL CHECK (environment IN ('production', 'sandbox')),
  checked_until       timestamptz,
  window_start        timestamptz,
  window_end          timestamptz,
  page_token          text,
  lease_owner         text,
  lease_until         timestamptz,
  next_run_at         timestamptz NOT NULL DEFAULT now(),
  failures            integer NOT NULL DEFAULT 0,
  last_error          text,
  last_run_at         timestamptz,
  send_failures_until timestamptz,
  warned_orders       text[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (tenant_id, store, environment)
);
CREATE INDEX recovery_checkpoints_due ON recovery_checkpoints (next_run_at);
