-- Runtime queries of KV state (queen_trio/kv/store.py). An expired key is invisible at once;
-- the purger deletes it later.

-- name: lock_existing
-- The value being replaced, if any (its size leaves the storage usage; expired = not there).
SELECT size_bytes, expires_at IS NOT NULL AND expires_at <= now() AS expired
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
FOR UPDATE

-- name: put
INSERT INTO queen.kv AS kv (tenant_id, namespace, key, value, size_bytes, expires_at, updated_at)
VALUES (%(tenant_id)s, %(namespace)s, %(key)s, %(value)s::jsonb, octet_length(%(value)s::text),
        CASE WHEN %(ttl_s)s::integer IS NULL THEN NULL
             ELSE now() + make_interval(secs => %(ttl_s)s::integer) END,
        now())
ON CONFLICT (tenant_id, namespace, key) DO UPDATE SET
    value = excluded.value, size_bytes = excluded.size_bytes,
    expires_at = excluded.expires_at, updated_at = excluded.updated_at
RETURNING kv.expires_at, kv.size_bytes

-- name: get
SELECT value, expires_at, updated_at
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
  AND (expires_at IS NULL OR expires_at > now())

-- name: delete
WITH gone AS (
    DELETE FROM queen.kv
    WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
    RETURNING size_bytes, expires_at IS NULL OR expires_at > now() AS live
)
SELECT size_bytes, live FROM gone

-- name: purge_expired
-- One batch of expired keys; the purger repeats it while it fills.
WITH doomed AS (
    SELECT tenant_id, namespace, key FROM queen.kv
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM queen.kv kv USING doomed d
    WHERE kv.tenant_id = d.tenant_id AND kv.namespace = d.namespace AND kv.key = d.key
    RETURNING kv.tenant_id, kv.size_bytes
)
SELECT tenant_id, sum(size_bytes)::bigint AS bytes, count(*) AS n FROM gone GROUP BY tenant_id
