-- The runtime switches (schema/007_runtime_switches.sql): read by every broker, set by the CLI
-- and the operator's HTTP route.

-- name: read
SELECT name, enabled, updated_at FROM queen.runtime_switches ORDER BY name

-- name: set
-- A change tells every broker (LISTEN queen_switches) at its commit; they re-read the table.
WITH changed AS (
    INSERT INTO queen.runtime_switches AS s (name, enabled) VALUES (%(name)s, %(enabled)s)
    ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, updated_at = now()
    WHERE s.enabled IS DISTINCT FROM excluded.enabled
    RETURNING name
)
SELECT pg_notify('queen_switches', name) FROM changed
