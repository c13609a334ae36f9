-- How each tenant's deliveries are routed and what they carry (docs/configuration.md, "Routing
-- deliveries"; docs/deliveries.md, "State on every delivery").
--
-- sandbox_callback_url: where store A Sandbox notifications go, when set; else the callback URL.
-- event_filter: event names and `prefix.*` patterns; an event matching none is stored with no
--   delivery sent. Null: every event is delivered.
-- storeb_state_fetch: whether store B deliveries carry the purchase fetched from Google Play.
-- deliveries.sandbox: the delivery is of a Sandbox notification, so the sandbox URL takes it.
-- Every column added has a constant default or none: PostgreSQL adds them without a rewrite.
ALTER TABLE tenants
  ADD COLUMN sandbox_callback_url text,
  ADD COLUMN event_filter text[],
  ADD COLUMN storeb_state_fetch boolean NOT NULL DEFAULT true;
ALTER TABLE deliveries ADD COLUMN sandbox boolean NOT NULL DEFAULT false;
