-- Runtime queries of timers (queen_trio/timers/store.py). Every query is tenant-scoped except
-- the sweeper's claim, which serves every tenant.

-- name: lock_timer
-- Never waits on a sweeper: a row locked by a firing transaction is skipped here, and the
-- caller then answers too_late.
SELECT txn, payload_bytes, claim_token IS NOT NULL AND visible_at > now() AS claimed
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s
FOR UPDATE SKIP LOCKED

-- name: timer_exists
SELECT txn FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s

-- name: insert_timer
INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, payload, payload_bytes,
                          deliver_at, visible_at)
VALUES (%(tenant_id)s, %(queue)s, %(key)s, %(partition)s, %(txn)s, %(payload)b,
        %(payload_bytes)s, now() + make_interval(secs => %(delay_ms)s / 1000.0),
        now() + make_interval(secs => %(delay_ms)s / 1000.0))
ON CONFLICT (tenant_id, queue, timer_key) DO NOTHING
RETURNING deliver_at

-- name: reschedule_timer
-- A reschedule is a new timer under an old name: the failure budget starts again.
UPDATE queen.timers
SET partition = %(partition)s, txn = %(txn)s, payload = %(payload)b,
    payload_bytes = %(payload_bytes)s,
    deliver_at = now() + make_interval(secs => %(delay_ms)s / 1000.0),
    visible_at = now() + make_interval(secs => %(delay_ms)s / 1000.0),
    attempts = 0, last_error = NULL, claim_token = NULL, claimed_by = NULL, updated_at = now()
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s
RETURNING deliver_at

-- name: notify_due
-- Tells sweepers (on every broker) about a timer due before their next planned look.
SELECT pg_notify('queen_timers', (extract(epoch FROM %(deliver_at)s::timestamptz) * 1000)::bigint::text)

-- name: delete_timer
DELETE FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s

-- name: peek
SELECT queue, timer_key, partition, txn, deliver_at, attempts, last_error, payload,
       claim_token IS NOT NULL AND visible_at > now() AS claimed
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key = %(key)s

-- name: list
SELECT timer_key, partition, txn, deliver_at, attempts, last_error,
       claim_token IS NOT NULL AND visible_at > now() AS claimed
FROM queen.timers
WHERE tenant_id = %(tenant_id)s AND queue = %(queue)s AND timer_key > %(after)s
ORDER BY timer_key
LIMIT %(limit)s

-- name: claim
-- The whole claim in one round trip:
-- * lock the next due rows no other sweeper holds and stamp them with our claim (the lease is
--   visible_at moved to now() + lease); due_at, their visible_at before the claim, is the order
--   their frames enter the log in;
-- * when to look again: the earliest visible_at among the rows we did not just claim, and the
--   database's clock (epoch seconds) - one row even when nothing was due;
-- * asynchronous commit for this transaction: losing a claim in a crash is harmless (the row is
--   simply claimable again), so it need not wait for the disk.
WITH cfg AS (
    SELECT set_config('synchronous_commit', 'off', true)
), due AS (
    SELECT tenant_id, queue, timer_key, visible_at AS due_at
    FROM queen.timers
    WHERE visible_at <= now()
    ORDER BY visible_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE queen.timers t
    SET visible_at = now() + make_interval(secs => %(lease_ms)s / 1000.0),
        claim_token = %(token)s, claimed_by = %(broker)s
    FROM due
    WHERE t.tenant_id = due.tenant_id AND t.queue = due.queue AND t.timer_key = due.timer_key
    RETURNING t.tenant_id, t.queue, t.timer_key AS key, t.partition, t.txn, t.payload,
              t.payload_bytes, t.deliver_at, t.attempts, due.due_at
), clock AS (
    SELECT (SELECT extract(epoch FROM min(t.visible_at))::float8
            FROM queen.timers t
            WHERE NOT EXISTS (SELECT 1 FROM due d WHERE d.tenant_id = t.tenant_id
                              AND d.queue = t.queue AND d.timer_key = t.timer_key)) AS next_due,
           extract(epoch FROM clock_timestamp())::float8 AS db_now
    FROM cfg
)
SELECT claimed.*, clock.next_due, clock.db_now
FROM clock
LEFT JOIN claimed ON true

-- name: release_claim
-- Transient trouble during a fire: hand the rows back at once instead of at lease expiry.
UPDATE queen.timers SET visible_at = now(), claim_token = NULL, claimed_by = NULL
WHERE claim_token = %(token)s

-- name: delete_fired
-- Only rows whose claim is still ours: a sweeper that lost its claim appends nothing.
DELETE FROM queen.timers t
USING unnest(%(tenant_ids)b::integer[], %(queues)b::text[], %(keys)b::text[])
      AS k(tenant_id, queue, timer_key)
WHERE t.tenant_id = k.tenant_id AND t.queue = k.queue AND t.timer_key = k.timer_key
  AND t.claim_token = %(token)s
RETURNING t.tenant_id, t.queue, t.timer_key

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
SELECT count(*) AS n FROM queen.timers
