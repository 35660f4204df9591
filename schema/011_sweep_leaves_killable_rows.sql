-- 011 a fired timer's row leaves an index entry the next scan can skip for good.
--
-- Under a steady flow (1,000 timers/s) each sweep took longer than the one before: 1 ms with
-- an empty history, 9 ms once 27,000 fired timers had been deleted since the last vacuum. Every
-- scan of timers_visible (the due rows, the next due time) stepped through the index entries of
-- all the rows fired since then and visited their heap tuples, every time.
--
-- An index scan marks the entry of a tuple it finds dead to everyone, and later scans skip such
-- entries without visiting the heap (and inserts reclaim them). It cannot do so when the
-- deleting transaction is recorded as a MultiXact, and that is what 008's sweep left: the due
-- rows were locked (FOR UPDATE) by the transaction and deleted inside the EXCEPTION block, a
-- subtransaction, so each deleted row carried both the lock and the delete. Now the lock, the
-- fire and the claims are all made inside that block, by one (sub)transaction; if a payload
-- cannot become a frame, the block is rolled back whole and the due rows are locked again and
-- all claimed for the broker, as before.

-- One sweep's work at the instant p_now, as 008's queen.sweep_timers did it after its wait:
-- lock up to p_batch due rows, fire the leading run PostgreSQL can fire itself (when p_fire),
-- claim the rest. Raises data_exception if a payload taken for a direct fire is not JSON text;
-- the caller runs it inside an EXCEPTION block.
CREATE FUNCTION queen.sweep_due(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_now timestamptz)
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
BEGIN
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
            WHERE due.visible_at <= p_now
            ORDER BY due.visible_at
            LIMIT p_batch
            FOR UPDATE SKIP LOCKED
        ) t
        JOIN queen.tenants tn ON tn.tenant_id = t.tenant_id
    ) d;

    IF v_direct > 0 THEN
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
            SET visible_at = p_now + make_interval(secs => p_lease_ms / 1000.0),
                claim_token = p_token, claimed_by = p_broker
            FROM unnest(v_ctids[v_direct + 1:], v_due[v_direct + 1:]) AS k(row_id, due_at)
            WHERE t.ctid = k.row_id
            RETURNING false, t.tenant_id, t.queue, t.timer_key, t.partition, t.txn, t.payload,
                      t.payload_zstd, t.payload_bytes, t.deliver_at, t.attempts, k.due_at,
                      NULL::float8, NULL::float8
        )
        SELECT * FROM claimed;
    END IF;
END
$fn$;

-- 008's signature and answer, its work now in queen.sweep_due.
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
    v_now := queen.wait_until(p_not_before);
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

    RETURN QUERY
    SELECT NULL::boolean, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::bytea, NULL::boolean, NULL::integer, NULL::timestamptz, NULL::integer,
           NULL::timestamptz,
           (SELECT extract(epoch FROM min(t.visible_at))::float8 FROM queen.timers t),
           extract(epoch FROM clock_timestamp())::float8;
END
$fn$;
