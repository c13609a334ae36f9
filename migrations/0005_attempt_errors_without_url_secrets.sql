-- Attempt errors recorded before this version could quote the callback URL with its query string
-- (the HTTP client's messages did), where tenants put tokens. Cut every URL in them down to scheme,
-- host and path, as errors are written now (docs/security.md, "Callback safety").
UPDATE delivery_attempts
SET error = regexp_replace(error, '(https?://[^\s?#]*)[?#]\S*', '\1', 'gi')
WHERE error ~* 'https?://[^\s?#]*[?#]';

UPDATE deliveries
SET last_error = regexp_replace(last_error, '(https?://[^\s?#]*)[?#]\S*', '\1', 'gi')
WHERE last_error ~* 'https?://[^\s?#]*[?#]';
