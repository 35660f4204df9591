-- Runtime queries of the log (queen_trio/log/store.py). Every query is tenant-scoped.

-- name: upsert_queue
-- Configure: as in Queen, every option is set (omitted ones take their defaults).
INSERT INTO queen.queues AS q
    (tenant_id, name, lease_time_s, retry_limit, delayed_processing_s, retention_s,
     dead_letter_queue, retain_until_consumed, max_size, retry_delay_ms, ttl_s,
     completed_retention_s, retention_enabled, max_wait_s,
     window_buffer_s, encryption_enabled)
VALUES (%(tenant_id)s, %(name)s, %(lease_time_s)s, %(retry_limit)s, %(delayed_processing_s)s,
        %(retention_s)s, %(dead_letter_queue)s, %(retain_until_consumed)s, %(max_size)s,
        %(retry_delay_ms)s, %(ttl_s)s, %(completed_retention_s)s, %(retention_enabled)s,
        %(max_wait_s)s, %(window_buffer_s)s, %(encryption_enabled)s)
ON CONFLICT (tenant_id, name) DO UPDATE SET
    lease_time_s = excluded.lease_time_s,
    retry_limit = excluded.retry_limit,
    delayed_processing_s = excluded.delayed_processing_s,
    retention_s = excluded.retention_s,
    dead_letter_queue = excluded.dead_letter_queue,
    retain_until_consumed = excluded.retain_until_consumed,
    max_size = excluded.max_size,
    retry_delay_ms = excluded.retry_delay_ms,
    ttl_s = excluded.ttl_s,
    completed_retention_s = excluded.completed_retention_s,
    retention_enabled = excluded.retention_enabled,
    max_wait_s = excluded.max_wait_s,
    window_buffer_s = excluded.window_buffer_s,
    encryption_enabled = excluded.encryption_enabled,
    updated_at = now()
RETURNING queue_id, (xmax = 0) AS created,
          (SELECT p.partition_id FROM queen.partitions p
           WHERE p.queue_id = q.queue_id AND p.name = 'Default') AS default_partition_id

-- name: ensure_queues
-- Implicit creation by push (or timer): default options (schema/functions/push.sql).
SELECT queen.ensure_queues(%(tenant_id)s, %(names)s::text[])

-- name: ensure_partitions
SELECT queen.ensure_partitions(%(tenant_id)s, %(queues)s::text[], %(names)s::text[])

-- name: lock_partitions
-- All or nothing, in partition order (schema/functions/push.sql).
SELECT * FROM queen.lock_partitions(%(tenant_id)s, %(queues)s::text[], %(names)s::text[])

-- name: take_partitions
-- Lock the pairs, creating the missing ones first (schema/functions/push.sql).
SELECT * FROM queen.take_partitions(%(tenant_id)s, %(queues)s::text[], %(names)s::text[])

-- name: push_head
-- The common push in one statement (schema/functions/push.sql); 'fallback' sends the broker
-- to its general append. Sent straight through libpq (log/store.py append_head), each array
-- one text written in C (db/arrays.py pg_array), its columns read by position.
SELECT outcome, idx, partition_id, "offset", held_meta, held_by
FROM queen.push_head(%(tenant_id)s::integer, %(queues)s::text[], %(names)s::text[],
                     %(parts)s::integer[], %(txns)s::text[], %(dedupe)s::boolean[],
                     %(payloads)s::text[], %(metas)s::text[], %(usage_offset)s::bigint,
                     %(wake)s::text[])

-- name: existing_transactions
-- Push de-duplication: sealed frames count too. A duplicate answers with the id of the message
-- holding its transaction id: a head frame's meta comes along; in_head false, the frame is
-- sealed (its meta is in the segment).
SELECT t.transaction_id, t."offset", f.meta, f."offset" IS NOT NULL AS in_head
FROM queen.find_transactions(%(partition_id)s, %(txns)s::text[]) t
LEFT JOIN queen.frames f ON f.partition_id = %(partition_id)s AND f."offset" = t."offset"

-- name: lock_queue_capacity
-- maxSize: pushes into capped queues take turns per queue (a transaction-level advisory lock,
-- taken after the partition locks and in queue order, so pushers cannot deadlock; it blocks
-- nothing else). The depth is read by the next statement, which sees every push committed
-- before the lock was granted.
SELECT pg_advisory_xact_lock(1363170307, (ids.q %% 2147483647)::integer)
FROM (SELECT unnest(%(queue_ids)s::bigint[]) AS q ORDER BY 1) ids

-- name: queue_depths
-- What each queue holds that its queue-mode consumers have not consumed yet (Queen counts
-- maxSize on __QUEUE_MODE__ too): offsets past that cursor (or past log_start), all partitions.
SELECT p.queue_id,
       sum(p.next_offset - greatest(coalesce(c.committed + 1, 0), p.log_start))::bigint AS depth
FROM queen.partitions p
LEFT JOIN queen.cursors c
       ON c.partition_id = p.partition_id AND c.consumer_group = '__QUEUE_MODE__'
WHERE p.queue_id = ANY(%(queue_ids)s::bigint[])
GROUP BY p.queue_id

-- name: insert_frames
-- The frames and the partition's next offset, in one statement. Arrays travel in binary (%%b):
-- quoting thousands of JSON texts costs more than the insert.
WITH inserted AS (
INSERT INTO queen.frames (partition_id, "offset", tenant_id, transaction_id, payload,
                          size_bytes, created_at, meta)
SELECT %(partition_id)s, o, %(tenant_id)s, t, p::jsonb, octet_length(p), clock_timestamp(),
       m::jsonb
FROM unnest(%(offsets)b::bigint[], %(txns)b::text[], %(payloads)b::text[], %(metas)b::text[])
     AS u(o, t, p, m)
RETURNING 1
)
UPDATE queen.partitions SET next_offset = %(next_offset)s WHERE partition_id = %(partition_id)s

-- name: notify_queue
-- Wakes long-polling pops of this queue (on every broker); delivered only if we commit.
SELECT pg_notify('queen_log', %(payload)s)

-- name: pop_answer
-- What the one-statement pops answer (pop_head, settle_pop_head, pop_head_after below, each
-- followed by its function's call, WITH ORDINALITY AS p). The commit level (NULL: the server's
-- own) is set for the statement's own transaction (the functions always return a row, so the
-- join evaluates it); it takes effect at the commit that ends the statement. Payload and meta
-- come back as JSON text: the payload goes into the answer as it is stored, never decoded
-- (store._head_answer). What every row of a batch shares (partition, lease) is on its first
-- row only, the others NULL: a 500-message batch's 499 copies of two uuids, a name and an
-- instant were a third of what reading the rows cost the broker. An 'empty' answer from a pop
-- (batch above 0) says when to look again (look_in_s, as next_look below): a pop that then
-- parks needs no statement of its own for it. With look_after a pop that took messages
-- says it on its first row too (settle_pop_head's, for a stream: whether anything else is
-- poppable for it): 0 at once when the pop's walk finds a partition poppable now
-- (queen.poppable_now, from the rotation pointer), else next_look's answer; the other
-- pops pass false.
WITH commit_level AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')),
                      true))
SELECT p.outcome, CASE WHEN p.ordinality = 1 THEN p.partition_id END AS partition_id,
       CASE WHEN p.ordinality = 1 THEN p.partition END AS partition,
       CASE WHEN p.ordinality = 1 THEN p.lease_id END AS lease_id,
       CASE WHEN p.ordinality = 1 THEN p.lease_expires_at END AS lease_expires_at, p."offset",
       p.transaction_id, p.payload::text AS payload, p.created_at, p.meta::text AS meta,
       CASE WHEN p.outcome = 'empty' AND %(batch)s > 0
            THEN queen.next_look(%(tenant_id)s, %(name)s, %(group)s, %(partition)s)
            WHEN p.outcome = 'messages' AND p.ordinality = 1 AND %(look_after)s
            THEN CASE WHEN queen.poppable_now(%(tenant_id)s, %(name)s, %(group)s,
                                              %(partition)s, %(after)s) THEN 0::float8
                      ELSE queen.next_look(%(tenant_id)s, %(name)s, %(group)s, %(partition)s)
                 END
       END AS look_in_s
FROM commit_level,

-- name: pop_head
-- The common pop in one statement (schema/functions/log.sql); 'fallback' sends the broker to
-- its general pop. The answer: pop_answer above.
{{pop_answer}}
     queen.pop_head(%(tenant_id)s, %(name)s, %(group)s, %(partition)s, %(batch)s,
                    %(auto_ack)s, %(after)s) WITH ORDINALITY AS p

-- name: settle_pop_head
-- A stream's batch completed whole through its last offset, then (batch above 0) the next
-- pop, in one statement (queen.settle_pop_head, schema/functions/log.sql); the answer as for
-- pop_head, but with %(look_after)s a pop that took messages says on its first row when to
-- look again too (as an empty one does): the stream then knows whether anything else is
-- poppable for it (api/stream.py, its settlement carried by the next sweep).
{{pop_answer}}
     queen.settle_pop_head(%(tenant_id)s, %(name)s, %(group)s, %(partition_id)s,
                           %(lease_id)s, %(from)s, %(through)s, %(partition)s, %(batch)s,
                           %(after)s) WITH ORDINALITY AS p

-- name: pop_head_after
-- pop_head, tried from the due instant of a timer about to fire into this queue until it has
-- fired or p_give_up (schema/functions/log.sql); the answer as for pop_head.
{{pop_answer}}
     queen.pop_head_after(%(tenant_id)s, %(name)s, %(group)s, %(partition)s, %(batch)s,
                          %(auto_ack)s, %(not_before)s, %(give_up)s) WITH ORDINALITY AS p

-- name: pop_commit_level
-- The general pop sets its transaction's commit level first.
SELECT set_config('synchronous_commit', %(synchronous_commit)s, true)

-- name: pop_candidates
-- Partitions of the queue with frames past the group's cursor and no live lease for the group,
-- in the rotation after the partition this broker last served the group (queen.pop_walk,
-- schema/functions/log.sql: the same candidates, in the same order, as the one-statement pop),
-- each with the queue's options (no row: nothing to pop, or no such queue: the same answer).
SELECT partition_id, name, log_start, next_offset, queue_id, lease_time_s, retry_limit,
       delayed_processing_s, dead_letter_queue
FROM queen.pop_walk(%(tenant_id)s, %(name)s, %(group)s, %(partition)s, %(after)s, %(limit)s)

-- name: share_partition_unless_pushed
-- A pop over several partitions takes each partition's key-share lock (what the cursor's and
-- retries' foreign keys take) without waiting. Pushes and the fire lock partitions FOR NO KEY
-- UPDATE, which does not conflict with it; only a key change or a delete of the partition
-- (FOR UPDATE) does, and the pop then goes on to another partition instead of waiting.
SELECT 1 AS held FROM queen.partitions
WHERE partition_id = %(partition_id)s
FOR KEY SHARE SKIP LOCKED

-- name: next_look
-- For a long poll that found nothing: in how many seconds something in the queue becomes
-- poppable unannounced (queen.next_look in schema/functions/log.sql). The one-statement pops
-- answer it with their 'empty' row already (look_in_s).
SELECT queen.next_look(%(tenant_id)s, %(name)s, %(group)s, %(partition)s) AS in_s

-- name: claim_cursor_creation
-- Creating a group's cursors on a queue is one transaction's at a time (until it ends), and the
-- others skip instead of waiting: a multi-partition pop creates cursors in its candidates'
-- order, a seed (seed_cursors) in partition order, and two transactions each waiting on the
-- other's uncommitted cursor deadlocked (test_pop_ledger, one run in three). Whoever does not
-- get it treats the partition as taken by another consumer of the group, as a locked cursor.
SELECT pg_try_advisory_xact_lock(1363170308,
                                 hashtext(%(queue_id)s::text || ':' || %(group)s)) AS claimed

-- name: create_cursor
-- The group's first pop of this partition: the new row is ours (nobody else sees it before we
-- commit; creators take turns: claim_cursor_creation). It starts before log_start.
-- (A group subscribing from an instant starts later: committed is where it starts, less one.)
INSERT INTO queen.cursors (partition_id, consumer_group, tenant_id, committed)
VALUES (%(partition_id)s, %(group)s, %(tenant_id)s, %(committed)s)
ON CONFLICT (partition_id, consumer_group) DO NOTHING
RETURNING committed, acked_ahead, lease_id, lease_expires_at, leased_to,
          committed AS start_after

-- name: seed_cursors
-- A group's first pops of a queue with many partitions (5,000 in Queen's bootstrap tests):
-- one statement creates the group's cursor on every partition of the queue it has none on,
-- where its first pop there would have started it (create_cursor, subscription_start): before
-- log_start, or for a group subscribing from an instant before the first head frame created
-- at or after it (the end when none is). Partitions with a segment as new as that instant
-- are left to the first pop there (their frames are compressed: the broker reads them).
-- After this the group's pops of the queue take the one-statement pop (queen.pop_head)
-- instead of the general pop per partition. Partition order, as every creator of cursors.
WITH since AS MATERIALIZED (
    SELECT CASE WHEN %(subscribed)s THEN
               coalesce(%(since)s::timestamptz,
                        (SELECT g.subscribed_at FROM queen.group_subscriptions g
                         WHERE g.tenant_id = %(tenant_id)s AND g.queue = %(name)s
                           AND g.consumer_group = %(group)s),
                        clock_timestamp()) END AS at)
INSERT INTO queen.cursors (partition_id, consumer_group, tenant_id, committed)
SELECT p.partition_id, %(group)s, %(tenant_id)s,
       CASE WHEN since.at IS NULL THEN p.log_start - 1
            ELSE greatest(coalesce((SELECT min(f."offset") FROM queen.frames f
                                    WHERE f.partition_id = p.partition_id
                                      AND f."offset" >= p.log_start
                                      AND f.created_at >= since.at),
                                   p.next_offset),
                          p.log_start) - 1 END
FROM since, queen.partitions p
WHERE p.queue_id = %(queue_id)s
  AND NOT EXISTS (SELECT 1 FROM queen.cursors c
                  WHERE c.partition_id = p.partition_id AND c.consumer_group = %(group)s)
  AND (since.at IS NULL
       OR NOT EXISTS (SELECT 1 FROM queen.segments s
                      WHERE s.partition_id = p.partition_id AND s.last_offset >= p.log_start
                        AND s.last_created_at >= since.at))
ORDER BY p.partition_id
ON CONFLICT (partition_id, consumer_group) DO NOTHING

-- name: subscribe_group
-- subscriptionMode=new: the group's subscription instant on this queue, recorded by its first
-- such pop (queen.group_subscriptions in schema/002_group_subscriptions.sql).
INSERT INTO queen.group_subscriptions (tenant_id, queue, consumer_group)
VALUES (%(tenant_id)s, %(name)s, %(group)s)
ON CONFLICT (tenant_id, queue, consumer_group) DO NOTHING

-- name: group_policy
-- The consumer group's stored delivery policy on this queue (queen.group_policies in
-- schema/010_group_policies.sql); no row: the group has never popped it.
SELECT conflation FROM queen.group_policies
WHERE tenant_id = %(tenant_id)s AND queue = %(name)s AND consumer_group = %(group)s

-- name: register_group_policy
-- A group's first pop of a queue registers its policy as that pop asked. No row back: another
-- pop registered it first (read it again).
INSERT INTO queen.group_policies (tenant_id, queue, consumer_group, conflation)
VALUES (%(tenant_id)s, %(name)s, %(group)s, %(conflation)s)
ON CONFLICT (tenant_id, queue, consumer_group) DO NOTHING
RETURNING conflation

-- name: subscription_start
-- Where a group subscribing from an instant starts on a partition it has never popped: the
-- first segment holding a frame created at or after it (the broker finds the frame inside),
-- else the first such frame of the head, else the end. 'now' is the group's recorded instant
-- (clock_timestamp(): nothing committed before the subscription is new to it).
WITH since AS MATERIALIZED (
    SELECT coalesce(%(since)s::timestamptz,
                    (SELECT g.subscribed_at FROM queen.group_subscriptions g
                     WHERE g.tenant_id = %(tenant_id)s AND g.queue = %(name)s
                       AND g.consumer_group = %(group)s),
                    clock_timestamp()) AS at)
SELECT since.at,
       (SELECT s.first_offset FROM queen.segments s
        WHERE s.partition_id = %(partition_id)s AND s.last_offset >= %(log_start)s
          AND s.last_created_at >= since.at
        ORDER BY s.last_offset LIMIT 1) AS segment_first,
       (SELECT f."offset" FROM queen.frames f
        WHERE f.partition_id = %(partition_id)s AND f."offset" >= %(log_start)s
          AND f.created_at >= since.at
        ORDER BY f."offset" LIMIT 1) AS head_first,
       (SELECT p.next_offset FROM queen.partitions p
        WHERE p.partition_id = %(partition_id)s) AS next_offset
FROM since

-- name: lock_free_cursor
-- Two consumers of one group never hold one partition: whoever locks the cursor first and
-- finds no live lease takes it; the other skips to the next candidate.
SELECT c.committed, c.acked_ahead, c.lease_id, c.lease_expires_at, c.leased_to,
       greatest(c.committed, p.log_start - 1) AS start_after
FROM queen.cursors c
JOIN queen.partitions p USING (partition_id)
WHERE c.partition_id = %(partition_id)s AND c.consumer_group = %(group)s
  AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
  AND (c.retry_at IS NULL OR c.retry_at <= now())
FOR UPDATE OF c SKIP LOCKED

-- name: read_head
-- The head part of a read (queen_trio/log/frames.py), with the group's retry counts.
SELECT f."offset", f.transaction_id, f.payload, f.size_bytes, f.created_at, f.meta,
       coalesce(r.retry_count, 0) AS retry_count, r.last_error,
       -- delayedProcessing: seconds until this frame may be popped (<= 0: now)
       extract(epoch FROM f.created_at + make_interval(secs => %(delay_s)s) - now())::float8
           AS matures_in_s
FROM queen.read_frames(%(partition_id)s, %(from_offset)s, %(count)s) f
LEFT JOIN queen.retries r
       ON r.partition_id = %(partition_id)s AND r.consumer_group = %(group)s
      AND r."offset" = f."offset"
ORDER BY f."offset"

-- name: sealed_range
-- Where [from_offset, to_offset) is sealed: the segments holding it, in offset order, plus what
-- read_head joins for head frames (the database clock for delayedProcessing, the group's retry
-- counts), in one round trip.
SELECT now() AS now,
       ARRAY(SELECT s.first_offset FROM queen.segments s
             WHERE s.partition_id = %(partition_id)s AND s.last_offset >= %(from_offset)s
               AND s.first_offset < %(to_offset)s
             ORDER BY s.last_offset LIMIT %(limit)s) AS firsts,
       r.offsets AS retry_offsets, r.counts AS retry_counts, r.errors AS retry_errors
FROM (
    SELECT array_agg("offset") AS offsets, array_agg(retry_count) AS counts,
           array_agg(last_error) AS errors
    FROM queen.retries
    WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s
      AND "offset" >= %(from_offset)s AND "offset" < %(to_offset)s
) r

-- name: segment_data
SELECT first_offset, codec, data
FROM queen.segments
WHERE partition_id = %(partition_id)s AND first_offset = ANY(%(firsts)s::bigint[])

-- name: take_lease
UPDATE queen.cursors
SET committed = %(committed)s, acked_ahead = %(acked_ahead)s::bigint[],
    -- One lease for every partition of one pop (the caller's id), else a new one.
    lease_id = coalesce(%(lease_id)s::uuid, gen_random_uuid()),
    lease_expires_at = now() + make_interval(secs => %(lease_s)s),
    leased_to = %(leased_to)s,
    -- Queen's deliveryAttempt (schema/012_delivery_attempts.sql): a lease starting where the
    -- previous one started hands the same batch out again (the SET reads the old values).
    attempt_count = CASE WHEN attempt_offset = %(committed)s + 1 THEN attempt_count + 1
                         ELSE 1 END,
    attempt_offset = %(committed)s + 1,
    updated_at = now()
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s
-- (Its commit waits as the general pop set it, pop_commit_level: QUEEN_POP_COMMIT.)
RETURNING lease_id, lease_expires_at, attempt_count

-- name: undo_attempt
-- A batch handed back before its consumer got it was no delivery: its attempt is not counted
-- (a first delivery's leaves no mark, so the next pop hands it out as attempt 1 again).
UPDATE queen.cursors
SET attempt_count = greatest(attempt_count - 1, 0),
    attempt_offset = CASE WHEN attempt_count > 1 THEN attempt_offset END
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s

-- name: save_cursor
UPDATE queen.cursors
SET committed = %(committed)s, acked_ahead = %(acked_ahead)s::bigint[],
    lease_expires_at = CASE WHEN %(release)s THEN NULL ELSE lease_expires_at END,
    updated_at = now()
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s

-- name: hold_for_retry
-- retryDelay: a failed message (and so its partition, for this group) is not handed out again
-- before this.
UPDATE queen.cursors
SET retry_at = now() + make_interval(secs => %(delay_ms)s / 1000.0)
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s

-- name: forget_retries
DELETE FROM queen.retries
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s
  AND "offset" <= %(committed)s

-- name: frames_for_acks
-- Usually one row per txn; several when a timer re-used a txn after its first message went out.
SELECT f.transaction_id, f."offset", p.queue_id, p.name AS partition, q.name AS queue,
       q.retry_limit, q.dead_letter_queue, q.retry_delay_ms
FROM queen.partitions p
JOIN queen.queues q USING (queue_id)
CROSS JOIN LATERAL queen.find_transactions(p.partition_id, %(txns)s::text[]) f
WHERE p.partition_id = %(partition_id)s AND p.tenant_id = %(tenant_id)s
ORDER BY f."offset"

-- name: ack_head
-- The common acknowledgement in one statement (queen.ack_head, schema/functions/log.sql);
-- 'fallback' sends the broker to its general ack. The commit level as for pop_head: acks
-- riding a pop commit as pops do.
WITH commit_level AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')),
                      true))
SELECT a.* FROM commit_level,
     queen.ack_head(%(tenant_id)s, %(partition_id)s, %(group)s, %(lease_id)s,
                    %(txns)s::text[]) AS a

-- name: lock_cursor
SELECT committed, acked_ahead, lease_id, lease_expires_at, leased_to,
       lease_expires_at > now() AS lease_live
FROM queen.cursors
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s AND tenant_id = %(tenant_id)s
FOR UPDATE

-- name: bump_retry
INSERT INTO queen.retries (partition_id, consumer_group, "offset", tenant_id, retry_count,
                           last_error)
VALUES (%(partition_id)s, %(group)s, %(offset)s, %(tenant_id)s, 1, %(error)s)
ON CONFLICT (partition_id, consumer_group, "offset") DO UPDATE
    SET retry_count = queen.retries.retry_count + 1, last_error = excluded.last_error
RETURNING retry_count

-- name: retry_count
SELECT retry_count FROM queen.retries
WHERE partition_id = %(partition_id)s AND consumer_group = %(group)s AND "offset" = %(offset)s

-- name: dead_letter_frame
-- The frame comes from the reader (head or segment) as JSON text.
INSERT INTO queen.dead_letters (tenant_id, queue_id, partition_id, consumer_group, "offset",
                                transaction_id, payload, size_bytes, frame_created_at,
                                retry_count, error)
SELECT %(tenant_id)s, p.queue_id, p.partition_id, %(group)s, %(offset)s, %(transaction_id)s,
       %(payload)s::jsonb, %(size_bytes)s, %(created_at)s, %(retry_count)s, %(error)s
FROM queen.partitions p
WHERE p.partition_id = %(partition_id)s
RETURNING size_bytes

-- name: extend_lease
-- Every partition the lease holds (a pop over several partitions holds them under one lease),
-- as long as it is live; a renewal never shortens it. The earliest expiry is what a client
-- schedules its next renewal by.
-- The lookups by lease id (this, live_leases, lease_exists) read the whole cursors table:
-- lease_id has no index, so the pop that sets it is a HOT update (an index on it cost every
-- pop and ack a walk over one dead index entry per earlier pop while a snapshot was held:
-- schema/015_cursor_updates_hot.sql). One row per (partition, group): the pass is small, and
-- rare (a lease renewal, a transaction's requiredLeases) next to the pops and acks it spares.
WITH renewed AS (
    UPDATE queen.cursors
    SET lease_expires_at = greatest(lease_expires_at,
                                    now() + make_interval(secs => %(seconds)s))
    WHERE lease_id = %(lease_id)s AND tenant_id = %(tenant_id)s AND lease_expires_at > now()
    RETURNING lease_expires_at
)
SELECT count(*)::int AS renewed, min(lease_expires_at) AS expires_at FROM renewed

-- name: live_leases
-- The leases of a transaction's requiredLeases that are still live.
SELECT lease_id FROM queen.cursors
WHERE tenant_id = %(tenant_id)s AND lease_id = ANY(%(lease_ids)s::uuid[])
  AND lease_expires_at > now()

-- name: lease_exists
SELECT 1 FROM queen.cursors WHERE lease_id = %(lease_id)s AND tenant_id = %(tenant_id)s
LIMIT 1

-- name: lock_dead_letter
SELECT d.dead_letter_id, d.consumer_group, d.payload, d.replayed_at, d.replay_transaction_id,
       q.name AS queue, p.name AS partition
FROM queen.dead_letters d
JOIN queen.queues q USING (queue_id)
LEFT JOIN queen.partitions p ON p.partition_id = d.partition_id
WHERE d.dead_letter_id = %(id)s AND d.tenant_id = %(tenant_id)s
FOR UPDATE OF d

-- name: mark_replayed
UPDATE queen.dead_letters
SET replayed_at = now(), replay_transaction_id = %(transaction_id)s
WHERE dead_letter_id = %(id)s

-- name: list_queues
SELECT q.name, q.created_at, q.lease_time_s, q.retry_limit, q.delayed_processing_s,
       q.retention_s, q.dead_letter_queue, q.retain_until_consumed, q.max_size,
       q.retry_delay_ms, q.ttl_s, q.completed_retention_s, q.retention_enabled, q.max_wait_s,
       q.window_buffer_s, q.encryption_enabled,
       count(p.partition_id) AS partitions,
       coalesce(sum(p.next_offset - p.log_start), 0)::bigint AS messages
FROM queen.queues q
LEFT JOIN queen.partitions p USING (queue_id)
WHERE q.tenant_id = %(tenant_id)s
GROUP BY q.queue_id
ORDER BY q.name

-- name: queue_detail
SELECT queue_id, name, created_at, lease_time_s, retry_limit, delayed_processing_s, retention_s,
       dead_letter_queue, retain_until_consumed, max_size, retry_delay_ms, ttl_s,
       completed_retention_s, retention_enabled, max_wait_s, window_buffer_s,
       encryption_enabled
FROM queen.queues
WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: queue_partitions
-- With where each partition's frames are stored. The head starts right after the last
-- segment (or at log_start when there is none): retention only ever drops segments.
SELECT p.partition_id, p.name, p.next_offset, p.log_start, p.created_at,
       p.next_offset - coalesce(s.sealed_to, p.log_start) AS head_frames,
       coalesce(h.bytes, 0)::bigint AS head_bytes,
       coalesce(s.segments, 0) AS segments,
       coalesce(s.frames, 0)::bigint AS segment_frames,
       coalesce(s.raw_bytes, 0)::bigint AS segment_raw_bytes,
       coalesce(s.stored_bytes, 0)::bigint AS segment_stored_bytes
FROM queen.partitions p
LEFT JOIN LATERAL (
    SELECT count(*) AS segments, sum(frame_count) AS frames, sum(raw_bytes) AS raw_bytes,
           sum(stored_bytes) AS stored_bytes, max(last_offset) + 1 AS sealed_to
    FROM queen.segments WHERE partition_id = p.partition_id
) s ON true
LEFT JOIN LATERAL (
    SELECT sum(size_bytes) AS bytes FROM queen.frames WHERE partition_id = p.partition_id
) h ON true
WHERE p.queue_id = %(queue_id)s
ORDER BY p.name

-- name: queue_cursors
SELECT c.partition_id, c.consumer_group, c.committed, c.lease_expires_at > now() AS leased
FROM queen.cursors c
JOIN queen.partitions p USING (partition_id)
WHERE p.queue_id = %(queue_id)s
ORDER BY c.consumer_group, c.partition_id

-- name: queue_dead_letter_count
SELECT count(*) AS n FROM queen.dead_letters WHERE queue_id = %(queue_id)s AND replayed_at IS NULL

-- name: queue_timers
-- The queue's pending timers (claimed ones included: not yet in the log) and the earliest
-- deliverAt among them; the primary key (tenant_id, queue, timer_key) serves it.
SELECT count(*) AS pending, min(deliver_at) AS next_deliver_at
FROM queen.timers WHERE tenant_id = %(tenant_id)s AND queue = %(name)s

-- name: delete_queue
-- Returns the bytes the queue held, which leave the tenant's storage usage with it. The
-- groups' subscription instants and policies go with it: a queue made again under the name is
-- new to them, and a group subscribing with mode "new" starts at its next first pop.
WITH gone AS (
    DELETE FROM queen.queues WHERE tenant_id = %(tenant_id)s AND name = %(name)s
    RETURNING queue_id
), unsubscribed AS (
    DELETE FROM queen.group_subscriptions s
    WHERE s.tenant_id = %(tenant_id)s AND s.queue = %(name)s AND EXISTS (SELECT 1 FROM gone)
), unregistered AS (
    DELETE FROM queen.group_policies g
    WHERE g.tenant_id = %(tenant_id)s AND g.queue = %(name)s AND EXISTS (SELECT 1 FROM gone)
)
SELECT g.queue_id,
       coalesce((SELECT sum(f.size_bytes) FROM queen.frames f
                 JOIN queen.partitions p USING (partition_id)
                 WHERE p.queue_id = g.queue_id), 0)
     + coalesce((SELECT sum(s.stored_bytes) FROM queen.segments s
                 JOIN queen.partitions p USING (partition_id)
                 WHERE p.queue_id = g.queue_id), 0)
     + coalesce((SELECT sum(d.size_bytes) FROM queen.dead_letters d
                 WHERE d.queue_id = g.queue_id), 0) AS bytes
FROM gone g

-- name: add_usage
-- Storage usage changes ride the writing transaction as deltas (queen.usage_deltas in
-- schema/001_baseline.sql).
INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (%(tenant_id)s, %(bytes)s)
