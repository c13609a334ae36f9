-- The SHA-256 (hex) of a store B event's subject key, its purchase token: what the service knows of
-- a token from earlier events, such as whether it was a subscription or a one-time product, is
-- found by it (docs/recovery.md, "Recovering missed notifications"). A hash, not the token: an
-- index entry holds at most a few kilobytes, and a token may be 4,096 characters. Added without a
-- rewrite; the index holds only the rows that have one.
ALTER TABLE events ADD COLUMN subject_hash text;
CREATE INDEX events_subject_hash ON events (tenant_id, subject_hash) WHERE subject_hash IS NOT NULL;
