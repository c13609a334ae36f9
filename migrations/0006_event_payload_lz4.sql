-- Store new event payloads with LZ4 where the server has it (PostgreSQL 14 and later built with LZ4,
-- as Debian's, the official images' and the managed services' are). Each signature of a store A
-- notification repeats the store's certificate chain. pglz, the default, finds repeats only within
-- 4 KB, so a 16.6 KB payload became about 10 KB. LZ4 sees the repeats and makes it about 4.5 KB, at
-- a fifth of pglz's CPU per insert and less per read (docs/architecture.md, "How event payloads
-- are stored"). Rows stored before keep pglz and read as before.
--
-- The embedded engine is built without LZ4, and PostgreSQL 13 has no per-column compression: both
-- keep the default. Only the catalog changes; the table is not rewritten.
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_settings
             WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
    -- A string, so that PostgreSQL 13 does not reject the syntax before the check has run.
    EXECUTE 'ALTER TABLE events ALTER COLUMN payload SET COMPRESSION lz4';
  END IF;
END
$$;
