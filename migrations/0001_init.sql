-- Tenants, their API keys, their store credentials, and service settings.
-- Secrets (store credentials, webhook secrets) are sealed by the service (AES-256-GCM) before
-- they reach this database; the columns holding them end in `_sealed`.

CREATE TABLE tenants (
  id                    text PRIMARY KEY,
  name                  text NOT NULL,
  active                boolean NOT NULL DEFAULT true,
  callback_url          text,
  webhook_secret_sealed text,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now()
);

-- An API key is stored only as the SHA-256 of the whole token; `prefix` is the part shown in
-- listings so that an operator can tell keys apart.
CREATE TABLE api_keys (
  id           text PRIMARY KEY,
  tenant_id    text NOT NULL REFERENCES tenants (id),
  name         text,
  env          text NOT NULL CHECK (env IN ('live', 'test')),
  key_hash     text NOT NULL UNIQUE,
  prefix       text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  last_used_at timestamptz,
  revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE storea_credentials (
  tenant_id          text PRIMARY KEY REFERENCES tenants (id),
  bundle_id          text NOT NULL,
  key_id             text NOT NULL,
  issuer_id          text NOT NULL,
  private_key_sealed text NOT NULL,
  environment        text NOT NULL CHECK (environment IN ('auto', 'production', 'sandbox')),
  app_id             bigint,
  updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE storeb_credentials (
  tenant_id              text PRIMARY KEY REFERENCES tenants (id),
  package_name           text NOT NULL,
  client_email           text NOT NULL,
  service_account_sealed text NOT NULL,
  push_audience          text NOT NULL,
  push_service_account   text,
  updated_at             timestamptz NOT NULL DEFAULT now()
);

-- Service-wide values, such as the encryption canary that proves which master key this
-- database was set up with.
CREATE TABLE settings (
  name       text PRIMARY KEY,
  value      text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
