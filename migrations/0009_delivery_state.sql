-- A store B delivery's payload waits for the purchase's state, which the dispatcher fetches from
-- Google Play with the tenant's credentials before the first attempt, off the receivers' path, and
-- stores in the event's payload so that every attempt sends the same bytes (docs/deliveries.md,
-- "State on every delivery"). A constant default: added without a rewrite.
ALTER TABLE deliveries ADD COLUMN state_pending boolean NOT NULL DEFAULT false;
