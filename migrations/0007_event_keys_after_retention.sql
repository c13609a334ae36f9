-- Retention deletes an old finished delivery and its attempts, but the event's row outlives them
-- for as long as a store may send the notification again (docs/relay.md, "Retention"): its
-- (tenant, source, external id) key still deduplicates, while its payload, the delivery body, is
-- emptied. A later prune deletes such rows; this index finds them, and holds only them.
CREATE INDEX events_emptied ON events (received_at) WHERE payload = '';
