-- Runtime queries of the timer store (queen_trio/timers/store.py); the functions they call are
-- in schema/functions/timers.sql. Every query is tenant-scoped except the sweeper's claim,
-- which serves every tenant.

-- name: lock_timer_names
-- Waits for any other schedule or cancel of these timers to commit (queen.lock_timer_names in
-- schema/functions/timers.sql): taken for a whole call first when it both schedules and cancels,
-- so that its two statements take the names in one order.
SELECT queen.lock_timer_names(%(tenant_id)s, %(queues)b::text[], %(keys)b::text[])

-- name: schedule
-- Upserts a list of timers in one statement (schema/functions/timers.sql): decided under the
-- rows' locks, answering one row per input by position; queues, usage and the sweepers' NOTIFY
-- included. The timers travel as parallel arrays, each one text (timers/store.py:
-- timer_arrays). The message id comes as its text (what the answer writes): a uuid.UUID per
-- timer cost the broker its construction and kept every answer's objects tracked by the
-- garbage collector. Attempt 0: a bundle of new names is answered by one row (ord 0) that
-- store.schedule_many expands.
SELECT ord, status, txn, message_id::text AS message_id, deliver_at
FROM queen.schedule_timer_list(%(tenant_id)s, %(queues)s::text[], %(keys)s::text[],
                               %(partitions)s::text[], %(txns)s::text[], %(delays)s::bigint[],
                               %(sizes)s::integer[], %(payloads)s::text[], %(zstd)s::boolean[],
                               %(notify_within_ms)s::bigint, 0)
ORDER BY ord

-- name: schedule_one
-- One timer (queen.schedule_timer): the same decision in a few key probes, with scalar
-- parameters; the payload as stored (zstd says how). The message id as text, as above.
SELECT ord, status, txn, message_id::text AS message_id, deliver_at
FROM queen.schedule_timer(%(tenant_id)s, %(queue)s, %(key)s, %(partition)s, %(txn)s,
                          %(delay_ms)s::bigint, %(bytes)s::integer, %(payload)s::bytea,
                          %(zstd)s, %(notify_within_ms)s::bigint)

-- name: cancel
-- Cancels a list of distinct timers in one statement (queen.cancel_timers): decided under the
-- names' and the rows' locks, never waiting on a sweeper, one row per input by position.
SELECT ord, status, txn
FROM queen.cancel_timers(%(tenant_id)s, %(queues)b::text[], %(keys)b::text[], %(txns)b::text[])
ORDER BY ord

-- name: cancel_one
-- The same for a single timer (DELETE, or a list of one), with scalar parameters
-- (queen.cancel_timer: a few key probes).
SELECT ord, status, txn
FROM queen.cancel_timer(%(tenant_id)s, %(queue)s, %(key)s, %(txn)s)

-- name: peek
SELECT queue, timer_key, partition, txn, message_id, deliver_at, attempts, last_error, payload,
       payload_zstd, claim_token IS NOT NULL AND visible_at > now() AS claimed, created_at,
       updated_at
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s

-- name: list
-- One row more than the page: it says whether the page is truncated.
SELECT timer_key, partition, txn, message_id, deliver_at, attempts, last_error, payload_zstd,
       claim_token IS NOT NULL AND visible_at > now() AS claimed, created_at, updated_at
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key > %(after)s
ORDER BY timer_key
LIMIT %(limit)s + 1

-- name: count
-- The pending timers of one queue whose key starts with a prefix (a walk of the queue's part of
-- the primary key).
SELECT count(*) AS n
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND starts_with(timer_key, %(prefix)s)

-- name: sweep
-- A whole sweeper cycle in one statement (queen.sweep_timers in schema/functions/timers.sql):
-- fires what PostgreSQL can fire itself, claims the rest under a lease, and reports when to
-- look again and the database's clock. It commits at not_before (epoch seconds, database
-- clock), its work staged just ahead. Given a queue (lock_tenant, lock_queue), it holds that
-- queue's fire lock until it commits, for the pops waiting on it (queen.pop_head_after in
-- schema/functions/log.sql).
SELECT * FROM queen.sweep_timers_for(%(lock_tenant)s, %(lock_queue)s, %(token)s, %(broker)s,
                                     %(batch)s, %(lease_ms)s, %(max_payload)s, %(fire)s,
                                     %(not_before)s::float8)

-- name: sweep_and_pop
-- The sweep above, holding the announced queue's fire lock, then a pop for the pop parked in
-- this broker that the sweeper reserved, in the same transaction (queen.sweep_timers_and_pop),
-- committed as pops are when it leases (pop_commit: 'off', or NULL for the server's level).
SELECT * FROM queen.sweep_timers_and_pop(%(lock_tenant)s, %(lock_queue)s, %(token)s,
                                         %(broker)s, %(batch)s, %(lease_ms)s, %(max_payload)s,
                                         %(fire)s, %(not_before)s::float8, %(pop_group)s,
                                         %(pop_partition)s, %(pop_batch)s, %(pop_auto_ack)s,
                                         %(pop_commit)s)

-- name: sweep_settle_and_pop
-- sweep_and_pop, the reserved pop carrying the settlement of the batch its stream was handed
-- last: applied in the same transaction before the pop (queen.sweep_settle_and_pop).
SELECT * FROM queen.sweep_settle_and_pop(%(lock_tenant)s, %(lock_queue)s, %(token)s,
                                         %(broker)s, %(batch)s, %(lease_ms)s, %(max_payload)s,
                                         %(fire)s, %(not_before)s::float8, %(pop_group)s,
                                         %(pop_partition)s, %(pop_batch)s,
                                         %(settle_partition)s::uuid, %(settle_lease)s::uuid,
                                         %(settle_from)s::bigint, %(settle_through)s::bigint,
                                         %(after)s, %(ack_commit)s)

-- name: release_claim
-- Transient trouble during a fire: hand the rows back at once instead of at lease expiry.
UPDATE queen.timers SET visible_at = now(), claim_token = NULL, claimed_by = NULL
WHERE claim_token = %(token)s

-- name: fire_claimed
-- Only rows whose claim is still ours: a sweeper that lost its claim appends nothing.
SELECT * FROM queen.fire_claimed_timers(%(token)s, %(tenant_ids)b::integer[], %(queues)b::text[],
                                        %(keys)b::text[], %(texts)b::text[])

-- name: fail_timer
UPDATE queen.timers
SET attempts = attempts + 1, last_error = %(error)s, claim_token = NULL, claimed_by = NULL,
    visible_at = now() + make_interval(secs => %(backoff_ms)s / 1000.0), updated_at = now()
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s
  AND claim_token = %(token)s

-- name: delete_claimed
DELETE FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s
  AND claim_token = %(token)s
RETURNING payload_bytes

-- name: dead_letter_timer
-- A timer past its failure budget: its frame never had a consumer group nor an offset.
INSERT INTO queen.dead_letters (tenant_id, queue_id, partition_id, consumer_group, "offset",
                                transaction_id, payload, size_bytes, retry_count, error)
SELECT q.tenant_id, q.queue_id, p.partition_id, '__timer__', NULL, %(txn)s, %(payload)s::jsonb,
       octet_length(%(payload)s::text), %(attempts)s, %(error)s
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = %(partition)s
WHERE q.tenant_id = %(tenant_id)s AND q.name = %(queue)s

-- name: pending_count
-- Counted while the table is small; past 100,000 rows, the statistics' live-row count (a count
-- of ten million rows reads gigabytes every few seconds).
SELECT CASE WHEN s.n_live_tup > 100000 THEN s.n_live_tup
            ELSE (SELECT count(*) FROM queen.timers) END AS n
FROM pg_stat_user_tables s
WHERE s.relid = 'queen.timers'::regclass

-- name: next_due
-- The timer that comes due first, and where it will land (the sweeper tells that queue's parked
-- pops before it fires: queen.pop_head_after in schema/functions/log.sql).
SELECT tenant_id, queue, partition, extract(epoch FROM visible_at)::float8 AS due
FROM queen.timers
WHERE visible_at >= (SELECT queen.sweep_floor())  -- (nothing below it: queen.advance_sweep_floor)
ORDER BY visible_at
LIMIT 1

-- name: encrypted_queues
-- Which of these queues seal their payloads (encryptionEnabled): their timers are stored sealed.
SELECT name FROM queen.queues
WHERE tenant_id = %(tenant_id)s AND name = ANY(%(names)s::text[]) AND encryption_enabled
