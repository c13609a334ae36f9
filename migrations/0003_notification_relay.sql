-- The notification relay: received events, their deliveries to the tenant's callback, and every
-- delivery attempt. The deliveries table is the queue: a status, the time the next attempt is
-- due, and a lease that says which process is sending it (claims use FOR UPDATE SKIP LOCKED).

-- A secret rotation keeps the previous webhook secret until its grace period ends; deliveries
-- are signed with both meanwhile.
ALTER TABLE tenants
  ADD COLUMN previous_webhook_secret_sealed text,
  ADD COLUMN previous_webhook_secret_expires_at timestamptz;

-- One row per accepted notification. `payload` is the exact JSON body every attempt sends (spec
-- 2.9), so retries carry the same bytes and the same event id.
CREATE TABLE events (
  id              text PRIMARY KEY,
  tenant_id       text NOT NULL REFERENCES tenants (id),
  source          text NOT NULL CHECK (source IN ('storea', 'storeb')),
  external_id     text NOT NULL,
  event           text NOT NULL,
  platform_event  text NOT NULL,
  payload         text NOT NULL,
  received_at     timestamptz NOT NULL DEFAULT now(),
  UNIQUE (tenant_id, source, external_id)
);

CREATE TABLE deliveries (
  id                 text PRIMARY KEY,
  event_id           text NOT NULL UNIQUE REFERENCES events (id),
  tenant_id          text NOT NULL REFERENCES tenants (id),
  status             text NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
  -- Attempts since the delivery was (re)queued; indexes the retry schedule.
  attempts           integer NOT NULL DEFAULT 0,
  next_attempt_at    timestamptz,
  lease_owner        text,
  lease_expires_at   timestamptz,
  last_attempt_at    timestamptz,
  last_response_code integer,
  last_response_body text,
  last_error         text,
  delivered_at       timestamptz,
  created_at         timestamptz NOT NULL DEFAULT now(),
  updated_at         timestamptz NOT NULL DEFAULT now()
);
-- Matches the claim: pending deliveries by due time.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_tenant ON deliveries (tenant_id, status, created_at);

CREATE TABLE delivery_attempts (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  delivery_id   text NOT NULL REFERENCES deliveries (id),
  attempted_at  timestamptz NOT NULL,
  duration_ms   integer NOT NULL,
  -- The callback's HTTP status, or null when no answer came (then `error` says why).
  response_code integer,
  response_body text,
  error         text
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id, id);
