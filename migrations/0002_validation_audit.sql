-- The validation audit (VALIDATION_AUDIT_ENABLED): one row per verify outcome. The transaction
-- id or purchase token is kept only as a keyed hash (HMAC-SHA256 under a key derived from
-- ENCRYPTION_KEY), so the table answers "was this id verified, when, with what result" for
-- someone who holds the id, without storing the id itself.

CREATE TABLE validation_audit (
  id              bigserial PRIMARY KEY,
  tenant_id       text NOT NULL REFERENCES tenants (id),
  store           text NOT NULL CHECK (store IN ('storea', 'storeb')),
  subject_hash    text NOT NULL,
  -- `valid`, or the domain or error code the client received.
  outcome         text NOT NULL,
  -- The last upstream HTTP status, null when the store was not asked or not reached.
  upstream_status integer,
  latency_ms      integer NOT NULL,
  created_at      timestamptz NOT NULL
);

-- Retention pruning deletes by age; lookups go by tenant and subject.
CREATE INDEX validation_audit_created_at ON validation_audit (created_at);
CREATE INDEX validation_audit_subject ON validation_audit (tenant_id, subject_hash);
