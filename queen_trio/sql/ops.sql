-- Queries behind the operational endpoints (/health, /metrics).

-- name: health
-- One round trip: proves the database answers, reports the schema it is at and whether the
-- server is a standby (in recovery).
SELECT coalesce((SELECT max(version) FROM queen.schema_migrations), 0) AS schema_version,
       pg_is_in_recovery() AS in_recovery

-- name: analyze_grown_tables
-- ANALYZE the queen tables that have outgrown their planner statistics (schema/functions/ops.sql).
SELECT table_name, live_rows, rows_before FROM queen.analyze_grown_tables(%(slack)s)
