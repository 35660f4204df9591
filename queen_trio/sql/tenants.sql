-- Runtime and CLI queries about tenants, their tokens, plans and storage usage.

-- name: tenant_id_by_name
SELECT tenant_id FROM queen.tenants WHERE name = %(name)s

-- name: create_tenant
INSERT INTO queen.tenants (name) VALUES (%(name)s)
ON CONFLICT (name) DO NOTHING
RETURNING tenant_id

-- name: list_tenants
SELECT t.tenant_id, t.name, t.created_at, t.max_message_bytes, t.max_stored_bytes,
       t.requests_per_second, coalesce(u.stored_bytes, 0) AS stored_bytes,
       (SELECT count(*) FROM queen.tenant_tokens k
        WHERE k.tenant_id = t.tenant_id AND k.revoked_at IS NULL) AS active_tokens
FROM queen.tenants t
LEFT JOIN queen.tenant_usage u USING (tenant_id)
ORDER BY t.name

-- name: insert_token
INSERT INTO queen.tenant_tokens (tenant_id, prefix, salt, hash)
VALUES (%(tenant_id)s, %(prefix)s, %(salt)s, %(hash)s)

-- name: revoke_token
UPDATE queen.tenant_tokens SET revoked_at = now()
WHERE prefix = %(prefix)s AND revoked_at IS NULL
RETURNING tenant_id

-- name: token_by_prefix
SELECT tenant_id, salt, hash FROM queen.tenant_tokens
WHERE prefix = %(prefix)s AND revoked_at IS NULL

-- name: set_plan
UPDATE queen.tenants
SET max_message_bytes = CASE WHEN %(set_message)s THEN %(max_message_bytes)s
                             ELSE max_message_bytes END,
    max_stored_bytes = CASE WHEN %(set_stored)s THEN %(max_stored_bytes)s ELSE max_stored_bytes END,
    requests_per_second = CASE WHEN %(set_rate)s THEN %(requests_per_second)s
                               ELSE requests_per_second END,
    plan_updated_at = now()
WHERE name = %(name)s
RETURNING tenant_id, max_message_bytes, max_stored_bytes, requests_per_second

-- name: notify_plans
SELECT pg_notify('queen_tenants', %(name)s)

-- name: fold_usage
-- Brokers fold the deltas concurrently without double counting: each delta row is deleted
-- (and so counted) by exactly one of them.
WITH gone AS (DELETE FROM queen.usage_deltas RETURNING tenant_id, bytes),
     sums AS (SELECT tenant_id, sum(bytes)::bigint AS bytes FROM gone GROUP BY tenant_id)
INSERT INTO queen.tenant_usage AS u (tenant_id, stored_bytes)
SELECT tenant_id, bytes FROM sums
ON CONFLICT (tenant_id) DO UPDATE SET stored_bytes = u.stored_bytes + excluded.stored_bytes

-- name: plans
SELECT t.tenant_id, t.name, t.max_message_bytes, t.max_stored_bytes, t.requests_per_second,
       coalesce(u.stored_bytes, 0) AS stored_bytes
FROM queen.tenants t
LEFT JOIN queen.tenant_usage u USING (tenant_id)
