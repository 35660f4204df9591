-- The runtime switches (schema/006_runtime_switches.sql): read by every broker, set by the CLI
-- and the operator's HTTP route.

-- name: read
SELECT name, enabled, updated_at FROM queen.runtime_switches ORDER BY name

-- name: set
-- The trigger on the table NOTIFYs queen_switches at the commit.
INSERT INTO queen.runtime_switches AS s (name, enabled) VALUES (%(name)s, %(enabled)s)
ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, updated_at = now()
WHERE s.enabled IS DISTINCT FROM excluded.enabled
