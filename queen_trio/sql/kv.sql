-- Runtime queries of KV state (queen_trio/kv/store.py). A row past its expires_at is invisible
-- at once (`live` false: it never counts as existing); the purger deletes it later. now() is
-- the transaction's instant, so every operation of one call judges expiry at the same time.
-- Every write stamps a new version from queen.kv_version_seq (schema/004_kv_versions.sql).

-- name: lock
-- The row a write or a check is about to judge, locked until the call commits: FOR UPDATE
-- for a write, FOR SHARE (lock_shared) for a check, so that a row a bundle's guard looked at
-- cannot be rewritten before that bundle commits. `number` is a numeric value's exact text
-- (an incr adds to it as a decimal, never through a float).
SELECT value, version, size_bytes, expires_at, updated_at,
       expires_at IS NULL OR expires_at > now() AS live,
       CASE WHEN jsonb_typeof(value) = 'number' THEN value::text END AS number
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
FOR UPDATE

-- name: lock_shared
SELECT value, version, size_bytes, expires_at, updated_at,
       expires_at IS NULL OR expires_at > now() AS live,
       CASE WHEN jsonb_typeof(value) = 'number' THEN value::text END AS number
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
FOR SHARE

-- name: read
SELECT value, version, size_bytes, expires_at, updated_at, true AS live
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
  AND (expires_at IS NULL OR expires_at > now())

-- name: insert
-- A key with no row at all. DO NOTHING when a concurrent call created it first: the caller
-- then locks that row and judges again (ON CONFLICT waited for its transaction to end).
INSERT INTO queen.kv AS kv
    (tenant_id, namespace, key, value, size_bytes, version, expires_at, updated_at)
VALUES (%(tenant_id)s, %(namespace)s, %(key)s, %(value)s::jsonb, %(size)s,
        nextval('queen.kv_version_seq'),
        CASE WHEN %(ttl_s)s::bigint IS NULL THEN NULL
             ELSE now() + make_interval(secs => %(ttl_s)s::double precision) END,
        now())
ON CONFLICT (tenant_id, namespace, key) DO NOTHING
RETURNING version, expires_at, updated_at

-- name: update
-- A locked row rewritten: keep_expiry (an incr on a live counter) leaves its expiry alone,
-- anything else sets the one the write declared (a put never inherits the old one).
UPDATE queen.kv
SET value = %(value)s::jsonb, size_bytes = %(size)s, version = nextval('queen.kv_version_seq'),
    expires_at = CASE WHEN %(keep_expiry)s THEN expires_at
                      WHEN %(ttl_s)s::bigint IS NULL THEN NULL
                      ELSE now() + make_interval(secs => %(ttl_s)s::double precision) END,
    updated_at = now()
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s
RETURNING version, expires_at, updated_at

-- name: delete
DELETE FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = %(key)s

-- name: get_many
SELECT key, value, version, size_bytes, expires_at, updated_at
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s AND key = ANY(%(keys)s::text[])
  AND (expires_at IS NULL OR expires_at > now())
ORDER BY key

-- name: get_prefix
-- starts_with() is the meaning (no LIKE metacharacters to escape); the range on key is only
-- there so the primary key drives the scan. One row past the limit tells `truncated`.
SELECT key, value, version, size_bytes, expires_at, updated_at
FROM queen.kv
WHERE tenant_id = %(tenant_id)s AND namespace = %(namespace)s
  AND key >= %(prefix)s AND (%(end)s::text IS NULL OR key < %(end)s::text)
  AND starts_with(key, %(prefix)s)
  AND (%(after)s::text IS NULL OR key > %(after)s::text)
  AND (expires_at IS NULL OR expires_at > now())
ORDER BY key
LIMIT %(limit)s + 1

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
