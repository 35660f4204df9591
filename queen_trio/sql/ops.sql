-- Queries behind the operational endpoints (/health, /metrics).

-- name: health
-- One round trip: proves the database answers and reports the schema it is at.
SELECT coalesce((SELECT max(version) FROM queen.schema_migrations), 0) AS schema_version
