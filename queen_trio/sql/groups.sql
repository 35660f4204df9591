-- Consumer-group admin (queen_trio/log/groups.py). Every query is tenant-scoped.

-- name: group_partitions
-- One row per (consumer group, partition) cursor, with the group's lag there: the messages
-- after its cursor (out-of-order acks not counted) and the created_at of the oldest of them,
-- exact in the head, the first frame of its segment when sealed (an upper bound of its age).
-- A group that has read a queue also lags on the queue's partitions it has not read yet (one
-- created since, or one it never popped): those rows have no cursor (committed -1, never
-- updated) and every retained message is lag, as its first pop there starts at log_start.
-- A group subscribed with mode "new" starts such a partition at its subscription instant:
-- it gets no such rows (its lag there shows from its first pop on it).
WITH c AS (
    SELECT c.partition_id, c.consumer_group, c.committed, c.acked_ahead, c.lease_id,
           c.lease_expires_at, c.leased_to, c.updated_at
    FROM queen.cursors c
    WHERE c.tenant_id = %(tenant_id)s
      AND (%(group)s::text IS NULL OR c.consumer_group = %(group)s)
    UNION ALL
    SELECT p.partition_id, k.consumer_group, -1, '{}'::bigint[], NULL, NULL, NULL, NULL
    FROM (SELECT DISTINCT k.consumer_group, kp.queue_id
          FROM queen.cursors k JOIN queen.partitions kp USING (partition_id)
          WHERE k.tenant_id = %(tenant_id)s
            AND (%(group)s::text IS NULL OR k.consumer_group = %(group)s)) k
    JOIN queen.partitions p ON p.queue_id = k.queue_id
    JOIN queen.queues kq ON kq.queue_id = k.queue_id
    WHERE NOT EXISTS (SELECT 1 FROM queen.cursors x
                      WHERE x.partition_id = p.partition_id
                        AND x.consumer_group = k.consumer_group)
      AND NOT EXISTS (SELECT 1 FROM queen.group_subscriptions s
                      WHERE s.tenant_id = %(tenant_id)s AND s.queue = kq.name
                        AND s.consumer_group = k.consumer_group)
)
SELECT c.consumer_group, q.name AS queue, p.name AS partition, p.partition_id, c.committed,
       c.lease_id, c.lease_expires_at, c.leased_to, c.updated_at,
       coalesce(c.lease_expires_at > now(), false) AS leased,
       p.log_start, p.next_offset, x.start,
       greatest(0, p.next_offset - x.start
                   - cardinality(ARRAY(SELECT a FROM unnest(c.acked_ahead) a
                                       WHERE a >= x.start AND a < p.next_offset)))::bigint
           AS lag_messages,
       CASE WHEN x.start < p.next_offset THEN coalesce(
           (SELECT f.created_at FROM queen.frames f
            WHERE f.partition_id = p.partition_id AND f."offset" = x.start),
           (SELECT s.first_created_at FROM queen.segments s
            WHERE s.partition_id = p.partition_id
              AND x.start BETWEEN s.first_offset AND s.last_offset)) END AS oldest_at,
       now() AS now
FROM c
JOIN queen.partitions p USING (partition_id)
JOIN queen.queues q USING (queue_id)
CROSS JOIN LATERAL (SELECT greatest(c.committed + 1, p.log_start) AS start) x
WHERE p.tenant_id = %(tenant_id)s
  AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
ORDER BY c.consumer_group, q.name, p.name

-- name: delete_group
-- The group's cursors (on one queue, or all) and its redelivery counts there; dead letters
-- stay. Returns one row per cursor deleted.
WITH gone AS (
    DELETE FROM queen.cursors c
    USING queen.partitions p, queen.queues q
    WHERE c.partition_id = p.partition_id AND q.queue_id = p.queue_id
      AND p.tenant_id = %(tenant_id)s AND c.tenant_id = %(tenant_id)s
      AND c.consumer_group = %(group)s
      AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
    RETURNING c.partition_id, c.lease_expires_at > now() AS leased, q.name AS queue
), retries AS (
    DELETE FROM queen.retries r
    USING gone g
    WHERE r.partition_id = g.partition_id AND r.consumer_group = %(group)s
)
SELECT partition_id, coalesce(leased, false) AS leased, queue FROM gone

-- name: delete_group_subscriptions
-- deleteMetadata: the group's subscription records (subscriptionMode=new), so that it
-- subscribes afresh at its next pop. Returns one row per record deleted.
DELETE FROM queen.group_subscriptions
WHERE tenant_id = %(tenant_id)s AND consumer_group = %(group)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
RETURNING queue

-- name: seek_partitions
-- The partitions of a queue (all, or one by name) to seek a group on. A push committing
-- meanwhile lands after the seek.
SELECT p.partition_id, p.name, p.log_start, p.next_offset
FROM queen.partitions p
JOIN queen.queues q USING (queue_id)
WHERE q.tenant_id = %(tenant_id)s AND q.name = %(queue)s
  AND (%(partition)s::text IS NULL OR p.name = %(partition)s)
ORDER BY p.name

-- name: queue_exists
SELECT 1 FROM queen.queues WHERE tenant_id = %(tenant_id)s AND name = %(queue)s

-- name: first_segment_after
-- The first retained segment holding a frame created after the instant.
SELECT first_offset, last_offset, first_created_at
FROM queen.segments
WHERE partition_id = %(partition_id)s AND last_created_at > %(at)s
  AND last_offset >= %(log_start)s
ORDER BY first_offset
LIMIT 1

-- name: first_head_after
SELECT min("offset") AS "offset"
FROM queen.frames
WHERE partition_id = %(partition_id)s AND created_at > %(at)s AND "offset" >= %(log_start)s

-- name: set_cursor
-- Move (or create) a group's cursor: nothing done ahead, no lease (a live one is cleared: its
-- holder's acks are then refused: lease_lost), no redelivery counts. Returns whether a live lease
-- was cleared.
WITH old AS (
    SELECT lease_expires_at > now() AS leased
    FROM queen.cursors
    WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s
    FOR UPDATE
), upsert AS (
    INSERT INTO queen.cursors (partition_id, consumer_group, tenant_id, committed)
    VALUES (%(partition_id)s, %(group)s, %(tenant_id)s, %(committed)s)
    ON CONFLICT (partition_id, consumer_group) DO UPDATE
        SET committed = excluded.committed, acked_ahead = '{}', lease_id = NULL,
            lease_expires_at = NULL, leased_to = NULL, updated_at = now()
    RETURNING 1
), retries AS (
    DELETE FROM queen.retries
    WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s
)
SELECT coalesce((SELECT leased FROM old), false) AS lease_cleared,
       (SELECT count(*) FROM upsert) AS n

-- name: delete_group_policies
-- deleteMetadata: the group's delivery policies (conflation), registered again by its next pop.
DELETE FROM queen.group_policies
WHERE tenant_id = %(tenant_id)s AND consumer_group = %(group)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
