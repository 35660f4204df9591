-- 008 the sweep waits for its instant inside PostgreSQL.
--
-- On this kind of machine a process that has been idle for a few milliseconds runs its next
-- piece of work about twice as slowly (cold caches, a halted virtual CPU to wake), and a sweep
-- at a timer's due instant always follows an idle spell. So the sweeper now sends its
-- statement a little before the instant, and queen.sweep_timers waits for it in the backend:
-- it sleeps until about a millisecond before (pg_sleep rounds up to whole milliseconds) and
-- spins the rest on clock_timestamp(). The backend is running when the instant comes instead of
-- being woken by a packet, and what is due is decided by the clock read after the wait, not by
-- the statement's start time (now()).

-- The instant a sweep was asked to wait for, as a timestamp; NULL or past: at once. Waits at
-- most 100 ms: a sweeper never plans further ahead than a few milliseconds, and a bad clock
-- estimate must not hold a connection.
CREATE FUNCTION queen.wait_until(p_epoch float8) RETURNS timestamptz
LANGUAGE plpgsql AS $fn$
DECLARE
    v_left float8;
BEGIN
    IF p_epoch IS NOT NULL THEN
        v_left := least(p_epoch - extract(epoch FROM clock_timestamp()), 0.1);
        IF v_left > 0.0015 THEN
            PERFORM pg_sleep(v_left - 0.0015);
        END IF;
        p_epoch := least(p_epoch, extract(epoch FROM clock_timestamp()) + 0.002);
        WHILE extract(epoch FROM clock_timestamp()) < p_epoch LOOP
        END LOOP;
    END IF;
    RETURN clock_timestamp();
END
$fn$;

DROP FUNCTION queen.sweep_timers(uuid, text, integer, integer, integer, boolean);

-- As in 005, plus p_not_before (epoch seconds, the database's clock): start no earlier. Due rows
-- are those due at the clock read after the wait; claims are leased from then.
CREATE FUNCTION queen.sweep_timers(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_due timestamptz[];
    v_ctids tid[];
    v_direct integer;
    v_fired timestamptz[] := '{}';
    v_appended integer;
    v_now timestamptz;
BEGIN
    v_now := queen.wait_until(p_not_before);
    SELECT coalesce(array_agg(d.visible_at ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.ctid ORDER BY d.ord), '{}'),
           coalesce(min(d.ord) FILTER (WHERE NOT d.direct) - 1, count(*))
    INTO v_due, v_ctids, v_direct
    FROM (
        SELECT t.tenant_id, t.queue, t.timer_key, t.visible_at, t.ctid,
               row_number() OVER (ORDER BY t.visible_at, t.tenant_id, t.queue, t.timer_key)
                   AS ord,
               p_fire AND NOT t.payload_zstd
                   AND t.payload_bytes <= least(p_max_payload, tn.max_message_bytes) AS direct
        FROM (
            -- (ctid: the locked rows are then deleted or claimed by a TID scan, which no
            -- planner estimate can turn into a scan of the whole table.)
            SELECT due.ctid, due.tenant_id, due.queue, due.timer_key, due.visible_at,
                   due.payload_zstd, due.payload_bytes
            FROM queen.timers due
            WHERE due.visible_at <= v_now
            ORDER BY due.visible_at
            LIMIT p_batch
            FOR UPDATE SKIP LOCKED
        ) t
        JOIN queen.tenants tn ON tn.tenant_id = t.tenant_id
    ) d;

    IF v_direct > 0 THEN
        BEGIN
            WITH gone AS (
                DELETE FROM queen.timers t
                USING unnest(v_ctids[1:v_direct]) WITH ORDINALITY AS k(row_id, ord)
                WHERE t.ctid = k.row_id
                RETURNING k.ord, t.tenant_id, t.queue, t.timer_key, t.partition, t.txn,
                          convert_from(t.payload, 'UTF8') AS text, t.payload_bytes,
                          t.deliver_at
            )
            SELECT array_agg(g.deliver_at ORDER BY g.ord),
                   queen.append_timer_frames(
                       array_agg(g.tenant_id ORDER BY g.ord), array_agg(g.queue ORDER BY g.ord),
                       array_agg(g.timer_key ORDER BY g.ord),
                       array_agg(g.partition ORDER BY g.ord), array_agg(g.txn ORDER BY g.ord),
                       array_agg(g.text ORDER BY g.ord),
                       array_agg(g.payload_bytes ORDER BY g.ord),
                       array_agg(g.deliver_at ORDER BY g.ord))
            INTO v_fired, v_appended
            FROM gone g;
        EXCEPTION WHEN data_exception THEN
            v_direct := 0;
            v_fired := '{}';
        END;
    ELSE
        -- Only claims (or nothing): losing them in a crash is harmless, so don't wait for
        -- the disk. A fire keeps the synchronous commit.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    RETURN QUERY
    SELECT true, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea,
           NULL::boolean, NULL::integer, f.at, NULL::integer, NULL::timestamptz,
           NULL::float8, NULL::float8
    FROM unnest(v_fired) AS f(at);

    IF v_direct < cardinality(v_ctids) THEN
        RETURN QUERY
        WITH claimed AS (
            UPDATE queen.timers t
            SET visible_at = v_now + make_interval(secs => p_lease_ms / 1000.0),
                claim_token = p_token, claimed_by = p_broker
            FROM unnest(v_ctids[v_direct + 1:], v_due[v_direct + 1:]) AS k(row_id, due_at)
            WHERE t.ctid = k.row_id
            RETURNING false, t.tenant_id, t.queue, t.timer_key, t.partition, t.txn, t.payload,
                      t.payload_zstd, t.payload_bytes, t.deliver_at, t.attempts, k.due_at,
                      NULL::float8, NULL::float8
        )
        SELECT * FROM claimed;
    END IF;

    RETURN QUERY
    SELECT NULL::boolean, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::bytea, NULL::boolean, NULL::integer, NULL::timestamptz, NULL::integer,
           NULL::timestamptz,
           (SELECT extract(epoch FROM min(t.visible_at))::float8 FROM queen.timers t),
           extract(epoch FROM clock_timestamp())::float8;
END
$fn$;
