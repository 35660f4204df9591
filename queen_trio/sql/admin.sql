-- Operators' read routes and dead-letter pages (queen_trio/log/admin.py). Every query is
-- tenant-scoped. Each paged query returns at least one row: the total, with the page's rows
-- joined to it (their columns null when the page is empty).

-- name: dead_letter_page
-- Dead letters oldest first (dead_letter_id order), either after a keyset cursor or skipping
-- ``offset`` of them; ``total`` counts every match of the filters, cursor aside.
WITH matching AS (
    SELECT d.dead_letter_id, d.transaction_id, d.partition_id, q.name AS queue,
           p.name AS partition, d.consumer_group, d."offset", d.error, d.retry_count,
           d.payload, d.frame_created_at, d.created_at, d.replayed_at, d.replay_transaction_id
    FROM queen.dead_letters d
    JOIN queen.queues q USING (queue_id)
    LEFT JOIN queen.partitions p ON p.partition_id = d.partition_id
    WHERE d.tenant_id = %(tenant_id)s
      AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
      AND (%(group)s::text IS NULL OR d.consumer_group = %(group)s)
      AND (%(partition)s::text IS NULL OR p.name = %(partition)s)
      AND (%(from)s::timestamptz IS NULL OR d.created_at >= %(from)s)
      AND (%(to)s::timestamptz IS NULL OR d.created_at <= %(to)s)
)
SELECT t.total, pg.*
FROM (SELECT count(*) AS total FROM matching) t
LEFT JOIN LATERAL (
    SELECT * FROM matching
    WHERE dead_letter_id > %(after)s
    ORDER BY dead_letter_id
    LIMIT %(limit)s OFFSET %(offset)s
) pg ON true

-- name: partition_states
-- Every partition of the tenant (of one queue) with what its consumer groups did there:
-- the slowest group's cursor (min_committed), the live leases and the frames they hold.
SELECT q.queue_id, q.name AS queue, q.created_at AS queue_created_at, p.partition_id, p.name,
       p.created_at, p.log_start, p.next_offset,
       c.groups, c.min_committed, c.leases, c.leased_frames,
       (SELECT count(*) FROM queen.dead_letters d
        WHERE d.queue_id = q.queue_id AND d.partition_id = p.partition_id) AS dead_letters
FROM queen.partitions p
JOIN queen.queues q USING (queue_id)
CROSS JOIN LATERAL (
    SELECT count(*) AS groups, min(committed) AS min_committed,
           count(*) FILTER (WHERE lease_expires_at > now()) AS leases,
           coalesce(sum(greatest(0, leased_to - greatest(committed, p.log_start - 1)))
                    FILTER (WHERE lease_expires_at > now()), 0)::bigint AS leased_frames
    FROM queen.cursors
    WHERE partition_id = p.partition_id
) c
WHERE p.tenant_id = %(tenant_id)s AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
ORDER BY q.name, p.name

-- name: queue_count
SELECT count(*) AS n FROM queen.queues
WHERE tenant_id = %(tenant_id)s AND (%(queue)s::text IS NULL OR name = %(queue)s)

-- name: dead_letter_count
SELECT count(*) AS n, count(DISTINCT d.partition_id) AS partitions
FROM queen.dead_letters d
JOIN queen.queues q USING (queue_id)
WHERE d.tenant_id = %(tenant_id)s AND (%(queue)s::text IS NULL OR q.name = %(queue)s)

-- name: message_page
-- Messages created in [from, to], newest first, with their status across the partition's
-- consumer groups. Sealed frames are listed from their segment's transaction ids and sorted
-- by the segment's newest createdAt (their own createdAt is read by the broker afterwards).
WITH parts AS (
    SELECT p.partition_id, p.name, p.log_start, q.name AS queue
    FROM queen.partitions p
    JOIN queen.queues q USING (queue_id)
    WHERE p.tenant_id = %(tenant_id)s
      AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
      AND (%(partition)s::text IS NULL OR p.name = %(partition)s)
), keys AS (
    SELECT f.partition_id, f."offset", f.transaction_id, f.created_at AS sort_at,
           f.created_at, true AS head
    FROM parts p
    JOIN queen.frames f ON f.partition_id = p.partition_id
    WHERE f.created_at BETWEEN %(from)s AND %(to)s
    UNION ALL
    SELECT s.partition_id, s.first_offset + i - 1, s.transaction_ids[i], s.last_created_at,
           NULL::timestamptz, false
    FROM parts p
    JOIN queen.segments s ON s.partition_id = p.partition_id
    CROSS JOIN LATERAL generate_subscripts(s.transaction_ids, 1) AS i
    WHERE s.last_created_at >= %(from)s AND s.first_created_at <= %(to)s
      AND s.first_offset + i - 1 >= p.log_start
), dead AS (
    SELECT DISTINCT d.partition_id, d."offset"
    FROM queen.dead_letters d
    JOIN parts p USING (partition_id)
), rated AS (
    SELECT k.*, p.queue, p.name AS partition, st.groups, st.consumed_by, st.queue_mode,
           st.lease_expires_at,
           CASE WHEN dl."offset" IS NOT NULL THEN 'dead_letter'
                WHEN st.groups > 0 AND st.consumed_by = st.groups THEN 'completed'
                WHEN st.lease_expires_at IS NOT NULL THEN 'processing'
                ELSE 'pending' END AS status
    FROM keys k
    JOIN parts p USING (partition_id)
    LEFT JOIN dead dl ON dl.partition_id = k.partition_id AND dl."offset" = k."offset"
    CROSS JOIN LATERAL (
        SELECT count(*) AS groups,
               count(*) FILTER (WHERE c.committed >= k."offset"
                                   OR k."offset" = ANY(c.acked_ahead)) AS consumed_by,
               coalesce(bool_or(c.consumer_group = '__QUEUE_MODE__'), false) AS queue_mode,
               max(c.lease_expires_at) FILTER (
                   WHERE c.lease_expires_at > now() AND k."offset" > c.committed
                     AND k."offset" <= c.leased_to) AS lease_expires_at
        FROM queen.cursors c
        WHERE c.partition_id = k.partition_id
    ) st
), matching AS (
    SELECT * FROM rated WHERE %(status)s::text IS NULL OR status = %(status)s
)
SELECT t.total, pg.*
FROM (SELECT count(*) AS total FROM matching) t
LEFT JOIN LATERAL (
    SELECT * FROM matching
    ORDER BY sort_at DESC, partition_id, "offset" DESC
    LIMIT %(limit)s OFFSET %(offset)s
) pg ON true

-- name: message_partition
-- The partition a single-message lookup names, if it is the tenant's, with its queue.
SELECT p.partition_id, p.name, p.log_start, p.next_offset, q.name AS queue, q.lease_time_s,
       q.retry_limit, q.retention_s, q.delayed_processing_s, q.dead_letter_queue
FROM queen.partitions p
JOIN queen.queues q USING (queue_id)
WHERE p.partition_id = %(partition_id)s AND p.tenant_id = %(tenant_id)s

-- name: message_offsets
-- The retained offsets holding a transactionId (head or sealed), newest first.
SELECT f."offset"
FROM queen.find_transactions(%(partition_id)s, ARRAY[%(transaction_id)s]::text[]) f
WHERE f."offset" >= %(log_start)s
ORDER BY f."offset" DESC

-- name: message_groups
-- Each consumer group of the partition, as it stands with one offset.
SELECT c.consumer_group, c.committed,
       c.committed >= %(offset)s OR %(offset)s = ANY(c.acked_ahead) AS consumed,
       CASE WHEN c.lease_expires_at > now() AND %(offset)s > c.committed
                 AND %(offset)s <= c.leased_to THEN c.lease_expires_at END AS lease_expires_at,
       r.retry_count, r.last_error
FROM queen.cursors c
LEFT JOIN queen.retries r ON r.partition_id = c.partition_id
      AND r.consumer_group = c.consumer_group AND r."offset" = %(offset)s
WHERE c.partition_id = %(partition_id)s
ORDER BY c.consumer_group

-- name: message_dead_letters
SELECT consumer_group, error, retry_count, created_at
FROM queen.dead_letters
WHERE partition_id = %(partition_id)s AND "offset" = %(offset)s AND tenant_id = %(tenant_id)s
ORDER BY dead_letter_id
