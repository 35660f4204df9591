-- 009 schedules and cancels of one timer wait for each other; only a fire answers too_late.
--
-- A schedule or cancel skips a timer row that is locked (FOR UPDATE SKIP LOCKED) and answers
-- too_late, because a sweeper firing the timer holds that lock and must never be waited for.
-- But another schedule or cancel of the same timer, still uncommitted, holds the same row lock,
-- and two clients rescheduling one name at the same moment got too_late although nothing was
-- being fired. Now every schedule and cancel first takes a transaction-level advisory lock on
-- the timer's name (in one order, so concurrent bundles cannot deadlock on them): they queue
-- behind each other there, and a row lock still in the way can only be a sweeper's.

-- Advisory locks of the form (class, hash): this class is timer names. A hash collision only
-- makes two unrelated schedules wait for each other.
CREATE FUNCTION queen.lock_timer_names(p_tenant integer, p_queues text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_name integer;
BEGIN
    FOR v_name IN
        SELECT DISTINCT hashtext(p_tenant::text || '/' || length(u.q)::text || '/' || u.q
                                 || '/' || u.k)
        FROM unnest(p_queues, p_keys) AS u(q, k)
        ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(1363170305, v_name);
    END LOOP;
END
$fn$;

-- As in 005, with the name locks taken first.
CREATE OR REPLACE FUNCTION queen.schedule_timers(
    p_tenant integer, p_queues text[], p_keys text[], p_partitions text[], p_txns text[],
    p_payloads bytea[], p_zstd boolean[], p_bytes integer[], p_delays_ms bigint[],
    p_notify_within_ms bigint, p_attempt integer DEFAULT 1)
RETURNS TABLE (ord integer, status text, txn text, deliver_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_keys);
    v_ords integer[];
    v_status text[];
    v_txns text[];
    v_at timestamptz[];
    v_delta bigint;
    v_soonest timestamptz;
    i integer;
BEGIN
    IF p_attempt > 2 THEN
        -- Created and gone again under us twice in a row: a fire is racing us.
        RETURN QUERY SELECT g, 'too_late', NULL::text, NULL::timestamptz
                     FROM generate_series(1, n) AS g;
        RETURN;
    END IF;
    PERFORM queen.lock_timer_names(p_tenant, p_queues, p_keys);
    IF (SELECT count(DISTINCT (u.q, u.k)) FROM unnest(p_queues, p_keys) AS u(q, k)) < n THEN
        -- The same timer more than once: one at a time, in order, as separate calls would.
        FOR i IN 1..n LOOP
            RETURN QUERY
            SELECT i, s.status, s.txn, s.deliver_at
            FROM queen.schedule_timers(p_tenant, p_queues[i:i], p_keys[i:i], p_partitions[i:i],
                                       p_txns[i:i], p_payloads[i:i], p_zstd[i:i], p_bytes[i:i],
                                       p_delays_ms[i:i], p_notify_within_ms) s;
        END LOOP;
        RETURN;
    END IF;

    -- Every lookup of an existing timer is a LATERAL probe of the primary key (or a TID
    -- scan) that the planner cannot flatten: with the table's statistics stale (it grew since the last ANALYZE), a join
    -- would be planned as a scan of all the tenant's timers, for every bundle.
    WITH input AS (
        SELECT u.queue, u.timer_key, u.partition, u.txn, u.payload, u.zstd, u.bytes,
               u.ord::integer AS ord, now() + make_interval(secs => u.delay_ms / 1000.0) AS due
        FROM unnest(p_queues, p_keys, p_partitions, p_txns, p_payloads, p_zstd, p_bytes,
                    p_delays_ms) WITH ORDINALITY
             AS u(queue, timer_key, partition, txn, payload, zstd, bytes, delay_ms, ord)
    ), existing AS (
        SELECT i.ord, t.row_id, t.txn
        FROM input i
        CROSS JOIN LATERAL (
            SELECT x.ctid AS row_id, x.txn FROM queen.timers x
            WHERE x.tenant_id = p_tenant AND x.queue = i.queue AND x.timer_key = i.timer_key
            LIMIT 1  -- (keeps the planner from flattening the probe into a join)
        ) t
    ), locked AS (
        -- SKIP LOCKED: a row locked by a firing sweeper is left alone (too_late below).
        SELECT i.ord, t.row_id, t.txn, t.payload_bytes, t.claimed
        FROM input i
        CROSS JOIN LATERAL (
            SELECT x.ctid AS row_id, x.txn, x.payload_bytes,
                   x.claim_token IS NOT NULL AND x.visible_at > now() AS claimed
            FROM queen.timers x
            WHERE x.tenant_id = p_tenant AND x.queue = i.queue AND x.timer_key = i.timer_key
            FOR UPDATE SKIP LOCKED
        ) t
    ), busy AS (
        SELECT e.ord, e.txn
        FROM existing e
        WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.ord = e.ord)
    ), rescheduled AS (
        -- A reschedule is a new timer under an old name: the failure budget starts again.
        UPDATE queen.timers t
        SET partition = i.partition, txn = i.txn, payload = i.payload, payload_zstd = i.zstd,
            payload_bytes = i.bytes, deliver_at = i.due, visible_at = i.due, attempts = 0,
            last_error = NULL, claim_token = NULL, claimed_by = NULL, updated_at = now()
        FROM locked l
        JOIN input i ON i.ord = l.ord
        WHERE t.ctid = l.row_id AND NOT l.claimed
        RETURNING i.ord, t.deliver_at, i.bytes - l.payload_bytes AS delta
    ), inserted AS (
        INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, payload,
                                  payload_zstd, payload_bytes, deliver_at, visible_at)
        SELECT p_tenant, i.queue, i.timer_key, i.partition, i.txn, i.payload, i.zstd, i.bytes,
               i.due, i.due
        FROM input i
        WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.ord = i.ord)
        ORDER BY i.queue, i.timer_key  -- one lock order for concurrent bundles
        ON CONFLICT (tenant_id, queue, timer_key) DO NOTHING
        RETURNING queue, timer_key, deliver_at
    ), answers AS (
        SELECT r.ord, 'rescheduled' AS status, i.txn, r.deliver_at, r.delta
        FROM rescheduled r JOIN input i ON i.ord = r.ord
        UNION ALL
        SELECT i.ord, 'scheduled', i.txn, x.deliver_at, i.bytes
        FROM inserted x JOIN input i ON i.queue = x.queue AND i.timer_key = x.timer_key
        UNION ALL
        SELECT l.ord, 'too_late', l.txn, NULL, 0 FROM locked l WHERE l.claimed
        UNION ALL
        SELECT b.ord, 'too_late', b.txn, NULL, 0 FROM busy b
    )
    SELECT coalesce(array_agg(a.ord ORDER BY a.ord), '{}'), array_agg(a.status ORDER BY a.ord),
           array_agg(a.txn ORDER BY a.ord), array_agg(a.deliver_at ORDER BY a.ord),
           coalesce(sum(a.delta), 0),
           min(a.deliver_at) FILTER (WHERE a.status <> 'too_late'
                                     AND p_delays_ms[a.ord] < p_notify_within_ms)
    INTO v_ords, v_status, v_txns, v_at, v_delta, v_soonest
    FROM answers a;

    INSERT INTO queen.queues (tenant_id, name)
    SELECT DISTINCT p_tenant, p_queues[a.o]
    FROM unnest(v_ords, v_status) AS a(o, s)
    WHERE a.s = 'scheduled'
      AND NOT EXISTS (SELECT 1 FROM queen.queues q
                      WHERE q.tenant_id = p_tenant AND q.name = p_queues[a.o])
    ON CONFLICT (tenant_id, name) DO NOTHING;
    IF v_delta <> 0 THEN
        INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (p_tenant, v_delta);
    END IF;
    IF v_soonest IS NOT NULL THEN
        -- Sweepers look again within MAX_SLEEP anyway; only sooner timers need a wake-up.
        -- The due instant in epoch microseconds: a sweeper woken even a fraction of a
        -- millisecond early finds nothing due and then owes a whole MIN_SLEEP.
        PERFORM pg_notify('queen_timers',
                          ceil(extract(epoch FROM v_soonest) * 1000000)::bigint::text);
    END IF;

    RETURN QUERY
    SELECT a.o, a.s, a.t, a.at FROM unnest(v_ords, v_status, v_txns, v_at) AS a(o, s, t, at);

    -- A timer created by a concurrent transaction after this statement's snapshot was neither
    -- updated nor inserted here: decide it again with a fresh look.
    FOR i IN SELECT g FROM generate_series(1, n) AS g WHERE g <> ALL (v_ords) LOOP
        RETURN QUERY
        SELECT i, s.status, s.txn, s.deliver_at
        FROM queen.schedule_timers(p_tenant, p_queues[i:i], p_keys[i:i], p_partitions[i:i],
                                   p_txns[i:i], p_payloads[i:i], p_zstd[i:i], p_bytes[i:i],
                                   p_delays_ms[i:i], p_notify_within_ms, p_attempt + 1) s;
    END LOOP;
END
$fn$;
