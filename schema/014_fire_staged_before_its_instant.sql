-- 014 a timer's fire is staged just ahead of its instant and committed at it.
--
-- An idle sweep is sent ahead of its timer's instant and the backend waits for it (008). Then,
-- at the instant, it still had the whole fire to do: lock the due rows, delete them, append the
-- frames, then the commit. That took 0.5-0.9 ms on this kind of machine, and every consumer
-- waited for it. Now the backend does that work a millisecond before the instant, waits for the
-- instant with the rows locked, and returns, so the commit follows the instant by microseconds.
-- Nothing becomes visible before the instant: the frames and the deletions are one transaction,
-- committed after it. A cancel or reschedule of one of these rows in that last millisecond
-- finds it locked and answers too_late, as it does for any timer a broker is firing.
--
-- What is due is now decided by the instant the sweep was planned for (the rows due by then),
-- not by the clock read after the wait.

-- As in 005, but a timer's frame is never stamped before its deliverAt: the frame is written
-- just before the instant and becomes visible after it.
CREATE OR REPLACE FUNCTION queen.append_timer_frames(
    p_tenants integer[], p_queues text[], p_keys text[], p_partitions text[], p_txns text[],
    p_texts text[], p_payload_bytes integer[], p_deliver_at timestamptz[])
RETURNS integer  -- frames appended
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_appended integer;
    v_queues_woken integer;
    v_wanted integer;
    v_locked integer;
BEGIN
    SELECT count(*) INTO v_wanted
    FROM (SELECT DISTINCT * FROM unnest(p_tenants, p_queues, p_partitions)) AS w;
    FOR attempt IN 1..2 LOOP
        WITH locked AS (
            SELECT 1
            FROM queen.partitions p
            JOIN queen.queues q USING (queue_id)
            WHERE (q.tenant_id, q.name, p.name) IN (
                SELECT * FROM unnest(p_tenants, p_queues, p_partitions))
            ORDER BY p.partition_id
            FOR UPDATE OF p
        )
        SELECT count(*) INTO v_locked FROM locked;
        EXIT WHEN v_locked = v_wanted OR attempt = 2;
        -- First frames of a queue or a partition (usually they exist): create what is
        -- missing, then lock again.
        INSERT INTO queen.queues (tenant_id, name)
        SELECT DISTINCT n.tenant_id, n.queue
        FROM unnest(p_tenants, p_queues) AS n(tenant_id, queue)
        WHERE NOT EXISTS (SELECT 1 FROM queen.queues q
                          WHERE q.tenant_id = n.tenant_id AND q.name = n.queue)
        ON CONFLICT (tenant_id, name) DO NOTHING;
        INSERT INTO queen.partitions (tenant_id, queue_id, name)
        SELECT DISTINCT n.tenant_id, q.queue_id, n.partition
        FROM unnest(p_tenants, p_queues, p_partitions) AS n(tenant_id, queue, partition)
        JOIN queen.queues q ON q.tenant_id = n.tenant_id AND q.name = n.queue
        WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p
                          WHERE p.queue_id = q.queue_id AND p.name = n.partition)
        ON CONFLICT (queue_id, name) DO NOTHING;
    END LOOP;
    IF v_locked <> v_wanted THEN
        -- A queue deleted while we created its partition: try the whole fire again later
        -- rather than append fewer frames than the rows it deletes.
        RAISE EXCEPTION 'a destination partition vanished during the fire'
            USING ERRCODE = 'serialization_failure';
    END IF;

    WITH fired AS (
        SELECT f.*, p.partition_id,
               p.next_offset - 1 + row_number() OVER (PARTITION BY p.partition_id ORDER BY f.ord)
                   AS "offset"
        FROM unnest(p_tenants, p_queues, p_keys, p_partitions, p_txns, p_texts,
                    p_payload_bytes, p_deliver_at) WITH ORDINALITY
             AS f(tenant_id, queue, timer_key, partition, txn, payload, payload_bytes,
                  deliver_at, ord)
        JOIN queen.queues q ON q.tenant_id = f.tenant_id AND q.name = f.queue
        JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = f.partition
    ), appended AS (
        INSERT INTO queen.frames (partition_id, "offset", tenant_id, transaction_id, payload,
                                  size_bytes, created_at, meta)
        SELECT partition_id, "offset", tenant_id, txn, payload::jsonb, octet_length(payload),
               greatest(clock_timestamp(), deliver_at),
               jsonb_build_object('timer', jsonb_build_object(
                   'key', timer_key,
                   'deliverAt', to_char(deliver_at AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
        FROM fired
        RETURNING 1
    ), bumped AS (
        UPDATE queen.partitions p SET next_offset = p.next_offset + n.frames
        FROM (SELECT partition_id, count(*) AS frames FROM fired GROUP BY partition_id) n
        WHERE p.partition_id = n.partition_id
        RETURNING 1
    ), usage AS (
        -- The bytes move from the timer row to the log: usually a change of zero.
        INSERT INTO queen.usage_deltas (tenant_id, bytes)
        SELECT tenant_id, sum(octet_length(payload) - payload_bytes)
        FROM fired
        GROUP BY tenant_id
        HAVING sum(octet_length(payload) - payload_bytes) <> 0
        RETURNING 1
    ), woken AS (
        -- Long-polling pops of these queues, on every broker; delivered only on commit.
        SELECT pg_notify('queen_log', tenant_id || ':' || queue)
        FROM (SELECT DISTINCT tenant_id, queue FROM fired) d
    )
    SELECT (SELECT count(*) FROM appended), (SELECT count(*) FROM woken)
    INTO v_appended, v_queues_woken;
    RETURN v_appended;
END
$fn$;

-- How long before its instant a planned sweep does its work: about what the work takes on an
-- idle machine, so that the commit lands at the instant rather than after it.
CREATE FUNCTION queen.sweep_lead_s() RETURNS float8
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 0.001::float8 $fn$;

-- 011's, with the work done ahead of p_not_before and the return (then the commit) kept until it.
CREATE OR REPLACE FUNCTION queen.sweep_timers(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    v_now := queen.wait_until(p_not_before - queen.sweep_lead_s());
    IF p_not_before IS NOT NULL THEN
        -- The instant itself, unless it is past (then now) or the wait was cut short (a far
        -- not_before: then only a lead's worth ahead of the clock).
        v_now := greatest(v_now, least(to_timestamp(p_not_before),
                                       v_now + make_interval(secs => queen.sweep_lead_s())));
    END IF;
    BEGIN
        -- (A set-returning plpgsql function hands back its rows only once it has finished:
        -- if it raises, nothing of it has been returned.)
        RETURN QUERY SELECT * FROM queen.sweep_due(p_token, p_broker, p_batch, p_lease_ms,
                                                   p_max_payload, p_fire, v_now);
    EXCEPTION WHEN data_exception THEN
        -- A payload PostgreSQL could not turn into a frame: the block's locks, deletes and
        -- frames are gone; claim every due row for the broker, which fires or fails each.
        RETURN QUERY SELECT * FROM queen.sweep_due(p_token, p_broker, p_batch, p_lease_ms,
                                                   p_max_payload, false, v_now);
    END;
    -- Nothing it took was due later than v_now: return (then commit) no earlier than that.
    PERFORM queen.wait_until(extract(epoch FROM v_now)::float8);

    RETURN QUERY
    SELECT NULL::boolean, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::bytea, NULL::boolean, NULL::integer, NULL::timestamptz, NULL::integer,
           NULL::timestamptz,
           (SELECT extract(epoch FROM min(t.visible_at))::float8 FROM queen.timers t),
           extract(epoch FROM clock_timestamp())::float8;
END
$fn$;
