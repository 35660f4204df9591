-- Queries of the migrator (queen_trio/db/migrations.py). The DDL itself lives in schema/.

-- name: lock
-- One broker migrates at a time; the others wait here, then find nothing left to do.
SELECT pg_advisory_lock(hashtext('queen-trio:migrations'))

-- name: unlock
SELECT pg_advisory_unlock(hashtext('queen-trio:migrations'))

-- name: bootstrap
CREATE SCHEMA IF NOT EXISTS queen;
CREATE TABLE IF NOT EXISTS queen.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- The function files (schema/functions/<name>) as last applied.
CREATE TABLE IF NOT EXISTS queen.schema_functions (
    name       text PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: applied
SELECT version, name, checksum FROM queen.schema_migrations ORDER BY version

-- name: record
INSERT INTO queen.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)

-- name: forget_migrations
-- The pre-baseline history, replaced by the baseline's row in the same transaction.
DELETE FROM queen.schema_migrations

-- name: functions_applied
SELECT name, checksum FROM queen.schema_functions ORDER BY name

-- name: record_function
INSERT INTO queen.schema_functions (name, checksum) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()

-- name: forget_functions
-- Files no longer shipped (renamed or merged: their functions are defined elsewhere now).
DELETE FROM queen.schema_functions WHERE name <> ALL (%s)
