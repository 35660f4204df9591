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
)

-- name: applied
SELECT version, name, checksum FROM queen.schema_migrations ORDER BY version

-- name: record
INSERT INTO queen.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)

-- name: current_version
SELECT coalesce(max(version), 0) AS version FROM queen.schema_migrations
