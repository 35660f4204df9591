-- The live schema queen as a freshly migrated database has it (PostgreSQL 18): the
-- normalised pg_dump --schema-only of tests/schema_snapshot.py. Do not edit; regenerate
-- with `python -m tests.schema_snapshot` and review the diff.

CREATE SCHEMA queen;

CREATE FUNCTION queen.ack_head(p_tenant integer, p_partition uuid, p_group text, p_lease uuid, p_txns text[]) RETURNS TABLE(outcome text, queue text, partition text, committed_before bigint, acked_ahead_before bigint[], leased_to bigint, transaction_id text, "offset" bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    cur record;
    v_txns text[];
    v_offsets bigint[];
    v_ahead bigint[];
    v_committed bigint;
    v_o bigint;
    v_queue text;
    v_pname text;
BEGIN
    -- The cursor, newest version first, locked (queen.cursor_for_update).
    cur := queen.cursor_for_update(p_tenant, p_partition, p_group);
    -- An ack under a lease that is not live (expired, released, another's) gets its verdict
    -- from the general ack.
    IF cur.tid IS NULL OR cur.leased_to IS NULL
       OR (p_lease IS NOT NULL
           AND (cur.lease_id IS DISTINCT FROM p_lease OR cur.lease_live IS NOT TRUE)) THEN
        RETURN QUERY SELECT 'fallback', NULL::text, NULL::text, NULL::bigint, NULL::bigint[],
                            NULL::bigint, NULL::text, NULL::bigint;
        RETURN;
    END IF;

    SELECT array_agg(f.transaction_id), array_agg(f."offset") INTO v_txns, v_offsets
    FROM queen.frames f
    WHERE f.partition_id = p_partition AND f.transaction_id = ANY(p_txns)
      AND f."offset" > cur.committed AND f."offset" <= cur.leased_to
      AND f."offset" <> ALL(cur.acked_ahead);
    -- Every transactionId exactly once: a missing one may be sealed, acked already or
    -- unknown; a doubled one needs the general ack's choice of offset.
    IF coalesce(cardinality(v_offsets), 0) <> cardinality(p_txns)
       OR (SELECT count(DISTINCT t) FROM unnest(v_txns) AS t) <> cardinality(p_txns) THEN
        RETURN QUERY SELECT 'fallback', NULL::text, NULL::text, NULL::bigint, NULL::bigint[],
                            NULL::bigint, NULL::text, NULL::bigint;
        RETURN;
    END IF;

    -- An offset commit (Queen's ack): the cursor moves to the highest acked offset, which
    -- completes everything handed out before it, then over the offsets done out of order
    -- that now touch it.
    v_committed := (SELECT max(o) FROM unnest(v_offsets) AS o);
    FOREACH v_o IN ARRAY ARRAY(SELECT o FROM unnest(cur.acked_ahead) AS o
                               WHERE o > v_committed ORDER BY o) LOOP
        EXIT WHEN v_o <> v_committed + 1;
        v_committed := v_o;
    END LOOP;
    v_ahead := ARRAY(SELECT o FROM unnest(cur.acked_ahead) AS o WHERE o > v_committed
                     ORDER BY o);

    UPDATE queen.cursors c
    SET committed = v_committed, acked_ahead = v_ahead,
        lease_expires_at = CASE WHEN v_committed >= cur.leased_to THEN NULL
                                ELSE c.lease_expires_at END,
        updated_at = now()
    WHERE c.ctid = cur.tid;
    DELETE FROM queen.retries r
    WHERE r.partition_id = p_partition AND r.consumer_group = p_group
      AND r."offset" <= v_committed;

    SELECT q.name, p.name INTO v_queue, v_pname
    FROM queen.partitions p JOIN queen.queues q USING (queue_id)
    WHERE p.partition_id = p_partition;
    IF v_committed >= cur.leased_to THEN
        -- The partition is free again: long polls of the queue (on every broker) look again.
        PERFORM pg_notify('queen_log', p_tenant::text || ':' || v_queue);
    END IF;

    -- One row, with the highest acked offset: the caller needs no more (500 rows of the
    -- same columns were most of what an ack cost the broker to read).
    RETURN QUERY
    SELECT 'acked', v_queue, v_pname, cur.committed, cur.acked_ahead, cur.leased_to,
           NULL::text, (SELECT max(o) FROM unnest(v_offsets) AS o);
END
$$;

CREATE FUNCTION queen.advance_sweep_floor() RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_floor timestamptz := queen.sweep_floor();
    v_clock timestamptz := clock_timestamp();  -- read before anything below
    v_writers timestamptz;
    v_holders bigint[];  -- the transaction ids backends hold, as that read saw them
    v_unstarted bigint[];  -- those of this database's backends it saw no start for
    v_next timestamptz;
BEGIN
    IF v_floor <= v_clock AND v_floor > v_clock - interval '50 milliseconds' THEN
        RETURN v_floor;
    END IF;
    -- Every transaction of this database holding a transaction id now, read BEFORE the
    -- snapshot of the next statement (the backends' table is read once per transaction, at
    -- its first use: this one). A writer that takes its id after this read reads its clock
    -- later still (the trigger below), so its rows are not below v_clock. The snapshot's own
    -- list of transactions in progress is not enough: an id at or above its xmax (nothing newer
    -- has finished yet, as for a lone writer) is running but not listed. (What the next
    -- statement checks that list against is kept from this one read: the table, built once
    -- per call and per backend, is most of the cost.)
    SELECT min(a.xact_start) FILTER (WHERE a.datid = d.oid),
           coalesce(array_agg(a.backend_xid::text::bigint), '{}'),
           coalesce(array_agg(a.backend_xid::text::bigint)
                        FILTER (WHERE a.xact_start IS NULL AND a.datid = d.oid), '{}')
    INTO v_writers, v_holders, v_unstarted
    FROM pg_stat_get_activity(NULL) a
    CROSS JOIN (SELECT oid FROM pg_database WHERE datname = current_database()) d
    WHERE a.backend_xid IS NOT NULL;
    SELECT least(
        v_clock,
        v_writers,
        (SELECT min(t.visible_at) FROM queen.timers t WHERE t.visible_at >= (SELECT v_floor)),
        -- A transaction listed in progress by this snapshot that the read above did not see
        -- holding an id (it took one since, or the read is older than this transaction's
        -- start): its start is unknown here, so the floor stays.
        (SELECT CASE WHEN bool_or(NOT x.xid = ANY (v_holders) OR x.xid = ANY (v_unstarted))
                     THEN v_floor END
         FROM (SELECT s.xid::text::bigint % 4294967296 AS xid
               FROM pg_snapshot_xip(pg_current_snapshot()) AS s(xid)) AS x))
    INTO v_next;
    IF v_next <> v_floor THEN
        PERFORM setval('queen.timer_sweep_floor',
                       greatest(floor(extract(epoch FROM v_next) * 1000000)::bigint, 0));
    END IF;
    RETURN v_next;
END
$$;

CREATE FUNCTION queen.analyze_grown_tables(p_slack integer) RETURNS TABLE(table_name text, live_rows bigint, rows_before real)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v record;
BEGIN
    FOR v IN
        SELECT s.schemaname, s.relname, s.n_live_tup, c.reltuples
        FROM pg_stat_user_tables s
        JOIN pg_class c ON c.oid = s.relid
        WHERE s.schemaname = 'queen'
          AND s.n_live_tup > 2 * greatest(c.reltuples, 0) + p_slack
        ORDER BY s.relname
    LOOP
        EXECUTE format('ANALYZE (SKIP_LOCKED) %I.%I', v.schemaname, v.relname);
        table_name := v.schemaname || '.' || v.relname;
        live_rows := v.n_live_tup;
        rows_before := v.reltuples;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION queen.append_timer_frames(p_tenants integer[], p_queues text[], p_keys text[], p_partitions text[], p_txns text[], p_message_ids uuid[], p_texts text[], p_payload_bytes integer[], p_deliver_at timestamp with time zone[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    v_appended integer;
    v_queues_woken integer;
    v_wanted integer;
    v_locked integer;
    v_stamp timestamptz;
    -- The distinct destinations, found once (a batch has thousands of frames, a handful of
    -- partitions): every look-up below is by these.
    v_dest_tenants integer[];
    v_dest_queues text[];
    v_dest_partitions text[];
BEGIN
    SELECT array_agg(w.tenant_id), array_agg(w.queue), array_agg(w.partition), count(*)
    INTO v_dest_tenants, v_dest_queues, v_dest_partitions, v_wanted
    FROM (SELECT DISTINCT * FROM unnest(p_tenants, p_queues, p_partitions))
         AS w(tenant_id, queue, partition);
    -- First frames of a queue or a partition (usually they exist): create what is missing
    -- before locking anything. Creating them while holding other partitions' locks could
    -- deadlock with a push doing the same in the other order (each waits for the other's
    -- uncommitted insert or row lock).
    SELECT count(*) INTO v_locked
    FROM queen.partitions p
    JOIN queen.queues q USING (queue_id)
    WHERE (q.tenant_id, q.name, p.name) IN (
        SELECT * FROM unnest(v_dest_tenants, v_dest_queues, v_dest_partitions));
    IF v_locked < v_wanted THEN
        INSERT INTO queen.queues (tenant_id, name)
        SELECT DISTINCT n.tenant_id, n.queue
        FROM unnest(v_dest_tenants, v_dest_queues) AS n(tenant_id, queue)
        WHERE NOT EXISTS (SELECT 1 FROM queen.queues q
                          WHERE q.tenant_id = n.tenant_id AND q.name = n.queue)
        ORDER BY 1, 2
        ON CONFLICT (tenant_id, name) DO NOTHING;
        INSERT INTO queen.partitions (tenant_id, queue_id, name)
        SELECT DISTINCT n.tenant_id, q.queue_id, n.partition
        FROM unnest(v_dest_tenants, v_dest_queues, v_dest_partitions)
             AS n(tenant_id, queue, partition)
        JOIN queen.queues q ON q.tenant_id = n.tenant_id AND q.name = n.queue
        WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p
                          WHERE p.queue_id = q.queue_id AND p.name = n.partition)
        ORDER BY 2, 3
        ON CONFLICT (queue_id, name) DO NOTHING;
    END IF;
    WITH locked AS (
        SELECT 1
        FROM queen.partitions p
        JOIN queen.queues q USING (queue_id)
        WHERE (q.tenant_id, q.name, p.name) IN (
            SELECT * FROM unnest(v_dest_tenants, v_dest_queues, v_dest_partitions))
        ORDER BY p.partition_id
        FOR NO KEY UPDATE OF p
    )
    SELECT count(*) INTO v_locked FROM locked;
    IF v_locked <> v_wanted THEN
        -- A queue deleted while we created its partition: try the whole fire again later
        -- rather than append fewer frames than the rows it deletes.
        RAISE EXCEPTION 'a destination partition vanished during the fire'
            USING ERRCODE = 'serialization_failure';
    END IF;
    -- The frames' createdAt: one clock read, under the partitions' locks, for the batch (as
    -- a push stamps its frames with one instant), never before a timer's deliverAt. One
    -- instant per batch also lets the broker write each pop answer's createdAt once.
    v_stamp := clock_timestamp();

    -- Each destination partition's row is read once (dest), not once per frame: it is
    -- updated by every fire and push, and while a snapshot is held all its versions stay, so
    -- each read of it steps through them. Read per frame, a sweep's cost grew with its batch
    -- times the fires since the snapshot (bench/sweep_floor.py, "firing").
    WITH dest AS MATERIALIZED (
        SELECT d.tenant_id, d.queue, d.partition, p.partition_id, p.next_offset
        FROM unnest(v_dest_tenants, v_dest_queues, v_dest_partitions)
             AS d(tenant_id, queue, partition)
        JOIN queen.queues q ON q.tenant_id = d.tenant_id AND q.name = d.queue
        JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = d.partition
    ), fired AS (
        SELECT f.*, d.partition_id,
               d.next_offset - 1 + row_number() OVER (PARTITION BY d.partition_id ORDER BY f.ord)
                   AS "offset"
        FROM unnest(p_tenants, p_queues, p_keys, p_partitions, p_txns, p_message_ids, p_texts,
                    p_payload_bytes, p_deliver_at) WITH ORDINALITY
             AS f(tenant_id, queue, timer_key, partition, txn, message_id, payload,
                  payload_bytes, deliver_at, ord)
        JOIN dest d ON d.tenant_id = f.tenant_id AND d.queue = f.queue
                   AND d.partition = f.partition
    ), appended AS (
        INSERT INTO queen.frames (partition_id, "offset", tenant_id, transaction_id, payload,
                                  size_bytes, created_at, meta)
        SELECT partition_id, "offset", tenant_id, txn, payload::jsonb, octet_length(payload),
               greatest(v_stamp, deliver_at),
               queen.timer_frame_meta(message_id, timer_key, deliver_at)
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
$$;

CREATE FUNCTION queen.cancel_timer(p_tenant integer, p_queue text, p_key text, p_txn text, OUT ord integer, OUT status text, OUT txn text) RETURNS record
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    v_row tid;
    v_txn text;
    v_bytes integer;
    v_claimed boolean;
BEGIN
    ord := 1;
    -- (queen.lock_timer_names' lock, spelled for one name)
    PERFORM pg_advisory_xact_lock(1363170305, queen.timer_name_hash(p_tenant, p_queue, p_key));
    SELECT x.ctid, x.txn, x.payload_bytes, x.claim_token IS NOT NULL AND x.visible_at > now()
    INTO v_row, v_txn, v_bytes, v_claimed
    FROM queen.timers x
    WHERE x.tenant_id = p_tenant AND x.queue = p_queue AND x.timer_key = p_key
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- No row (absent), or one a firing sweeper has locked (too_late).
        SELECT x.txn INTO v_txn
        FROM queen.timers x
        WHERE x.tenant_id = p_tenant AND x.queue = p_queue AND x.timer_key = p_key;
        IF FOUND THEN
            status := 'too_late';
            txn := v_txn;
        ELSE
            status := 'absent';
            txn := p_txn;
        END IF;
        RETURN;
    END IF;
    IF v_claimed THEN
        status := 'too_late';
        txn := v_txn;
        RETURN;
    END IF;
    DELETE FROM queen.timers t WHERE t.ctid = v_row;
    IF v_bytes <> 0 THEN
        INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (p_tenant, -v_bytes);
    END IF;
    status := 'cancelled';
    txn := v_txn;
END
$$;

CREATE FUNCTION queen.cancel_timers(p_tenant integer, p_queues text[], p_keys text[], p_txns text[]) RETURNS TABLE(ord integer, status text, txn text)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM queen.lock_timer_names(p_tenant, p_queues, p_keys);
    RETURN QUERY
    WITH input AS (
        SELECT u.queue, u.timer_key, u.txn, u.ord::integer AS ord
        FROM unnest(p_queues, p_keys, p_txns) WITH ORDINALITY AS u(queue, timer_key, txn, ord)
    ), existing AS (
        SELECT i.ord, t.txn
        FROM input i
        CROSS JOIN LATERAL (
            SELECT x.txn FROM queen.timers x
            WHERE x.tenant_id = p_tenant AND x.queue = i.queue AND x.timer_key = i.timer_key
            LIMIT 1
        ) t
    ), locked AS (
        -- SKIP LOCKED: a row locked by a firing sweeper is left alone (too_late below).
        SELECT i.ord, t.row_id, t.claimed
        FROM input i
        CROSS JOIN LATERAL (
            SELECT x.ctid AS row_id, x.claim_token IS NOT NULL AND x.visible_at > now() AS claimed
            FROM queen.timers x
            WHERE x.tenant_id = p_tenant AND x.queue = i.queue AND x.timer_key = i.timer_key
            FOR UPDATE SKIP LOCKED
        ) t
    ), deleted AS (
        DELETE FROM queen.timers t
        USING locked l
        WHERE t.ctid = l.row_id AND NOT l.claimed
        RETURNING l.ord, t.txn, t.payload_bytes
    ), usage AS (  -- (run whether or not read, as every data-modifying WITH is)
        INSERT INTO queen.usage_deltas (tenant_id, bytes)
        SELECT p_tenant, -sum(d.payload_bytes) FROM deleted d HAVING count(*) > 0
    )
    SELECT i.ord,
           CASE WHEN d.ord IS NOT NULL THEN 'cancelled'
                WHEN e.ord IS NOT NULL THEN 'too_late'
                ELSE 'absent' END,
           CASE WHEN d.ord IS NOT NULL THEN d.txn
                WHEN e.ord IS NOT NULL THEN e.txn
                ELSE i.txn END
    FROM input i
    LEFT JOIN deleted d ON d.ord = i.ord
    LEFT JOIN existing e ON e.ord = i.ord
    ORDER BY i.ord;
END
$$;

CREATE FUNCTION queen.cursor_for_update(p_tenant integer, p_partition uuid, p_group text, OUT tid tid, OUT committed bigint, OUT acked_ahead bigint[], OUT lease_id uuid, OUT leased_to bigint, OUT lease_live boolean, OUT attempt_offset bigint) RETURNS record
    LANGUAGE plpgsql
    SET enable_sort TO 'off'
    AS $$
BEGIN
    SELECT c.ctid, c.committed, c.acked_ahead, c.lease_id, c.leased_to,
           c.lease_expires_at > now(), c.attempt_offset
    INTO tid, committed, acked_ahead, lease_id, leased_to, lease_live, attempt_offset
    FROM queen.cursors c
    WHERE (c.partition_id, c.consumer_group) >= (p_partition, p_group)
      AND (c.partition_id, c.consumer_group) <= (p_partition, p_group)
      AND c.tenant_id = p_tenant
    ORDER BY c.partition_id DESC, c.consumer_group DESC
    LIMIT 1
    FOR UPDATE;
END
$$;

CREATE FUNCTION queen.delete_partitions_frames() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM queen.frames f USING gone g WHERE f.partition_id = g.partition_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION queen.delete_tenants_timers() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM queen.timers t USING gone g WHERE t.tenant_id = g.tenant_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION queen.ensure_partitions(p_tenant integer, p_queues text[], p_names text[]) RETURNS integer
    LANGUAGE sql
    AS $$
    WITH created AS (
        INSERT INTO queen.partitions (tenant_id, queue_id, name)
        SELECT p_tenant, q.queue_id, n.name
        FROM unnest(p_queues, p_names) AS n(queue, name)
        JOIN queen.queues q ON q.tenant_id = p_tenant AND q.name = n.queue
        ORDER BY n.queue, n.name  -- every creator inserts in one order
        ON CONFLICT (queue_id, name) DO NOTHING
        RETURNING 1)
    SELECT count(*)::integer FROM created
$$;

CREATE FUNCTION queen.ensure_queues(p_tenant integer, p_names text[]) RETURNS integer
    LANGUAGE sql
    AS $$
    WITH created AS (
        INSERT INTO queen.queues (tenant_id, name)
        SELECT p_tenant, n FROM unnest(p_names) AS n
        ORDER BY n  -- every creator inserts in one order
        ON CONFLICT (tenant_id, name) DO NOTHING
        RETURNING 1)
    SELECT count(*)::integer FROM created
$$;

CREATE FUNCTION queen.find_transactions(p_partition uuid, p_txns text[]) RETURNS TABLE(transaction_id text, "offset" bigint)
    LANGUAGE plpgsql STABLE
    SET enable_seqscan TO 'off'
    SET enable_indexscan TO 'off'
    AS $$
DECLARE
    v_hashes bigint[] := ARRAY(SELECT hashtextextended(x, 0) FROM unnest(p_txns) AS x);
BEGIN
    RETURN QUERY
    SELECT f.transaction_id, f."offset"
    FROM queen.frames f
    WHERE f.partition_id = p_partition AND f.transaction_id = ANY(p_txns);
    RETURN QUERY
    WITH hit AS MATERIALIZED (
        SELECT s.partition_id, s.first_offset, s.transaction_ids
        FROM queen.segments s
        WHERE s.transaction_hashes && v_hashes
    )
    SELECT t.txn, h.first_offset + t.i - 1
    FROM hit h
    CROSS JOIN LATERAL unnest(h.transaction_ids) WITH ORDINALITY AS t(txn, i)
    JOIN unnest(p_txns) AS w(txn) ON w.txn = t.txn
    WHERE h.partition_id = p_partition;
END
$$;

CREATE FUNCTION queen.fire_claimed_timers(p_token uuid, p_tenants integer[], p_queues text[], p_keys text[], p_texts text[]) RETURNS TABLE(tenant_id integer, queue text, timer_key text)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH ours AS (
        -- One index lookup per key (LATERAL), whatever the planner thinks of the table.
        SELECT k.ord, k.text, t.ctid AS row_id
        FROM unnest(p_tenants, p_queues, p_keys, p_texts) WITH ORDINALITY
             AS k(tenant_id, queue, timer_key, text, ord)
        CROSS JOIN LATERAL (
            SELECT x.ctid FROM queen.timers x
            WHERE x.tenant_id = k.tenant_id AND x.queue = k.queue
              AND x.timer_key = k.timer_key AND x.claim_token = p_token
            FOR UPDATE
        ) t
    ), gone AS (
        DELETE FROM queen.timers t
        USING ours o
        WHERE t.ctid = o.row_id
        RETURNING o.ord, t.tenant_id, t.queue, t.timer_key, t.partition, t.txn, t.message_id,
                  o.text, t.payload_bytes, t.deliver_at
    ), appended AS (
        SELECT queen.append_timer_frames(
                   array_agg(g.tenant_id ORDER BY g.ord), array_agg(g.queue ORDER BY g.ord),
                   array_agg(g.timer_key ORDER BY g.ord), array_agg(g.partition ORDER BY g.ord),
                   array_agg(g.txn ORDER BY g.ord), array_agg(g.message_id ORDER BY g.ord),
                   array_agg(g.text ORDER BY g.ord), array_agg(g.payload_bytes ORDER BY g.ord),
                   array_agg(g.deliver_at ORDER BY g.ord)) AS done
        FROM gone g
        HAVING count(*) > 0
    )
    SELECT g.tenant_id, g.queue, g.timer_key
    FROM gone g, (SELECT count(*) FROM appended) a;
END
$$;

CREATE FUNCTION queen.fire_lock_key(p_tenant integer, p_queue text) RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT hashtext(p_tenant::text || ':' || p_queue) $$;

CREATE FUNCTION queen.lock_partitions(p_tenant integer, p_queues text[], p_names text[]) RETURNS TABLE(partition_id uuid, queue text, name text, next_offset bigint, queue_id bigint, max_size bigint, encryption_enabled boolean)
    LANGUAGE sql
    AS $$
    SELECT p.partition_id, q.name, p.name, p.next_offset, q.queue_id, q.max_size,
           q.encryption_enabled
    FROM queen.partitions p
    JOIN queen.queues q USING (queue_id)
    WHERE q.tenant_id = p_tenant
      AND (q.name, p.name) IN (SELECT unnest(p_queues), unnest(p_names))
      AND (SELECT count(*) FROM queen.partitions p2 JOIN queen.queues q2 USING (queue_id)
           WHERE q2.tenant_id = p_tenant
             AND (q2.name, p2.name) IN (SELECT unnest(p_queues), unnest(p_names)))
          = cardinality(p_names)
    ORDER BY p.partition_id
    FOR NO KEY UPDATE OF p
$$;

CREATE FUNCTION queen.lock_timer_names(p_tenant integer, p_queues text[], p_keys text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- One statement: the locks are taken as the sorted rows go by.
    PERFORM count(pg_advisory_xact_lock(1363170305, h.name))
    FROM (SELECT DISTINCT queen.timer_name_hash(p_tenant, u.q, u.k) AS name
          FROM unnest(p_queues, p_keys) AS u(q, k)
          ORDER BY 1) AS h;
END
$$;

CREATE FUNCTION queen.newest_frame_at(p_partition uuid, p_next_offset bigint) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT f.created_at FROM queen.frames f
         WHERE f.partition_id = p_partition AND f."offset" = p_next_offset - 1),
        (SELECT s.last_created_at FROM queen.segments s
         WHERE s.partition_id = p_partition ORDER BY s.last_offset DESC LIMIT 1),
        '-infinity')
$$;

CREATE FUNCTION queen.next_look(p_tenant integer, p_queue text, p_group text, p_partition text) RETURNS double precision
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN (
        SELECT extract(epoch FROM min(coalesce(greatest(
                   c.lease_expires_at, c.retry_at,
                   (SELECT f.created_at + make_interval(secs => q.delayed_processing_s)
                    FROM queen.frames f
                    WHERE q.delayed_processing_s > 0 AND f.partition_id = p.partition_id
                      AND f."offset" = greatest(c.committed + 1, p.log_start)),
                   CASE WHEN q.window_buffer_s > 0  -- windowBuffer: the newest frame old enough
                        THEN queen.newest_frame_at(p.partition_id, p.next_offset)
                             + make_interval(secs => q.window_buffer_s) END),
               now())) - now())::float8
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.queue_id
        LEFT JOIN queen.cursors c
               ON c.partition_id = p.partition_id AND c.consumer_group = p_group
        WHERE q.tenant_id = p_tenant AND q.name = p_queue
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.next_offset > greatest(coalesce(c.committed + 1, 0), p.log_start));
END
$$;

CREATE FUNCTION queen.pop_head(p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer, p_auto_ack boolean, p_after text) RETURNS TABLE(outcome text, partition_id uuid, partition text, lease_id uuid, lease_expires_at timestamp with time zone, "offset" bigint, transaction_id text, payload jsonb, created_at timestamp with time zone, meta jsonb)
    LANGUAGE plpgsql
    AS $$
DECLARE
    r record;
BEGIN
    r := queen.pop_head_take(p_tenant, p_queue, p_group, p_partition, p_batch, p_auto_ack,
                             p_after, NULL, NULL, NULL, NULL, false);
    IF r.outcome = 'messages' THEN
        RETURN QUERY
        SELECT 'messages'::text, r.partition_id, r.partition, r.lease_id, r.lease_expires_at,
               u.o, u.t, u.p, u.c, u.m
        FROM unnest(r.offsets, r.txns, r.payloads, r.created, r.metas) AS u(o, t, p, c, m);
        RETURN;
    END IF;
    -- (No message: one row, the outcome alone; RETURN NEXT starts no query for it.)
    outcome := r.outcome;
    RETURN NEXT;
END
$$;

CREATE FUNCTION queen.pop_head_after(p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer, p_auto_ack boolean, p_not_before double precision, p_give_up double precision) RETURNS TABLE(outcome text, partition_id uuid, partition text, lease_id uuid, lease_expires_at timestamp with time zone, "offset" bigint, transaction_id text, payload jsonb, created_at timestamp with time zone, meta jsonb)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_lock_timeout text := current_setting('lock_timeout');
    v_left float8;
BEGIN
    -- Sleep (no spin: the sweep's backend is spinning for its instant) until the sweep, sent
    -- ahead of this, surely holds the lock.
    v_left := p_not_before - 0.002 - extract(epoch FROM clock_timestamp());
    IF v_left > 0 THEN
        PERFORM pg_sleep(least(v_left, 0.1));
    END IF;
    -- At most a second past the due instant, whatever the caller asked.
    v_left := least(p_give_up, p_not_before + 1.0) - extract(epoch FROM clock_timestamp());
    IF v_left > 0 THEN
        PERFORM set_config('lock_timeout', ceil(v_left * 1000)::bigint::text || 'ms', true);
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(1363170306,
                                                 queen.fire_lock_key(p_tenant, p_queue));
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- the fire is late: pop now, and the NOTIFY will tell of it later
        END;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    END IF;
    -- A new statement, so a new snapshot: it sees the fire that has just committed.
    -- (No rotation pointer: the walk starts at the first name.)
    RETURN QUERY SELECT * FROM queen.pop_head(p_tenant, p_queue, p_group, p_partition, p_batch,
                                              p_auto_ack, NULL::text);
END
$$;

CREATE FUNCTION queen.pop_head_take(p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer, p_auto_ack boolean, p_after text, p_settle_partition uuid, p_settle_lease uuid, p_settle_from bigint, p_settle_through bigint, p_rows boolean, OUT outcome text, OUT partition_id uuid, OUT partition text, OUT lease_id uuid, OUT lease_expires_at timestamp with time zone, OUT offsets bigint[], OUT txns text[], OUT payloads jsonb[], OUT created timestamp with time zone[], OUT metas jsonb[], OUT settled boolean, OUT json_rows jsonb, OUT taken integer) RETURNS record
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_sort text := current_setting('enable_sort');
    cand record;
    stl record;  -- the settled cursor (queen.settle_cursor)
    v_settle uuid;  -- its partition while its settlement is still to be written
    v_tid tid;  -- the candidate's cursor: its newest version, and what it holds
    v_committed bigint;
    v_ahead bigint[];
    v_held_until timestamptz;
    v_leased_to bigint;
    v_attempt bigint;
    v_wanted bigint;
    v_last bigint;
    v_fallback boolean := false;
    v_retried bigint;  -- the highest offset up to the batch's last with a retry history
    v_lease uuid;
    v_expires timestamptz;
    v_set text;
BEGIN
    IF p_settle_partition IS NOT NULL THEN
        stl := queen.settle_cursor(p_tenant, p_group, p_settle_partition, p_settle_lease,
                                   p_settle_from, p_settle_through);
        settled := stl.tid IS NOT NULL;
        IF settled THEN
            v_settle := p_settle_partition;
        END IF;
    END IF;
    -- The same candidates, in the same order, as the general pop (pop_candidates): the
    -- rotation after p_after (queen.pop_walk). Consumers of the group popping at once start
    -- from the same pointer and each skips the partitions the others are taking: 32, not 8,
    -- so that ten of them at once still find one each (an empty answer sends Queen's client
    -- to sleep 100 ms). The loop fetches them ten at a time, so the first costs no more.
    FOR cand IN
        SELECT w.partition_id AS pid, w.name AS pname, w.log_start, w.next_offset,
               w.lease_time_s, w.delayed_processing_s, w.window_buffer_s, w.queue_id
        FROM queen.pop_walk(p_tenant, p_queue, p_group, p_partition, p_after, 32, v_settle,
                            p_settle_through) w
    LOOP
        IF cand.delayed_processing_s > 0 OR cand.window_buffer_s > 0 THEN
            v_fallback := true;
            EXIT;
        END IF;
        IF cand.pid = v_settle THEN
            -- The cursor settled above, locked since: as its settlement leaves it.
            v_tid := stl.tid;
            v_committed := p_settle_through;
            v_ahead := '{}';
            v_held_until := NULL;
            v_leased_to := p_settle_through;
            v_attempt := stl.attempt_offset;
        ELSE
            -- The cursor's newest version first (see queen.ack_head), and by its ctid after;
            -- sorts off for this statement alone, as there.
            -- (Assignments: no executor started for them, as a PERFORM's query would be; and
            -- they leave FOUND as the SELECT set it: after a PERFORM, FOUND was always true,
            -- so a cursor another consumer held sent the pop to the general pop rather than
            -- on to the next candidate.)
            v_set := set_config('enable_sort', 'off', true);
            SELECT c.ctid, c.committed, c.acked_ahead, c.lease_expires_at, c.leased_to,
                   c.attempt_offset
            INTO v_tid, v_committed, v_ahead, v_held_until, v_leased_to, v_attempt
            FROM queen.cursors c
            WHERE (c.partition_id, c.consumer_group) >= (cand.pid, p_group)
              AND (c.partition_id, c.consumer_group) <= (cand.pid, p_group)
              AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
            ORDER BY c.partition_id DESC, c.consumer_group DESC
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            v_set := set_config('enable_sort', v_sort, true);
            IF NOT FOUND THEN
                IF EXISTS (SELECT 1 FROM queen.cursors c
                           WHERE c.partition_id = cand.pid AND c.consumer_group = p_group) THEN
                    CONTINUE;  -- another consumer of the group holds (or is taking) it
                END IF;
                -- The group's first pop here. A named group's cursors are the broker's to
                -- create (its subscription decides where they start). Queue mode's start
                -- before log_start, always: created here as the general pop creates them
                -- (queen_trio/sql/log.sql seed_cursors: on every partition of the queue that
                -- has none, in partition order, under the same turn, claim_cursor_creation).
                -- The first message of a new partition then reaches a consumer in this
                -- statement, the sweep's own pop included, not through the general pop's
                -- transaction after a fallback (about 10 ms more for a timer's first fire
                -- into a new queue, bench.first_fires).
                IF p_group <> '__QUEUE_MODE__'
                   OR NOT pg_try_advisory_xact_lock(1363170308,
                                                    hashtext(cand.queue_id::text || ':'
                                                             || p_group)) THEN
                    v_fallback := true;
                    EXIT;
                END IF;
                INSERT INTO queen.cursors (partition_id, consumer_group, tenant_id, committed)
                SELECT p.partition_id, p_group, p_tenant, p.log_start - 1
                FROM queen.partitions p
                WHERE p.queue_id = cand.queue_id
                  AND NOT EXISTS (SELECT 1 FROM queen.cursors c
                                  WHERE c.partition_id = p.partition_id
                                    AND c.consumer_group = p_group)
                ORDER BY p.partition_id
                ON CONFLICT (partition_id, consumer_group) DO NOTHING;
                SELECT c.ctid, c.committed, c.acked_ahead, c.lease_expires_at, c.leased_to,
                       c.attempt_offset
                INTO v_tid, v_committed, v_ahead, v_held_until, v_leased_to, v_attempt
                FROM queen.cursors c
                WHERE c.partition_id = cand.pid AND c.consumer_group = p_group
                FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    CONTINUE;  -- (created and taken meanwhile by another consumer: as held)
                END IF;
            END IF;
        END IF;
        -- (A lease last started where this one would: a redelivery, whose deliveryAttempt
        -- the general pop counts.)
        IF cardinality(v_ahead) > 0 OR v_committed < cand.log_start - 1
           OR (v_held_until IS NOT NULL AND coalesce(v_leased_to, -1) > v_committed)
           OR (NOT p_auto_ack AND v_attempt = v_committed + 1) THEN
            v_fallback := true;
            EXIT;
        END IF;

        v_wanted := least(p_batch, cand.next_offset - v_committed - 1);
        IF v_wanted <= 0 THEN
            -- Another consumer of the group took these frames between the candidates and the
            -- lock: nothing left here.
            CONTINUE;
        END IF;
        -- The lease, chosen before the frames are read: the JSON rows (p_rows) carry it.
        IF NOT p_auto_ack THEN
            v_lease := gen_random_uuid();
            v_expires := now() + make_interval(secs => cand.lease_time_s);
        END IF;
        -- (Aggregated in the order read_frames answers them, by offset: one ordered read,
        -- not a sort of the batch for each array_agg, as an ORDER BY in each made. Whether
        -- any of them has a retry history, in the same statement: one query less to start;
        -- and whether the settled batch's frames have one, to drop below.)
        IF p_rows THEN
            -- The batch as queen.pop_head's rows read by to_jsonb (the sweep's answer,
            -- queen.sweep_settle_and_pop), made here rather than by a statement of the
            -- caller's from the arrays: the same keys and values.
            SELECT count(*), max(x."offset"), jsonb_agg(to_jsonb(x)),
                   (SELECT max(r."offset") FROM queen.retries r
                    WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
                      AND r."offset" <= v_committed + v_wanted)
            INTO taken, v_last, json_rows, v_retried
            FROM (SELECT 'messages'::text AS outcome, cand.pid AS partition_id,
                         cand.pname AS partition, v_lease AS lease_id,
                         v_expires AS lease_expires_at, f."offset", f.transaction_id,
                         f.payload, f.created_at, f.meta
                  FROM queen.read_frames(cand.pid, v_committed + 1, v_wanted::integer) f) x;
        ELSE
            SELECT array_agg(f."offset"), array_agg(f.transaction_id), array_agg(f.payload),
                   array_agg(f.created_at), array_agg(f.meta),
                   (SELECT max(r."offset") FROM queen.retries r
                    WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
                      AND r."offset" <= v_committed + v_wanted)
            INTO offsets, txns, payloads, created, metas, v_retried
            FROM queen.read_frames(cand.pid, v_committed + 1, v_wanted::integer) f;
            taken := coalesce(cardinality(offsets), 0);
            v_last := offsets[taken];
        END IF;
        IF taken < v_wanted  -- some are sealed
           OR v_retried > v_committed
        THEN
            offsets := NULL;
            txns := NULL;
            payloads := NULL;
            created := NULL;
            metas := NULL;
            json_rows := NULL;
            taken := NULL;
            v_fallback := true;
            EXIT;
        END IF;

        IF p_auto_ack THEN
            -- (Through v_last: past a settlement of this partition too.)
            UPDATE queen.cursors c
            SET committed = v_last, lease_expires_at = NULL, updated_at = now()
            WHERE c.ctid = v_tid;
            DELETE FROM queen.retries r
            WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
              AND r."offset" <= v_last;
        ELSE
            -- (The lease commits at the level its caller set for pops, QUEEN_POP_COMMIT: by
            -- default it does not wait for the disk, as losing it in a crash only does what
            -- its expiry would; under sync it waits as the server is configured.) The cursor
            -- settled above gets its settlement in the same UPDATE (committed: unchanged for
            -- any other cursor, locked since it was read).
            UPDATE queen.cursors c
            SET committed = v_committed, lease_id = v_lease, lease_expires_at = v_expires,
                leased_to = v_last, updated_at = now(),
                -- Fresh work (redeliveries fell back above): delivery attempt 1.
                attempt_offset = v_committed + 1, attempt_count = 1
            WHERE c.ctid = v_tid;
            IF cand.pid = v_settle AND v_retried IS NOT NULL THEN
                -- The settled frames' retry history (the read above saw it), as
                -- queen.settle_head drops it.
                DELETE FROM queen.retries r
                WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
                  AND r."offset" <= p_settle_through;
            END IF;
            lease_id := v_lease;
            lease_expires_at := v_expires;
        END IF;
        IF cand.pid = v_settle THEN
            v_settle := NULL;  -- (written)
        END IF;
        outcome := 'messages';
        partition_id := cand.pid;
        partition := cand.pname;
        EXIT;
    END LOOP;

    IF v_settle IS NOT NULL THEN
        -- The settlement alone: the pop took another partition, or nothing.
        PERFORM queen.settle_write(stl.tid, v_settle, p_group, p_settle_through);
    END IF;
    IF outcome IS NULL THEN
        -- Nothing to pop (no candidate, or every candidate held by another consumer of the
        -- group), or a case for the general pop.
        outcome := CASE WHEN v_fallback THEN 'fallback' ELSE 'empty' END;
    END IF;
END
$$;

CREATE FUNCTION queen.pop_walk(p_tenant integer, p_queue text, p_group text, p_partition text, p_after text, p_limit integer, p_settled uuid DEFAULT NULL::uuid, p_settled_through bigint DEFAULT NULL::bigint) RETURNS TABLE(partition_id uuid, name text, log_start bigint, next_offset bigint, queue_id bigint, lease_time_s integer, retry_limit integer, delayed_processing_s integer, window_buffer_s integer, dead_letter_queue boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT p.partition_id, p.name, p.log_start, p.next_offset, q.queue_id, q.lease_time_s,
           q.retry_limit, q.delayed_processing_s, q.window_buffer_s, q.dead_letter_queue
    FROM queen.queues q
    CROSS JOIN LATERAL (
        (SELECT x.partition_id, x.name, x.log_start, x.next_offset
         FROM queen.partitions x
         WHERE x.queue_id = q.queue_id AND p_partition IS NULL
           AND x.name > coalesce(p_after, '')  -- (names are never empty)
         ORDER BY x.name)
        UNION ALL
        (SELECT x.partition_id, x.name, x.log_start, x.next_offset
         FROM queen.partitions x
         WHERE x.queue_id = q.queue_id AND p_partition IS NULL AND x.name <= p_after
         ORDER BY x.name)
        UNION ALL
        (SELECT x.partition_id, x.name, x.log_start, x.next_offset
         FROM queen.partitions x
         WHERE x.queue_id = q.queue_id AND x.name = p_partition)) p
    LEFT JOIN queen.cursors c
           ON c.partition_id = p.partition_id AND c.consumer_group = p_group
    WHERE q.tenant_id = p_tenant AND q.name = p_queue
      AND p.next_offset > greatest(coalesce(CASE WHEN p.partition_id = p_settled
                                                 THEN p_settled_through
                                                 ELSE c.committed END + 1, 0),
                                   p.log_start)
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now()
           OR p.partition_id = p_settled)
      AND (c.retry_at IS NULL OR c.retry_at <= now())  -- retryDelay: held after a failed ack
      AND (q.window_buffer_s = 0
           OR queen.newest_frame_at(p.partition_id, p.next_offset)
              <= now() - make_interval(secs => q.window_buffer_s))
    LIMIT p_limit
$$;

CREATE FUNCTION queen.poppable_now(p_tenant integer, p_queue text, p_group text, p_partition text, p_after text) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1
        FROM queen.queues q
        -- (LATERAL: the queue's index walked from the pointer, stopping at the 16th name; a
        -- join let the generic plan read every partition of the queue first)
        CROSS JOIN LATERAL (SELECT x.name
                            FROM queen.partitions x
                            WHERE x.queue_id = q.queue_id
                              AND x.name > coalesce(p_after, '')  -- (names are never empty)
                            ORDER BY x.name
                            LIMIT 16) c
        CROSS JOIN LATERAL queen.pop_walk(p_tenant, p_queue, p_group, c.name, NULL, 1) w
        WHERE q.tenant_id = p_tenant AND q.name = p_queue AND p_partition IS NULL
          AND w.delayed_processing_s = 0)
        OR (p_partition IS NOT NULL AND EXISTS (
            SELECT 1 FROM queen.pop_walk(p_tenant, p_queue, p_group, p_partition, NULL, 1) w
            WHERE w.delayed_processing_s = 0));
END
$$;

CREATE FUNCTION queen.push_head(p_tenant integer, p_queues text[], p_names text[], p_part integer[], p_txns text[], p_dedupe boolean[], p_payloads text[], p_metas text[], p_usage_offset bigint, p_wake text[]) RETURNS TABLE(outcome text, idx integer, partition_id uuid, "offset" bigint, held_meta jsonb, held_by integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    v_pids uuid[];
    v_next bigint[];
    v_refuse boolean;
    v_h_pair integer[];
    v_h_txn text[];
    v_h_off bigint[];
    v_h_meta jsonb[];
    v_sealed boolean;
    v_bytes bigint;
BEGIN
    SELECT array_agg(t.partition_id ORDER BY pr.i), array_agg(t.next_offset ORDER BY pr.i),
           bool_or(t.encryption_enabled OR t.max_size > 0)
    INTO v_pids, v_next, v_refuse
    FROM queen.take_partitions(p_tenant, p_queues, p_names) t
    JOIN unnest(p_queues, p_names) WITH ORDINALITY AS pr(queue, name, i)
      ON pr.queue = t.queue AND pr.name = t.name;
    IF v_refuse THEN
        RETURN QUERY SELECT 'fallback', NULL::integer, NULL::uuid, NULL::bigint, NULL::jsonb,
                            NULL::integer;
        RETURN;
    END IF;

    -- The frames already holding the client transaction ids (the first of each), as
    -- store._holders finds them; one sealed into a segment sends the push to the broker.
    SELECT array_agg(h.pair), array_agg(h.txn), array_agg(h.off), array_agg(h.meta),
           coalesce(bool_or(NOT h.in_head), false)
    INTO v_h_pair, v_h_txn, v_h_off, v_h_meta, v_sealed
    FROM (
        SELECT DISTINCT ON (w.pair, t.transaction_id)
               w.pair, t.transaction_id AS txn, t."offset" AS off, fr.meta,
               fr."offset" IS NOT NULL AS in_head
        FROM (SELECT u.part AS pair, array_agg(DISTINCT u.txn) AS txns
              FROM unnest(p_part, p_txns, p_dedupe) AS u(part, txn, dedupe)
              WHERE u.dedupe GROUP BY u.part) w
        CROSS JOIN LATERAL queen.find_transactions(v_pids[w.pair], w.txns) t
        LEFT JOIN queen.frames fr
               ON fr.partition_id = v_pids[w.pair] AND fr."offset" = t."offset"
        ORDER BY w.pair, t.transaction_id, t."offset") h;
    IF v_sealed THEN
        RETURN QUERY SELECT 'fallback', NULL::integer, NULL::uuid, NULL::bigint, NULL::jsonb,
                            NULL::integer;
        RETURN;
    END IF;

    RETURN QUERY
    WITH f AS (
        SELECT u.idx::integer AS idx, u.part, u.txn, u.dedupe, u.payload, u.meta,
               h.off AS held_off, h.meta AS held_meta,
               -- the first frame of this push with its transaction id holds it for the others
               CASE WHEN u.dedupe AND h.off IS NULL
                    THEN (min(u.idx) OVER (PARTITION BY u.part, u.txn, u.dedupe))::integer
               END AS first_idx
        FROM unnest(p_part, p_txns, p_dedupe, p_payloads, p_metas)
             WITH ORDINALITY AS u(part, txn, dedupe, payload, meta, idx)
        LEFT JOIN unnest(v_h_pair, v_h_txn, v_h_off, v_h_meta) AS h(pair, txn, off, meta)
               ON u.dedupe AND h.pair = u.part AND h.txn = u.txn
    ), numbered AS (
        SELECT f.*,
               CASE WHEN f.held_off IS NULL AND coalesce(f.first_idx, f.idx) = f.idx
                    THEN v_next[f.part] - 1
                         + count(*) FILTER (WHERE f.held_off IS NULL
                                              AND coalesce(f.first_idx, f.idx) = f.idx)
                           OVER (PARTITION BY f.part ORDER BY f.idx) END AS new_offset
        FROM f
    ), inserted AS (
        INSERT INTO queen.frames (partition_id, "offset", tenant_id, transaction_id, payload,
                                  size_bytes, created_at, meta)
        SELECT v_pids[n.part], n.new_offset, p_tenant, n.txn, n.payload::jsonb,
               octet_length(n.payload), clock_timestamp(), n.meta::jsonb
        FROM numbered n
        WHERE n.new_offset IS NOT NULL
        ORDER BY n.part, n.new_offset
        RETURNING 1
    ), moved AS (
        UPDATE queen.partitions p SET next_offset = n.top + 1
        FROM (SELECT v_pids[x.part] AS pid, max(x.new_offset) AS top
              FROM numbered x WHERE x.new_offset IS NOT NULL GROUP BY x.part) n
        WHERE p.partition_id = n.pid
        RETURNING 1
    ), used AS (
        -- Storage usage changes ride the writing transaction as deltas (queen.usage_deltas).
        INSERT INTO queen.usage_deltas (tenant_id, bytes)
        SELECT p_tenant, b.bytes
        FROM (SELECT coalesce(sum(octet_length(x.payload)), 0) + p_usage_offset AS bytes
              FROM numbered x WHERE x.new_offset IS NOT NULL) b
        WHERE b.bytes <> 0
        RETURNING 1
    )
    SELECT CASE WHEN n.new_offset IS NULL THEN 'duplicate' ELSE 'queued' END, n.idx,
           v_pids[n.part], coalesce(n.new_offset, n.held_off), n.held_meta,
           CASE WHEN n.first_idx <> n.idx THEN n.first_idx END
    FROM numbered n ORDER BY n.idx;
    -- Delivered only if this statement commits.
    PERFORM pg_notify('queen_log', w) FROM unnest(p_wake) AS w;
END
$$;

CREATE FUNCTION queen.read_frames(p_partition uuid, from_offset bigint, max_count integer) RETURNS TABLE("offset" bigint, transaction_id text, payload jsonb, size_bytes integer, created_at timestamp with time zone, meta jsonb)
    LANGUAGE sql STABLE
    AS $$
    SELECT f."offset", f.transaction_id, f.payload, f.size_bytes, f.created_at, f.meta
    FROM queen.frames f
    WHERE f.partition_id = p_partition
      AND f."offset" >= from_offset
      AND f."offset" < from_offset + max_count
    ORDER BY f."offset"
$$;

COMMENT ON FUNCTION queen.read_frames(p_partition uuid, from_offset bigint, max_count integer) IS 'The head of the log only; sealed frames are decoded by the broker (queen_trio/log/frames.py).';

CREATE FUNCTION queen.schedule_timer(p_tenant integer, p_queue text, p_key text, p_partition text, p_txn text, p_delay_ms bigint, p_bytes integer, p_payload bytea, p_zstd boolean, p_notify_within_ms bigint, OUT ord integer, OUT status text, OUT txn text, OUT message_id uuid, OUT deliver_at timestamp with time zone) RETURNS record
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    v_row tid;
    v_txn text;
    v_bytes integer;
    v_claimed boolean;
    v_id uuid;
    v_due timestamptz := now() + make_interval(secs => p_delay_ms / 1000.0);
BEGIN
    ord := 1;
    -- The tenant's row lock (see schedule_timers), then the name's (queen.lock_timer_names'
    -- lock, spelled for one name), in one statement.
    PERFORM pg_advisory_xact_lock(1363170305, queen.timer_name_hash(p_tenant, p_queue, p_key))
    FROM queen.tenants t WHERE t.tenant_id = p_tenant FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE foreign_key_violation USING MESSAGE = format('tenant %s does not exist', p_tenant);
    END IF;
    v_id := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                   PLACING substring(int8send((extract(epoch FROM clock_timestamp())
                                               * 1000)::bigint) FROM 3)
                   FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
    SELECT x.ctid, x.txn, x.payload_bytes, x.claim_token IS NOT NULL AND x.visible_at > now()
    INTO v_row, v_txn, v_bytes, v_claimed
    FROM queen.timers x
    WHERE x.tenant_id = p_tenant AND x.queue = p_queue AND x.timer_key = p_key
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF v_claimed THEN
            status := 'too_late';
            txn := v_txn;
            RETURN;
        END IF;
        -- A reschedule is a new timer under an old name: the failure budget starts again.
        UPDATE queen.timers t
        SET partition = p_partition, txn = p_txn, message_id = v_id, payload = p_payload,
            payload_zstd = p_zstd, payload_bytes = p_bytes, deliver_at = v_due,
            visible_at = v_due, attempts = 0, last_error = NULL, claim_token = NULL,
            claimed_by = NULL, updated_at = now()
        WHERE t.ctid = v_row;
        status := 'rescheduled';
        v_bytes := p_bytes - v_bytes;
    ELSE
        -- No row, or one a firing sweeper has locked (SKIP LOCKED passed it by): too_late.
        SELECT x.txn INTO v_txn
        FROM queen.timers x
        WHERE x.tenant_id = p_tenant AND x.queue = p_queue AND x.timer_key = p_key;
        IF FOUND THEN
            status := 'too_late';
            txn := v_txn;
            RETURN;
        END IF;
        INSERT INTO queen.timers AS t (tenant_id, queue, timer_key, partition, txn, message_id,
                                       payload, payload_zstd, payload_bytes, deliver_at,
                                       visible_at)
        VALUES (p_tenant, p_queue, p_key, p_partition, p_txn, v_id, p_payload, p_zstd, p_bytes,
                v_due, v_due)
        ON CONFLICT (tenant_id, queue, timer_key) DO NOTHING;
        IF NOT FOUND THEN
            -- Created by a concurrent transaction since our look: decided afresh by the
            -- set-based path, which retries this case.
            SELECT s.status, s.txn, s.message_id, s.deliver_at
            INTO status, txn, message_id, deliver_at
            FROM queen.schedule_timers(
                p_tenant, json_build_array(CASE WHEN p_zstd
                    THEN json_build_object('q', p_queue, 'k', p_key, 'p', p_partition,
                                           't', p_txn, 'd', p_delay_ms, 'b', p_bytes,
                                           'z', encode(p_payload, 'base64'))
                    ELSE json_build_object('q', p_queue, 'k', p_key, 'p', p_partition,
                                           't', p_txn, 'd', p_delay_ms, 'b', p_bytes,
                                           'j', convert_from(p_payload, 'UTF8')::json) END),
                p_notify_within_ms, 2) s;
            RETURN;
        END IF;
        status := 'scheduled';
        v_bytes := p_bytes;
        IF NOT EXISTS (SELECT 1 FROM queen.queues q
                       WHERE q.tenant_id = p_tenant AND q.name = p_queue) THEN
            INSERT INTO queen.queues (tenant_id, name) VALUES (p_tenant, p_queue)
            ON CONFLICT (tenant_id, name) DO NOTHING;
        END IF;
    END IF;
    IF v_bytes <> 0 THEN
        INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (p_tenant, v_bytes);
    END IF;
    IF v_due < now() + make_interval(secs => p_notify_within_ms / 1000.0) THEN
        -- (as schedule_timers: the due instant in epoch microseconds)
        PERFORM pg_notify('queen_timers', ceil(extract(epoch FROM v_due) * 1000000)::bigint::text);
    END IF;
    txn := p_txn;
    message_id := v_id;
    deliver_at := v_due;
END
$$;

CREATE FUNCTION queen.schedule_timer_list(p_tenant integer, p_queues text[], p_keys text[], p_partitions text[], p_txns text[], p_delays bigint[], p_sizes integer[], p_payloads text[], p_zstd boolean[], p_notify_within_ms bigint, p_attempt integer DEFAULT 1) RETURNS TABLE(ord integer, status text, txn text, message_id uuid, deliver_at timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(p_keys), 0);
    v_payloads bytea[];
    v_due timestamptz[];
    v_new_ids uuid[];
    -- The message ids' random bits, drawn once per call (each draw of the server's strong
    -- random source may open /dev/urandom: a tenth of a bundle's cost when drawn per timer);
    -- a timer's id is them with its position XORed into the last bytes, so the ids of one call
    -- differ from each other, and from other calls' by their random bits. Their first eight
    -- bytes (the call's Unix milliseconds, the version, random bits) are written once, as hex.
    v_random bytea := set_bit(set_bit(uuid_send(gen_random_uuid()), 52, 1), 53, 1);
    v_low bigint := ('x' || encode(substring(v_random FROM 9), 'hex'))::bit(64)::bigint;
    v_head text := encode(substring(overlay(v_random
                       PLACING substring(int8send((extract(epoch FROM clock_timestamp())
                                                   * 1000)::bigint) FROM 3)
                       FROM 1 FOR 6) FROM 1 FOR 8), 'hex');
    v_inserted boolean;
    v_notify_before timestamptz;
    v_lock_timeout text;
    v_ords integer[];
    v_status text[];
    v_txns text[];
    v_ids uuid[];
    v_at timestamptz[];
    v_delta bigint;
    v_soonest timestamptz;
    i integer;
BEGIN
    IF p_attempt > 2 THEN
        -- Created and gone again under us twice in a row: a fire is racing us.
        RETURN QUERY SELECT g, 'too_late', NULL::text, NULL::uuid, NULL::timestamptz
                     FROM generate_series(1, n) AS g;
        RETURN;
    END IF;
    IF coalesce(cardinality(p_queues), 0) <> n OR coalesce(cardinality(p_partitions), 0) <> n
       OR coalesce(cardinality(p_txns), 0) <> n OR coalesce(cardinality(p_delays), 0) <> n
       OR coalesce(cardinality(p_sizes), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR coalesce(cardinality(p_zstd), 0) <> n THEN
        RAISE invalid_parameter_value
            USING MESSAGE = 'schedule_timer_list: arrays of unequal lengths';
    END IF;
    -- What timers' foreign key to tenants did per row, once: the tenant must exist, and is not
    -- deleted before this transaction ends (queen.delete_tenants_timers then deletes these).
    PERFORM FROM queen.tenants t WHERE t.tenant_id = p_tenant FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE foreign_key_violation USING MESSAGE = format('tenant %s does not exist', p_tenant);
    END IF;
    -- Each timer's stored bytes, due instant and message id, in input order, and in the same
    -- pass the bytes stored and the soonest instant due within p_notify_within_ms (the bound
    -- computed once). (The delay as a multiple of a millisecond: make_interval(secs => d /
    -- 1000.0) went through numeric, and numeric to float8 through text, at each timer; the
    -- instant is the same. An id's last 16 hex digits need no padding: the top bits of
    -- v_low are the variant's 10, so to_hex writes all 64 bits.)
    v_notify_before := now() + p_notify_within_ms * interval '1 millisecond';
    SELECT array_agg(CASE WHEN u.z THEN decode(u.t, 'base64') ELSE convert_to(u.t, 'UTF8') END),
           array_agg(now() + u.d * interval '1 millisecond'),
           array_agg((v_head || to_hex(v_low # u.o))::uuid),
           sum(u.b),
           min(now() + u.d * interval '1 millisecond')
               FILTER (WHERE now() + u.d * interval '1 millisecond' < v_notify_before)
    INTO v_payloads, v_due, v_new_ids, v_delta, v_soonest
    FROM unnest(p_payloads, p_zstd, p_delays, p_sizes) WITH ORDINALITY AS u(t, z, d, b, o);
    -- In a statement of its own: the next one's snapshot then sees every schedule or cancel of
    -- these names that committed while we waited for their locks.
    PERFORM queen.lock_timer_names(p_tenant, p_queues, p_keys);
    -- New names (the usual bundle): one plain INSERT, with no look-up, sort, join or ON
    -- CONFLICT per timer (the set-based statement below cost twice as much per timer:
    -- bench/results/timer_pg_cost.md). Under the names' locks no other schedule or cancel of
    -- them is under way, so the INSERT's own unique check is the look for a stored name: one
    -- found (committed) fails it whole at once (unique_violation: nothing of it stays; the rows
    -- it had inserted before it are rolled back, a cost only a bundle mixing new and stored
    -- names pays), as does the same name twice in this call, and every timer is left to the
    -- statements below.
    -- A name whose row a sweeper is changing (a claim, a fire, not yet committed) would make
    -- that check wait for the sweeper's commit, where a schedule answers too_late at once
    -- (below): the INSERT waits for no lock longer than lock_timeout's 1 ms (lock_not_available,
    -- the statements below then). A separate look for stored names before the INSERT (a key
    -- probe each) cost PostgreSQL a seventh of a bundle of new names. The locks also order
    -- concurrent inserts of one name: the rows need no sort.
    BEGIN
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '1ms', true);
        INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, message_id,
                                  payload, payload_zstd, payload_bytes, deliver_at, visible_at)
        SELECT p_tenant, u.q, u.k, u.p, u.t, u.m, u.payload, u.zstd, u.b, u.due, u.due
        FROM unnest(p_queues, p_keys, p_partitions, p_txns, v_new_ids, v_payloads,
                    p_zstd, p_sizes, v_due) AS u(q, k, p, t, m, payload, zstd, b, due);
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
        v_inserted := true;
    EXCEPTION WHEN unique_violation OR lock_not_available THEN
        -- (the block's rollback restored lock_timeout)
        v_inserted := false;
    END;
    IF v_inserted THEN
        PERFORM queen.timers_stored(p_tenant, p_queues, v_delta, v_soonest);
        IF p_attempt = 0 THEN
            -- The caller takes the short answer (see above): one row for all of them.
            RETURN QUERY SELECT 0, 'scheduled', NULL::text, (v_head || to_hex(v_low))::uuid,
                                now();
            RETURN;
        END IF;
        RETURN QUERY
        SELECT u.o::integer, 'scheduled', u.t, u.m, u.due
        FROM unnest(p_txns, v_new_ids, v_due) WITH ORDINALITY AS u(t, m, due, o);
        RETURN;
    END IF;

    IF (SELECT count(DISTINCT length(u.q)::text || '/' || u.q || '/' || u.k)
        FROM unnest(p_queues, p_keys) AS u(q, k)) < n THEN
        -- The same timer more than once (requests merged by the broker's batcher): one at a
        -- time, in order, as separate calls would.
        FOR i IN 1..n LOOP
            RETURN QUERY
            SELECT i, s.status, s.txn, s.message_id, s.deliver_at
            FROM queen.schedule_timer_list(p_tenant, p_queues[i:i], p_keys[i:i],
                                           p_partitions[i:i], p_txns[i:i], p_delays[i:i],
                                           p_sizes[i:i], p_payloads[i:i], p_zstd[i:i],
                                           p_notify_within_ms) s;
        END LOOP;
        RETURN;
    END IF;

    -- Some names exist: each timer decided under its row's lock. Every lookup of an existing
    -- timer is a LATERAL probe of the primary key (or a TID scan) that the planner cannot
    -- flatten: with the table's statistics stale (it grew since the last ANALYZE), a join would
    -- be planned as a scan of all the tenant's timers, for every bundle.
    WITH input AS (
        SELECT x.q AS queue, x.k AS timer_key, x.p AS partition, x.t AS txn,
               x.payload, x.zstd, x.b AS bytes, x.ord::integer AS ord, x.due, x.m AS message_id
        FROM unnest(p_queues, p_keys, p_partitions, p_txns, p_sizes, v_payloads, p_zstd,
                    v_due, v_new_ids)
             WITH ORDINALITY AS x(q, k, p, t, b, payload, zstd, due, m, ord)
    ), existing AS (
        SELECT i.ord, t.row_id, t.txn
        FROM input i
        CROSS JOIN LATERAL (
            SELECT x.ctid AS row_id, x.txn FROM queen.timers x
            WHERE x.tenant_id = p_tenant AND x.queue = i.queue AND x.timer_key = i.timer_key
            LIMIT 1  -- (keeps the planner from flattening the probe into a join)
        ) t
    ), locked AS (
        -- SKIP LOCKED: a row locked by a firing sweeper is left alone (too_late below); a row
        -- changed since this statement's snapshot (a sweeper's retry) is too.
        SELECT e.ord, t.row_id, t.txn, t.payload_bytes, t.claimed
        FROM existing e
        CROSS JOIN LATERAL (
            SELECT x.ctid AS row_id, x.txn, x.payload_bytes,
                   x.claim_token IS NOT NULL AND x.visible_at > now() AS claimed
            FROM queen.timers x
            WHERE x.ctid = e.row_id
            FOR UPDATE SKIP LOCKED
        ) t
    ), rescheduled AS (
        -- A reschedule is a new timer under an old name: the failure budget starts again.
        UPDATE queen.timers t
        SET partition = i.partition, txn = i.txn, message_id = i.message_id,
            payload = i.payload, payload_zstd = i.zstd,
            payload_bytes = i.bytes, deliver_at = i.due, visible_at = i.due, attempts = 0,
            last_error = NULL, claim_token = NULL, claimed_by = NULL, updated_at = now()
        FROM locked l
        JOIN input i ON i.ord = l.ord
        WHERE t.ctid = l.row_id AND NOT l.claimed
        RETURNING i.ord, t.message_id, t.deliver_at, i.bytes - l.payload_bytes AS delta
    ), inserted AS (
        INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, message_id,
                                  payload, payload_zstd, payload_bytes, deliver_at, visible_at)
        SELECT p_tenant, i.queue, i.timer_key, i.partition, i.txn, i.message_id,
               i.payload, i.zstd, i.bytes, i.due, i.due
        FROM input i
        WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.ord = i.ord)
        ORDER BY i.queue, i.timer_key  -- one lock order for concurrent bundles
        ON CONFLICT (tenant_id, queue, timer_key) DO NOTHING
        RETURNING queue, timer_key, message_id, deliver_at
    ), answers AS (
        SELECT r.ord, 'rescheduled' AS status, i.txn, r.message_id, r.deliver_at, r.delta
        FROM rescheduled r JOIN input i ON i.ord = r.ord
        UNION ALL
        SELECT i.ord, 'scheduled', i.txn, x.message_id, x.deliver_at, i.bytes
        FROM inserted x JOIN input i ON i.queue = x.queue AND i.timer_key = x.timer_key
        UNION ALL
        SELECT l.ord, 'too_late', l.txn, NULL, NULL, 0 FROM locked l WHERE l.claimed
        UNION ALL
        SELECT e.ord, 'too_late', e.txn, NULL, NULL, 0
        FROM existing e
        WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.ord = e.ord)
    )
    SELECT coalesce(array_agg(a.ord ORDER BY a.ord), '{}'), array_agg(a.status ORDER BY a.ord),
           array_agg(a.txn ORDER BY a.ord), array_agg(a.message_id ORDER BY a.ord),
           array_agg(a.deliver_at ORDER BY a.ord), coalesce(sum(a.delta), 0),
           min(a.deliver_at) FILTER (WHERE a.status <> 'too_late'
                                     AND a.deliver_at < now() + make_interval(
                                         secs => p_notify_within_ms / 1000.0))
    INTO v_ords, v_status, v_txns, v_ids, v_at, v_delta, v_soonest
    FROM answers a;

    PERFORM queen.timers_stored(
        p_tenant,
        ARRAY(SELECT p_queues[a.o] FROM unnest(v_ords, v_status) AS a(o, s)
              WHERE a.s = 'scheduled'),
        v_delta, v_soonest);

    RETURN QUERY
    SELECT a.o, a.s, a.t, a.m, a.at
    FROM unnest(v_ords, v_status, v_txns, v_ids, v_at) AS a(o, s, t, m, at);

    -- A timer created by a concurrent transaction after this statement's snapshot was neither
    -- updated nor inserted here: decide it again with a fresh look. (Rare: looked for only
    -- when an answer is missing, the search being quadratic in the bundle.)
    IF coalesce(array_length(v_ords, 1), 0) = n THEN
        RETURN;
    END IF;
    FOR i IN SELECT g FROM generate_series(1, n) AS g WHERE g <> ALL (v_ords) LOOP
        RETURN QUERY
        SELECT i, s.status, s.txn, s.message_id, s.deliver_at
        FROM queen.schedule_timer_list(p_tenant, p_queues[i:i], p_keys[i:i], p_partitions[i:i],
                                       p_txns[i:i], p_delays[i:i], p_sizes[i:i],
                                       p_payloads[i:i], p_zstd[i:i], p_notify_within_ms,
                                       greatest(p_attempt, 1) + 1) s;
    END LOOP;
END
$$;

CREATE FUNCTION queen.schedule_timers(p_tenant integer, p_timers json, p_notify_within_ms bigint, p_attempt integer DEFAULT 1) RETURNS TABLE(ord integer, status text, txn text, message_id uuid, deliver_at timestamp with time zone)
    LANGUAGE sql
    AS $$
    SELECT s.*
    FROM (SELECT array_agg(x.q ORDER BY x.o) AS q, array_agg(x.k ORDER BY x.o) AS k,
                 array_agg(x.p ORDER BY x.o) AS p, array_agg(x.t ORDER BY x.o) AS t,
                 array_agg(x.d ORDER BY x.o) AS d, array_agg(x.b ORDER BY x.o) AS b,
                 -- (a payload of JSON null comes out of json_to_recordset as SQL NULL)
                 array_agg(coalesce(x.z, coalesce(x.j::text, 'null')) ORDER BY x.o) AS payload,
                 array_agg(x.z IS NOT NULL ORDER BY x.o) AS zstd
          FROM ROWS FROM (json_to_recordset(p_timers)
                          AS (q text, k text, p text, t text, d bigint, b integer, j json,
                              z text))
               WITH ORDINALITY AS x(q, k, p, t, d, b, j, z, o)) a
    CROSS JOIN LATERAL queen.schedule_timer_list(p_tenant, a.q, a.k, a.p, a.t, a.d, a.b,
                                                 a.payload, a.zstd, p_notify_within_ms,
                                                 p_attempt) s
$$;

CREATE TABLE queen.queues (
    queue_id bigint NOT NULL,
    tenant_id integer NOT NULL,
    name text NOT NULL,
    lease_time_s integer DEFAULT 300 NOT NULL,
    retry_limit integer DEFAULT 3 NOT NULL,
    delayed_processing_s integer DEFAULT 0 NOT NULL,
    retention_s integer DEFAULT 0 NOT NULL,
    dead_letter_queue boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    retain_until_consumed boolean DEFAULT false NOT NULL,
    max_size bigint DEFAULT 0 NOT NULL,
    retry_delay_ms integer DEFAULT 0 NOT NULL,
    ttl_s integer DEFAULT 0 NOT NULL,
    completed_retention_s integer DEFAULT 0 NOT NULL,
    retention_enabled boolean DEFAULT true NOT NULL,
    max_wait_s integer DEFAULT 0 NOT NULL,
    window_buffer_s integer DEFAULT 0 NOT NULL,
    encryption_enabled boolean DEFAULT false NOT NULL,
    CONSTRAINT queues_completed_retention_s_check CHECK ((completed_retention_s >= 0)),
    CONSTRAINT queues_delayed_processing_s_check CHECK ((delayed_processing_s >= 0)),
    CONSTRAINT queues_lease_time_s_check CHECK ((lease_time_s > 0)),
    CONSTRAINT queues_max_size_check CHECK ((max_size >= 0)),
    CONSTRAINT queues_max_wait_s_check CHECK ((max_wait_s >= 0)),
    CONSTRAINT queues_retention_s_check CHECK ((retention_s >= 0)),
    CONSTRAINT queues_retry_delay_ms_check CHECK ((retry_delay_ms >= 0)),
    CONSTRAINT queues_retry_limit_check CHECK ((retry_limit >= 0)),
    CONSTRAINT queues_ttl_s_check CHECK ((ttl_s >= 0)),
    CONSTRAINT queues_window_buffer_s_check CHECK ((window_buffer_s >= 0))
);

CREATE FUNCTION queen.segment_droppable(q queen.queues, p_partition uuid, p_last_offset bigint, p_last_created timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_age_s integer := least(nullif(q.retention_s, 0), nullif(q.ttl_s, 0));
    v_consumed boolean := coalesce(
        p_last_offset <= (SELECT min(c.committed) FROM queen.cursors c
                          WHERE c.partition_id = p_partition), false);
BEGIN
    RETURN (q.retention_enabled AND (
            (v_age_s IS NOT NULL
             AND p_last_created <= now() - make_interval(secs => v_age_s)
             AND (NOT q.retain_until_consumed OR v_consumed))
            OR (q.completed_retention_s > 0
                AND p_last_created <= now() - make_interval(secs => q.completed_retention_s)
                AND v_consumed)))
        OR (q.max_wait_s > 0
            AND p_last_created <= now() - make_interval(secs => q.max_wait_s));
END
$$;

COMMENT ON FUNCTION queen.segment_droppable(q queen.queues, p_partition uuid, p_last_offset bigint, p_last_created timestamp with time zone) IS 'Retention''s rule for a run of frames: retentionSeconds/ttl, completedRetentionSeconds, maxWaitTimeSeconds.';

CREATE FUNCTION queen.segments_are_immutable() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'UPDATE' OR TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'sealed segments are immutable (%)', TG_OP
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF EXISTS (SELECT 1 FROM queen.partitions p
               WHERE p.partition_id = OLD.partition_id AND p.log_start <= OLD.last_offset) THEN
        RAISE EXCEPTION 'segment %..% is still retained (log_start has not passed it)',
            OLD.first_offset, OLD.last_offset
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN OLD;
END
$$;

CREATE FUNCTION queen.settle_cursor(p_tenant integer, p_group text, p_partition_id uuid, p_lease uuid, p_from bigint, p_through bigint, OUT tid tid, OUT attempt_offset bigint) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    cur record;
BEGIN
    cur := queen.cursor_for_update(p_tenant, p_partition_id, p_group);
    IF cur.tid IS NULL OR cur.lease_id IS DISTINCT FROM p_lease OR cur.lease_live IS NOT TRUE
       OR cur.leased_to IS DISTINCT FROM p_through OR cur.committed <> p_from - 1
       OR coalesce(cardinality(cur.acked_ahead), 0) > 0 THEN
        RETURN;
    END IF;
    tid := cur.tid;
    attempt_offset := cur.attempt_offset;
END
$$;

CREATE FUNCTION queen.settle_head(p_tenant integer, p_group text, p_partition_id uuid, p_lease uuid, p_from bigint, p_through bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    cur record;
BEGIN
    cur := queen.settle_cursor(p_tenant, p_group, p_partition_id, p_lease, p_from, p_through);
    IF cur.tid IS NULL THEN
        RETURN false;
    END IF;
    PERFORM queen.settle_write(cur.tid, p_partition_id, p_group, p_through);
    RETURN true;
END
$$;

CREATE FUNCTION queen.settle_pop_head(p_tenant integer, p_queue text, p_group text, p_partition_id uuid, p_lease uuid, p_from bigint, p_through bigint, p_pop_partition text, p_batch integer, p_after text) RETURNS TABLE(outcome text, partition_id uuid, partition text, lease_id uuid, lease_expires_at timestamp with time zone, "offset" bigint, transaction_id text, payload jsonb, created_at timestamp with time zone, meta jsonb)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    IF NOT queen.settle_head(p_tenant, p_group, p_partition_id, p_lease, p_from, p_through) THEN
        RETURN QUERY SELECT 'unsettled', NULL::uuid, NULL::text, NULL::uuid,
                            NULL::timestamptz, NULL::bigint, NULL::text, NULL::jsonb,
                            NULL::timestamptz, NULL::jsonb;
        RETURN;
    END IF;

    IF p_batch > 0 THEN
        -- (A new statement: it sees the cursor committed through above.) The queue's long
        -- polls are told unless the pop has leased the same partition again at once.
        RETURN QUERY
        WITH popped AS MATERIALIZED (
            SELECT * FROM queen.pop_head(p_tenant, p_queue, p_group, p_pop_partition, p_batch,
                                         false, p_after)),
        told AS MATERIALIZED (
            SELECT pg_notify('queen_log', p_tenant::text || ':' || p_queue)
            WHERE NOT EXISTS (SELECT 1 FROM popped x
                              WHERE x.outcome = 'messages' AND x.partition_id = p_partition_id))
        SELECT x.* FROM popped x, (SELECT count(*) FROM told) AS forced;
        RETURN;
    END IF;
    PERFORM pg_notify('queen_log', p_tenant::text || ':' || p_queue);
    RETURN QUERY SELECT 'empty', NULL::uuid, NULL::text, NULL::uuid,
                        NULL::timestamptz, NULL::bigint, NULL::text, NULL::jsonb,
                        NULL::timestamptz, NULL::jsonb;
END
$$;

CREATE FUNCTION queen.settle_write(p_tid tid, p_partition_id uuid, p_group text, p_through bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE queen.cursors c
    SET committed = p_through, lease_expires_at = NULL, updated_at = now()
    WHERE c.ctid = p_tid;
    DELETE FROM queen.retries r
    WHERE r.partition_id = p_partition_id AND r.consumer_group = p_group
      AND r."offset" <= p_through;
END
$$;

CREATE FUNCTION queen.sweep_floor() RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN to_timestamp(coalesce(pg_sequence_last_value('queen.timer_sweep_floor'::regclass), 0)
                        / 1000000.0) - interval '1 millisecond';
END
$$;

CREATE FUNCTION queen.sweep_lead_s() RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 0.001::float8 $$;

CREATE FUNCTION queen.sweep_run(p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_not_before double precision, OUT fired_at timestamp with time zone[], OUT fired_tenants integer[], OUT claimed_tenants integer[], OUT claimed_queues text[], OUT claimed_keys text[], OUT claimed_partitions text[], OUT claimed_txns text[], OUT claimed_payloads bytea[], OUT claimed_zstd boolean[], OUT claimed_bytes integer[], OUT claimed_deliver_at timestamp with time zone[], OUT claimed_attempts integer[], OUT claimed_due_at timestamp with time zone[], OUT next_tenant integer, OUT next_queue text, OUT next_partition text, OUT next_due double precision, OUT db_now double precision) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_now timestamptz;
    v_floor timestamptz;
    v_took record;  -- queen.sweep_take's answer
    -- Set (tenant:queue) only by a new connection's warm-up (queen_trio/timers/warmup.py).
    v_warm text := current_setting('queen.warm_up_queue', true);
BEGIN
    v_now := clock_timestamp();
    IF p_not_before IS NOT NULL THEN
        v_now := queen.wait_until(p_not_before - queen.sweep_lead_s());
        -- The instant itself, unless it is past (then now) or the wait was cut short (a far
        -- not_before: then only a lead's worth ahead of the clock).
        v_now := greatest(v_now, least(to_timestamp(p_not_before),
                                       v_now + make_interval(secs => queen.sweep_lead_s())));
    END IF;
    -- (An assignment, not PERFORM: a PERFORM is a query the executor starts and ends, an
    -- assignment's expression is evaluated without one.) The floor it answers is where the
    -- fire's scan and the clock row's start (nothing is pending below it, and it is read
    -- once, not again by each).
    IF v_warm IS NULL OR v_warm = '' THEN
        v_floor := queen.advance_sweep_floor();
    ELSE
        -- The warm-up, in a transaction it rolls back: its sweeps take what is due between
        -- the first and the last of its own timers (scheduled by one statement: microseconds
        -- apart), and never move the floor. A floor set by a transaction that deleted rows it
        -- then put back would stand above them, and no sweep would see them again.
        SELECT min(t.visible_at), max(t.visible_at) INTO v_floor, v_now
        FROM queen.timers t
        WHERE t.tenant_id = split_part(v_warm, ':', 1)::integer
          AND t.queue = substr(v_warm, strpos(v_warm, ':') + 1);
    END IF;
    BEGIN
        -- (Assigned only once the function has returned: if it raises, v_took is untouched.)
        v_took := queen.sweep_take(p_token, p_broker, p_batch, p_lease_ms, p_max_payload,
                                   p_fire, v_now, v_floor);
    EXCEPTION WHEN OTHERS THEN
        -- Trouble of the database itself (connection, serialization failure or deadlock,
        -- resources, an operator, a read-only server, a lock timeout): the cycle fails, to be
        -- tried again, spending no attempt (queen_trio/db/transient.py).
        IF left(SQLSTATE, 2) IN ('08', '40', '53', '57', '58')
           OR SQLSTATE IN ('25006', '55P03') THEN
            RAISE;
        END IF;
        -- Anything else is a row that cannot become a frame: a payload jsonb refuses (NaN,
        -- a \u0000 escape, bytes that are not UTF-8), a trigger's error. The block's locks,
        -- deletes and frames are gone; claim every due row for the broker, which fires them
        -- one by one if the batch fails again, and only the rows at fault spend an attempt.
        v_took := queen.sweep_take(p_token, p_broker, p_batch, p_lease_ms, p_max_payload,
                                   false, v_now, v_floor);
    END;
    fired_at := v_took.fired_at;
    fired_tenants := v_took.fired_tenants;
    IF v_took.claimed_due_at IS NOT NULL THEN
        claimed_tenants := v_took.claimed_tenants;
        claimed_queues := v_took.claimed_queues;
        claimed_keys := v_took.claimed_keys;
        claimed_partitions := v_took.claimed_partitions;
        claimed_txns := v_took.claimed_txns;
        claimed_payloads := v_took.claimed_payloads;
        claimed_zstd := v_took.claimed_zstd;
        claimed_bytes := v_took.claimed_bytes;
        claimed_deliver_at := v_took.claimed_deliver_at;
        claimed_attempts := v_took.claimed_attempts;
        claimed_due_at := v_took.claimed_due_at;
    END IF;
    -- Nothing it took was due later than v_now: return (then commit) no earlier than that.
    IF p_not_before IS NOT NULL THEN  -- (else v_now is the clock read at the start)
        v_now := queen.wait_until(extract(epoch FROM v_now)::float8);
    END IF;

    -- The clock row: the earliest timer left (when, and where it will land: the sweeper tells
    -- that queue's parked pops before the cycle that fires it, with no look-up of its own).
    -- (No timer left: the SELECT sets them to NULL.)
    SELECT t.tenant_id, t.queue, t.partition, extract(epoch FROM t.visible_at)::float8
    INTO next_tenant, next_queue, next_partition, next_due
    FROM queen.timers t
    WHERE t.visible_at >= (SELECT v_floor)
    ORDER BY t.visible_at
    LIMIT 1;
    db_now := extract(epoch FROM clock_timestamp())::float8;
END
$$;

CREATE FUNCTION queen.sweep_settle_and_pop(p_lock_tenant integer, p_lock_queue text, p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_not_before double precision, p_pop_group text, p_pop_partition text, p_pop_batch integer, p_settle_partition uuid, p_settle_lease uuid, p_settle_from bigint, p_settle_through bigint, p_after text, p_ack_commit text) RETURNS TABLE(fired boolean, tenant_id integer, queue text, timer_key text, partition text, txn text, payload bytea, payload_zstd boolean, payload_bytes integer, deliver_at timestamp with time zone, attempts integer, due_at timestamp with time zone, next_due double precision, db_now double precision, popped jsonb)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_commit text := current_setting('synchronous_commit');
    v_rows jsonb;
    v_sw record;  -- queen.sweep_run's answer
    v_i integer;
    v_pop record;  -- queen.pop_head_take's answer
    v_outcome text;  -- the pop's outcome, and how many rows it answered
    v_count integer;
    v_settled boolean := true;
    v_drained boolean := false;
    v_look float8;
    v_done boolean;
    v_set text;
BEGIN
    -- (Assignments, not PERFORM: evaluated without starting the executor, as a PERFORM's
    -- query is.)
    v_done := pg_try_advisory_xact_lock(1363170306, queen.fire_lock_key(p_lock_tenant,
                                                                         p_lock_queue));
    -- The sweep's rows, as queen.sweep_timers answers them, from queen.sweep_run's answer
    -- (not through sweep_timers: one set-returning layer less).
    v_sw := queen.sweep_run(p_token, p_broker, p_batch, p_lease_ms, p_max_payload, p_fire,
                            p_not_before);
    -- (A row per fire by RETURN NEXT of this function's output variables: a handful of
    -- expressions, no query to start.)
    FOR v_i IN 1..coalesce(cardinality(v_sw.fired_at), 0) LOOP
        fired := true;
        tenant_id := v_sw.fired_tenants[v_i];
        deliver_at := v_sw.fired_at[v_i];
        RETURN NEXT;
    END LOOP;
    fired := NULL;
    deliver_at := NULL;
    IF v_sw.claimed_due_at IS NOT NULL THEN
        RETURN QUERY
        SELECT false, c.*, NULL::float8, NULL::float8, NULL::jsonb
        FROM unnest(v_sw.claimed_tenants, v_sw.claimed_queues, v_sw.claimed_keys,
                    v_sw.claimed_partitions, v_sw.claimed_txns, v_sw.claimed_payloads,
                    v_sw.claimed_zstd, v_sw.claimed_bytes, v_sw.claimed_deliver_at,
                    v_sw.claimed_attempts, v_sw.claimed_due_at) AS c;
    END IF;
    -- The clock row (this function's output variables, NULL until here; RETURN NEXT).
    tenant_id := v_sw.next_tenant;
    queue := v_sw.next_queue;
    partition := v_sw.next_partition;
    next_due := v_sw.next_due;
    db_now := v_sw.db_now;
    RETURN NEXT;
    tenant_id := NULL;
    queue := NULL;
    partition := NULL;
    next_due := NULL;
    IF p_settle_partition IS NOT NULL AND p_pop_batch <= 0 THEN
        -- (No pop asked for: queen.settle_pop_head's own answer, then the pop alone if the
        -- settlement was not applied.)
        SELECT coalesce(jsonb_agg(to_jsonb(p)), '[]') INTO v_rows
        FROM queen.settle_pop_head(p_lock_tenant, p_lock_queue, p_pop_group,
                                   p_settle_partition, p_settle_lease, p_settle_from,
                                   p_settle_through, p_pop_partition, p_pop_batch,
                                   p_after) AS p;
        IF v_rows->0->>'outcome' = 'unsettled' THEN
            v_settled := false;
            SELECT coalesce(jsonb_agg(to_jsonb(p)), '[]') INTO v_rows
            FROM queen.pop_head(p_lock_tenant, p_lock_queue, p_pop_group, p_pop_partition,
                                p_pop_batch, false, p_after) AS p;
        END IF;
        v_outcome := v_rows->0->>'outcome';
        v_count := jsonb_array_length(v_rows);
    ELSE
        -- queen.settle_pop_head's two steps, not through it: the settlement, then the pop,
        -- whose rows are what settle_pop_head answers after a settlement (its NOTIFY of the
        -- queue is sent below whatever happens); both by queen.pop_head_take, which writes
        -- the settlement in the pop's lease UPDATE when the pop takes that partition again,
        -- and answers the rows' JSON (p_rows) as queen.pop_head's rows read by to_jsonb, the
        -- same keys and values, made by its read of the frames (not read through pop_head: a
        -- layer of set-returning function, its rows materialised, and a query of its own).
        v_pop := queen.pop_head_take(p_lock_tenant, p_lock_queue, p_pop_group,
                                     p_pop_partition, p_pop_batch, false, p_after,
                                     p_settle_partition, p_settle_lease, p_settle_from,
                                     p_settle_through, true);
        v_settled := coalesce(v_pop.settled, true);  -- (nothing to settle: the pop alone)
        v_outcome := v_pop.outcome;
        IF v_outcome = 'messages' THEN
            v_count := v_pop.taken;
            v_rows := v_pop.json_rows;
        ELSE
            v_rows := jsonb_build_array(jsonb_build_object(
                'outcome', v_outcome, 'partition_id', NULL, 'partition', NULL,
                'lease_id', NULL, 'lease_expires_at', NULL, 'offset', NULL,
                'transaction_id', NULL, 'payload', NULL, 'created_at', NULL, 'meta', NULL));
        END IF;
    END IF;
    IF v_outcome = 'messages' AND v_count < p_pop_batch THEN
        v_look := queen.next_look(p_lock_tenant, p_lock_queue, p_pop_group, p_pop_partition);
        v_drained := v_look IS NULL OR v_look > 0;
    END IF;
    v_done := pg_notify('queen_log', p_lock_tenant::text || ':' || p_lock_queue) IS NULL;
    IF (p_settle_partition IS NOT NULL AND v_settled) OR v_outcome = 'messages' THEN
        -- The acknowledgement and the pop's lease commit as the broker's settlements and pops
        -- do (p_ack_commit, the level of both under QUEEN_POP_COMMIT: 'off' for async, NULL
        -- as the server is configured), and so does the fire they share the transaction with.
        v_set := set_config('synchronous_commit', coalesce(p_ack_commit, v_commit), true);
    END IF;
    -- The last row: this function's output variables, NULL again but these two, handed back
    -- by RETURN NEXT (no query to start for it, as RETURN QUERY took).
    db_now := extract(epoch FROM clock_timestamp())::float8;
    popped := jsonb_build_object('rows', v_rows, 'settled', v_settled, 'pid', pg_backend_pid(),
                                 'drained', v_drained);
    RETURN NEXT;
END
$$;

CREATE FUNCTION queen.sweep_take(p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_now timestamp with time zone, p_floor timestamp with time zone, OUT fired_at timestamp with time zone[], OUT fired_tenants integer[], OUT claimed_tenants integer[], OUT claimed_queues text[], OUT claimed_keys text[], OUT claimed_partitions text[], OUT claimed_txns text[], OUT claimed_payloads bytea[], OUT claimed_zstd boolean[], OUT claimed_bytes integer[], OUT claimed_deliver_at timestamp with time zone[], OUT claimed_attempts integer[], OUT claimed_due_at timestamp with time zone[]) RETURNS record
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_due timestamptz[];
    v_ctids tid[];
    v_direct integer;
    v_appended integer;
    v_floor timestamptz := p_floor;  -- nothing is pending below it (queen.sweep_run)
    v_told boolean;
    v_directs boolean[];  -- whether each taken row can be fired here, in the order of expiry
    -- Each taken row's destination, in the order of expiry (the one-partition fire below).
    v_tenants integer[];
    v_queues text[];
    v_partitions text[];
    v_partition uuid;
    v_next bigint;
    v_stamp timestamptz;
    v_delta bigint;
BEGIN
    fired_at := '{}';
    fired_tenants := '{}';  -- whose timer each fire was (a tenant's own figures)
    -- In the order of expiry: deliver_at, the instant asked for. (A timer scheduled with a
    -- delay in the past has its visible_at raised to the clock of its write, not its due
    -- instant: queen.timers_visible_above_floor.)
    -- (The arrays are aggregated from rows already in that order, not each sorted by its own
    -- ORDER BY: one sort. The leading run PostgreSQL fires itself ends before the first row
    -- it cannot, found in the array of those flags.)
    SELECT coalesce(array_agg(d.deliver_at), '{}'), coalesce(array_agg(d.ctid), '{}'),
           array_agg(d.direct), array_agg(d.tenant_id), array_agg(d.queue),
           array_agg(d.partition)
    INTO v_due, v_ctids, v_directs, v_tenants, v_queues, v_partitions
    FROM (
        SELECT t.tenant_id, t.queue, t.partition, t.deliver_at, t.ctid,
               p_fire AND NOT t.payload_zstd
                   AND t.payload_bytes <= least(p_max_payload, tn.max_message_bytes) AS direct
        FROM (
            -- (ctid: the locked rows are then deleted or claimed by a TID scan, which no
            -- planner estimate can turn into a scan of the whole table.)
            SELECT due.ctid, due.tenant_id, due.queue, due.timer_key, due.partition,
                   due.deliver_at, due.payload_zstd, due.payload_bytes
            FROM queen.timers due
            WHERE due.visible_at >= (SELECT v_floor) AND due.visible_at <= (SELECT p_now)
            ORDER BY due.visible_at
            LIMIT p_batch
            FOR UPDATE SKIP LOCKED
        ) t
        JOIN queen.tenants tn ON tn.tenant_id = t.tenant_id
        ORDER BY t.deliver_at, t.tenant_id, t.queue, t.timer_key
    ) d;
    v_direct := coalesce(array_position(v_directs, false) - 1, cardinality(v_ctids));

    -- The usual fire under a steady flow: a few timers, all bound for one partition that
    -- exists. What queen.append_timer_frames does for any batch, done here in three plain
    -- statements: that partition's row locked (and its next_offset read) once, the rows
    -- deleted and their frames inserted in one statement, the partition's next_offset moved.
    -- The set-based append (destinations found, counted, locked and read again, offsets by a
    -- window, a CTE of five steps) cost PostgreSQL most of a small sweep's time in executor
    -- start-up alone (bench/results/pgcycle32.md). Its rules hold here as they are: one lock,
    -- so no order to keep; dense offsets from next_offset in the order of expiry (a row's
    -- place in v_ctids, which is that order); one createdAt read under the lock, never before
    -- a timer's deliverAt; the bytes' move recorded; the queue's long polls woken. A partition
    -- not there yet (its first frames) or a batch bound for several goes through
    -- queen.append_timer_frames, as does a large batch (array_position below is quadratic).
    -- (The partition's next_offset is moved in the statement that appends: one statement
    -- less to start per cycle.)
    IF v_direct BETWEEN 1 AND 64
       AND v_tenants[1] = ALL (v_tenants[1:v_direct]) AND v_queues[1] = ALL (v_queues[1:v_direct])
       AND v_partitions[1] = ALL (v_partitions[1:v_direct]) THEN
        SELECT p.partition_id, p.next_offset INTO v_partition, v_next
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.queue_id
        WHERE q.tenant_id = v_tenants[1] AND q.name = v_queues[1] AND p.name = v_partitions[1]
        FOR NO KEY UPDATE OF p;
    END IF;
    IF v_partition IS NOT NULL THEN
        v_stamp := clock_timestamp();
        WITH gone AS (
            DELETE FROM queen.timers t
            WHERE t.ctid = ANY (v_ctids[1:v_direct])
            RETURNING t.ctid AS row_id, t.tenant_id, t.timer_key, t.txn, t.message_id,
                      convert_from(t.payload, 'UTF8') AS text, t.payload_bytes, t.deliver_at
        ), appended AS (
            INSERT INTO queen.frames (partition_id, "offset", tenant_id, transaction_id, payload,
                                      size_bytes, created_at, meta)
            SELECT v_partition, v_next - 1 + array_position(v_ctids, g.row_id), g.tenant_id,
                   g.txn, g.text::jsonb, octet_length(g.text), greatest(v_stamp, g.deliver_at),
                   queen.timer_frame_meta(g.message_id, g.timer_key, g.deliver_at)
            FROM gone g
        ), bumped AS (
            UPDATE queen.partitions p SET next_offset = p.next_offset + (SELECT count(*) FROM gone)
            WHERE p.partition_id = v_partition
        )
        SELECT count(*), sum(octet_length(g.text) - g.payload_bytes)
        INTO v_appended, v_delta
        FROM gone g;
        IF v_appended <> v_direct THEN  -- (the rows are ours, locked: never)
            RAISE EXCEPTION 'a fire deleted % of its % locked timers', v_appended, v_direct
                USING ERRCODE = 'serialization_failure';
        END IF;
        IF v_delta <> 0 THEN
            -- The bytes move from the timer rows to the log: usually a change of zero.
            INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (v_tenants[1], v_delta);
        END IF;
        -- Long-polling pops of the queue, on every broker; delivered only on commit. (An
        -- assignment, not PERFORM: a PERFORM is a query the executor starts and ends; an
        -- assignment's expression is evaluated without one.)
        v_told := pg_notify('queen_log', v_tenants[1] || ':' || v_queues[1]) IS NULL;
        fired_at := v_due[1:v_direct];
        fired_tenants := v_tenants[1:v_direct];
    ELSIF v_direct > 0 THEN
        -- ctid = ANY: a TID scan of just these rows whatever the planner estimates (joined
        -- to an unnest of the ctids, PostgreSQL 18 hashed the whole table every sweep).
        -- The arrays are built from one sorted input, in the order of expiry (the order
        -- the rows were taken in, above), not sorted once per array_agg: eleven sorts of
        -- the batch, payloads included, were a third of a fire's time on PostgreSQL 15.
        WITH gone AS (
            DELETE FROM queen.timers t
            WHERE t.ctid = ANY (v_ctids[1:v_direct])
            RETURNING t.tenant_id, t.queue, t.timer_key, t.partition, t.txn,
                      t.message_id, convert_from(t.payload, 'UTF8') AS text, t.payload_bytes,
                      t.deliver_at
        )
        SELECT array_agg(g.deliver_at), array_agg(g.tenant_id),
               queen.append_timer_frames(
                   array_agg(g.tenant_id), array_agg(g.queue), array_agg(g.timer_key),
                   array_agg(g.partition), array_agg(g.txn), array_agg(g.message_id),
                   array_agg(g.text), array_agg(g.payload_bytes), array_agg(g.deliver_at))
        INTO fired_at, fired_tenants, v_appended
        FROM (SELECT * FROM gone
              ORDER BY gone.deliver_at, gone.tenant_id, gone.queue, gone.timer_key) g;
    ELSE
        -- Only claims (or nothing): losing them in a crash is harmless, so don't wait for
        -- the disk. A fire keeps the synchronous commit. (An assignment, as above.)
        v_told := set_config('synchronous_commit', 'off', true) IS NULL;
    END IF;

    IF v_direct < cardinality(v_ctids) THEN
        WITH claimed AS (
            UPDATE queen.timers t
            SET visible_at = p_now + make_interval(secs => p_lease_ms / 1000.0),
                claim_token = p_token, claimed_by = p_broker
            FROM unnest(v_ctids[v_direct + 1:], v_due[v_direct + 1:]) AS k(row_id, due_at)
            WHERE t.ctid = k.row_id
            RETURNING t.tenant_id, t.queue, t.timer_key, t.partition, t.txn, t.payload,
                      t.payload_zstd, t.payload_bytes, t.deliver_at, t.attempts, k.due_at
        )
        SELECT array_agg(c.tenant_id), array_agg(c.queue), array_agg(c.timer_key),
               array_agg(c.partition), array_agg(c.txn), array_agg(c.payload),
               array_agg(c.payload_zstd), array_agg(c.payload_bytes), array_agg(c.deliver_at),
               array_agg(c.attempts), array_agg(c.due_at)
        INTO claimed_tenants, claimed_queues, claimed_keys, claimed_partitions, claimed_txns,
             claimed_payloads, claimed_zstd, claimed_bytes, claimed_deliver_at,
             claimed_attempts, claimed_due_at
        FROM claimed c;
    END IF;
END
$$;

CREATE FUNCTION queen.sweep_timers(p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_not_before double precision) RETURNS TABLE(fired boolean, tenant_id integer, queue text, timer_key text, partition text, txn text, payload bytea, payload_zstd boolean, payload_bytes integer, deliver_at timestamp with time zone, attempts integer, due_at timestamp with time zone, next_due double precision, db_now double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    r record;
BEGIN
    r := queen.sweep_run(p_token, p_broker, p_batch, p_lease_ms, p_max_payload, p_fire,
                         p_not_before);
    -- One row per fire, one per claim, then the clock row (RETURN NEXT: no query for it).
    IF cardinality(r.fired_at) > 0 THEN
        RETURN QUERY
        SELECT true, f.tenant, NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea,
               NULL::boolean, NULL::integer, f.at, NULL::integer, NULL::timestamptz,
               NULL::float8, NULL::float8
        FROM unnest(r.fired_at, r.fired_tenants) AS f(at, tenant);
    END IF;
    IF r.claimed_due_at IS NOT NULL THEN
        RETURN QUERY
        SELECT false, c.*, NULL::float8, NULL::float8
        FROM unnest(r.claimed_tenants, r.claimed_queues, r.claimed_keys, r.claimed_partitions,
                    r.claimed_txns, r.claimed_payloads, r.claimed_zstd, r.claimed_bytes,
                    r.claimed_deliver_at, r.claimed_attempts, r.claimed_due_at) AS c;
    END IF;
    tenant_id := r.next_tenant;
    queue := r.next_queue;
    partition := r.next_partition;
    next_due := r.next_due;
    db_now := r.db_now;
    RETURN NEXT;
END
$$;

CREATE FUNCTION queen.sweep_timers_and_pop(p_lock_tenant integer, p_lock_queue text, p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_not_before double precision, p_pop_group text, p_pop_partition text, p_pop_batch integer, p_pop_auto_ack boolean, p_pop_commit text) RETURNS TABLE(fired boolean, tenant_id integer, queue text, timer_key text, partition text, txn text, payload bytea, payload_zstd boolean, payload_bytes integer, deliver_at timestamp with time zone, attempts integer, due_at timestamp with time zone, next_due double precision, db_now double precision, popped jsonb)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_commit text := current_setting('synchronous_commit');
    v_rows jsonb;
BEGIN
    -- queen.sweep_timers_for's lock, taken here rather than through it: one set-returning
    -- layer less (each copies the sweep's rows once more), on most cycles under a steady flow.
    IF p_lock_queue IS NOT NULL THEN
        PERFORM pg_try_advisory_xact_lock(1363170306, queen.fire_lock_key(p_lock_tenant,
                                                                           p_lock_queue));
    END IF;
    RETURN QUERY SELECT s.*, NULL::jsonb
                 FROM queen.sweep_timers(p_token, p_broker, p_batch, p_lease_ms, p_max_payload,
                                         p_fire, p_not_before) AS s;
    SELECT coalesce(jsonb_agg(to_jsonb(p)), '[]') INTO v_rows
    FROM queen.pop_head(p_lock_tenant, p_lock_queue, p_pop_group, p_pop_partition,
                        p_pop_batch, p_pop_auto_ack, NULL::text) AS p;
    IF v_rows->0->>'outcome' = 'messages' THEN
        -- The pop's lease (or its autoAck cursor move) commits as the broker's pops do
        -- (p_pop_commit: 'off' under QUEEN_POP_COMMIT=async, NULL as the server is
        -- configured), and so does the fire it shares the transaction with.
        v_commit := set_config('synchronous_commit', coalesce(p_pop_commit, v_commit), true);
    END IF;
    RETURN QUERY
    SELECT NULL::boolean, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::bytea, NULL::boolean, NULL::integer, NULL::timestamptz, NULL::integer,
           NULL::timestamptz, NULL::float8, extract(epoch FROM clock_timestamp())::float8,
           v_rows;
END
$$;

CREATE FUNCTION queen.sweep_timers_for(p_lock_tenant integer, p_lock_queue text, p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer, p_fire boolean, p_not_before double precision) RETURNS TABLE(fired boolean, tenant_id integer, queue text, timer_key text, partition text, txn text, payload bytea, payload_zstd boolean, payload_bytes integer, deliver_at timestamp with time zone, attempts integer, due_at timestamp with time zone, next_due double precision, db_now double precision)
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_lock_queue IS NOT NULL THEN
        -- Several brokers may announce the same fire: the first sweep holds the lock, the
        -- others go on without it (they find the timer taken).
        PERFORM pg_try_advisory_xact_lock(1363170306, queen.fire_lock_key(p_lock_tenant,
                                                                           p_lock_queue));
    END IF;
    RETURN QUERY SELECT * FROM queen.sweep_timers(p_token, p_broker, p_batch, p_lease_ms,
                                                  p_max_payload, p_fire, p_not_before);
END
$$;

CREATE FUNCTION queen.take_partitions(p_tenant integer, p_queues text[], p_names text[]) RETURNS TABLE(partition_id uuid, queue text, name text, next_offset bigint, queue_id bigint, max_size bigint, encryption_enabled boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_found integer;
BEGIN
    RETURN QUERY SELECT * FROM queen.lock_partitions(p_tenant, p_queues, p_names);
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found = cardinality(p_names) THEN
        RETURN;
    END IF;
    -- (v_found is 0 here: all or nothing.) A new partition of an existing queue needs one
    -- statement; only a missing queue two.
    IF queen.ensure_partitions(p_tenant, p_queues, p_names) < cardinality(p_names) THEN
        PERFORM queen.ensure_queues(
            p_tenant, ARRAY(SELECT DISTINCT q FROM unnest(p_queues) AS q ORDER BY 1));
        PERFORM queen.ensure_partitions(p_tenant, p_queues, p_names);
    END IF;
    RETURN QUERY SELECT * FROM queen.lock_partitions(p_tenant, p_queues, p_names);
END
$$;

CREATE FUNCTION queen.timer_frame_meta(p_message_id uuid, p_key text, p_deliver_at timestamp with time zone) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object('messageId', p_message_id, 'timer', jsonb_build_object(
        'key', p_key,
        'deliverAt', to_char(p_deliver_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
$$;

CREATE FUNCTION queen.timer_name_hash(p_tenant integer, p_queue text, p_key text) RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT hashtext(p_tenant::text || '/' || length(p_queue)::text || '/' || p_queue || '/' || p_key)
$$;

CREATE FUNCTION queen.timers_stored(p_tenant integer, p_queues text[], p_delta bigint, p_soonest timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO queen.queues (tenant_id, name)
    SELECT p_tenant, d.name
    FROM (SELECT DISTINCT u.q AS name FROM unnest(p_queues) AS u(q)) AS d
    WHERE NOT EXISTS (SELECT 1 FROM queen.queues q
                      WHERE q.tenant_id = p_tenant AND q.name = d.name)
    ON CONFLICT (tenant_id, name) DO NOTHING;
    IF p_delta <> 0 THEN
        INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (p_tenant, p_delta);
    END IF;
    IF p_soonest IS NOT NULL THEN
        PERFORM pg_notify('queen_timers',
                          ceil(extract(epoch FROM p_soonest) * 1000000)::bigint::text);
    END IF;
END
$$;

CREATE FUNCTION queen.timers_visible_above_floor() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_current_xact_id();
    NEW.visible_at := greatest(NEW.visible_at, clock_timestamp());
    RETURN NEW;
END
$$;

CREATE FUNCTION queen.wait_until(p_epoch double precision) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
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
$$;

CREATE TABLE queen.cursors (
    partition_id uuid NOT NULL,
    consumer_group text NOT NULL,
    tenant_id integer NOT NULL,
    committed bigint NOT NULL,
    acked_ahead bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    lease_id uuid,
    lease_expires_at timestamp with time zone,
    leased_to bigint,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    retry_at timestamp with time zone,
    attempt_offset bigint,
    attempt_count integer DEFAULT 0 NOT NULL
)
WITH (fillfactor='50');

CREATE TABLE queen.dead_letters (
    dead_letter_id bigint NOT NULL,
    tenant_id integer NOT NULL,
    queue_id bigint NOT NULL,
    partition_id uuid,
    consumer_group text NOT NULL,
    "offset" bigint,
    transaction_id text NOT NULL,
    payload jsonb NOT NULL,
    size_bytes integer DEFAULT 0 NOT NULL,
    frame_created_at timestamp with time zone,
    retry_count integer DEFAULT 0 NOT NULL,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    replayed_at timestamp with time zone,
    replay_transaction_id text
);
ALTER TABLE ONLY queen.dead_letters ALTER COLUMN payload SET STATISTICS 0;

ALTER TABLE queen.dead_letters ALTER COLUMN dead_letter_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queen.dead_letters_dead_letter_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queen.frames (
    partition_id uuid NOT NULL,
    "offset" bigint NOT NULL,
    tenant_id integer NOT NULL,
    transaction_id text NOT NULL,
    payload jsonb NOT NULL,
    size_bytes integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    meta jsonb
);
ALTER TABLE ONLY queen.frames ALTER COLUMN payload SET STATISTICS 0;
ALTER TABLE ONLY queen.frames ALTER COLUMN meta SET STATISTICS 0;

CREATE TABLE queen.group_policies (
    tenant_id integer NOT NULL,
    queue text NOT NULL,
    consumer_group text NOT NULL,
    conflation boolean NOT NULL,
    registered_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE queen.group_subscriptions (
    tenant_id integer NOT NULL,
    queue text NOT NULL,
    consumer_group text NOT NULL,
    subscribed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE TABLE queen.kv (
    tenant_id integer NOT NULL,
    namespace text NOT NULL COLLATE pg_catalog."C",
    key text NOT NULL COLLATE pg_catalog."C",
    value jsonb NOT NULL,
    size_bytes integer NOT NULL,
    expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    version bigint NOT NULL
);
ALTER TABLE ONLY queen.kv ALTER COLUMN value SET STATISTICS 0;

CREATE SEQUENCE queen.kv_version_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

CREATE TABLE queen.partitions (
    partition_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id integer NOT NULL,
    queue_id bigint NOT NULL,
    name text NOT NULL,
    next_offset bigint DEFAULT 0 NOT NULL,
    log_start bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE queen.queues ALTER COLUMN queue_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queen.queues_queue_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queen.retries (
    partition_id uuid NOT NULL,
    consumer_group text NOT NULL,
    "offset" bigint NOT NULL,
    tenant_id integer NOT NULL,
    retry_count integer NOT NULL,
    last_error text
);

CREATE TABLE queen.runtime_switches (
    name text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT runtime_switches_name_check CHECK ((name = ANY (ARRAY['kv_enabled'::text, 'timers_schedule_enabled'::text, 'timers_fire_enabled'::text])))
);

CREATE TABLE queen.schema_functions (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE queen.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE queen.segments (
    partition_id uuid NOT NULL,
    first_offset bigint NOT NULL,
    last_offset bigint NOT NULL,
    tenant_id integer NOT NULL,
    frame_count integer NOT NULL,
    raw_bytes bigint NOT NULL,
    stored_bytes integer NOT NULL,
    first_created_at timestamp with time zone NOT NULL,
    last_created_at timestamp with time zone NOT NULL,
    transaction_ids text[] NOT NULL,
    transaction_hashes bigint[] NOT NULL,
    codec smallint DEFAULT 1 NOT NULL,
    data bytea NOT NULL,
    sealed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT segments_check CHECK ((frame_count = ((last_offset - first_offset) + 1))),
    CONSTRAINT segments_check1 CHECK ((cardinality(transaction_ids) = frame_count))
);
ALTER TABLE ONLY queen.segments ALTER COLUMN data SET STATISTICS 0;
ALTER TABLE ONLY queen.segments ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE queen.tenant_tokens (
    token_id bigint NOT NULL,
    tenant_id integer NOT NULL,
    prefix text NOT NULL,
    salt bytea NOT NULL,
    hash bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone
);

ALTER TABLE queen.tenant_tokens ALTER COLUMN token_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queen.tenant_tokens_token_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queen.tenant_usage (
    tenant_id integer NOT NULL,
    stored_bytes bigint DEFAULT 0 NOT NULL
);

CREATE TABLE queen.tenants (
    tenant_id integer NOT NULL,
    name text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    max_message_bytes integer,
    max_stored_bytes bigint,
    requests_per_second integer,
    plan_updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenants_max_message_bytes_check CHECK ((max_message_bytes >= 1)),
    CONSTRAINT tenants_max_stored_bytes_check CHECK ((max_stored_bytes >= 0)),
    CONSTRAINT tenants_name_check CHECK ((name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'::text)),
    CONSTRAINT tenants_requests_per_second_check CHECK ((requests_per_second >= 1))
);

ALTER TABLE queen.tenants ALTER COLUMN tenant_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queen.tenants_tenant_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE SEQUENCE queen.timer_sweep_floor
    START WITH 0
    INCREMENT BY 1
    MINVALUE 0
    NO MAXVALUE
    CACHE 1;

CREATE TABLE queen.timers (
    tenant_id integer NOT NULL,
    queue text NOT NULL,
    timer_key text NOT NULL,
    partition text NOT NULL,
    txn text NOT NULL,
    payload bytea NOT NULL,
    payload_bytes integer NOT NULL,
    deliver_at timestamp with time zone NOT NULL,
    visible_at timestamp with time zone NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    claim_token uuid,
    claimed_by text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    payload_zstd boolean DEFAULT true NOT NULL,
    message_id uuid DEFAULT gen_random_uuid() NOT NULL
);
ALTER TABLE ONLY queen.timers ALTER COLUMN payload SET STATISTICS 0;

COMMENT ON COLUMN queen.timers.payload IS 'the payload''s compact JSON text, zstd-compressed when payload_zstd';

CREATE TABLE queen.usage_deltas (
    tenant_id integer NOT NULL,
    bytes bigint NOT NULL
);

ALTER TABLE ONLY queen.cursors
    ADD CONSTRAINT cursors_pkey PRIMARY KEY (partition_id, consumer_group);

ALTER TABLE ONLY queen.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (dead_letter_id);

ALTER TABLE ONLY queen.frames
    ADD CONSTRAINT frames_pkey PRIMARY KEY (partition_id, "offset");

ALTER TABLE ONLY queen.group_policies
    ADD CONSTRAINT group_policies_pkey PRIMARY KEY (tenant_id, queue, consumer_group);

ALTER TABLE ONLY queen.group_subscriptions
    ADD CONSTRAINT group_subscriptions_pkey PRIMARY KEY (tenant_id, queue, consumer_group);

ALTER TABLE ONLY queen.kv
    ADD CONSTRAINT kv_pkey PRIMARY KEY (tenant_id, namespace, key);

ALTER TABLE ONLY queen.partitions
    ADD CONSTRAINT partitions_pkey PRIMARY KEY (partition_id);

ALTER TABLE ONLY queen.partitions
    ADD CONSTRAINT partitions_queue_id_name_key UNIQUE (queue_id, name);

ALTER TABLE ONLY queen.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (queue_id);

ALTER TABLE ONLY queen.queues
    ADD CONSTRAINT queues_tenant_id_name_key UNIQUE (tenant_id, name);

ALTER TABLE ONLY queen.retries
    ADD CONSTRAINT retries_pkey PRIMARY KEY (partition_id, consumer_group, "offset");

ALTER TABLE ONLY queen.runtime_switches
    ADD CONSTRAINT runtime_switches_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queen.schema_functions
    ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name);

ALTER TABLE ONLY queen.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY queen.segments
    ADD CONSTRAINT segments_pkey PRIMARY KEY (partition_id, first_offset);

ALTER TABLE ONLY queen.tenant_tokens
    ADD CONSTRAINT tenant_tokens_pkey PRIMARY KEY (token_id);

ALTER TABLE ONLY queen.tenant_tokens
    ADD CONSTRAINT tenant_tokens_prefix_key UNIQUE (prefix);

ALTER TABLE ONLY queen.tenant_usage
    ADD CONSTRAINT tenant_usage_pkey PRIMARY KEY (tenant_id);

ALTER TABLE ONLY queen.tenants
    ADD CONSTRAINT tenants_name_key UNIQUE (name);

ALTER TABLE ONLY queen.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (tenant_id);

ALTER TABLE ONLY queen.timers
    ADD CONSTRAINT timers_pkey PRIMARY KEY (tenant_id, queue, timer_key);

CREATE INDEX dead_letters_listing ON queen.dead_letters USING btree (tenant_id, queue_id, consumer_group, dead_letter_id);

CREATE INDEX frames_transaction ON queen.frames USING btree (partition_id, transaction_id);

CREATE INDEX kv_expiry ON queen.kv USING btree (expires_at) WHERE (expires_at IS NOT NULL);

CREATE INDEX partitions_tenant ON queen.partitions USING btree (tenant_id, queue_id);

CREATE UNIQUE INDEX segments_last_offset ON queen.segments USING btree (partition_id, last_offset);

CREATE INDEX segments_transactions ON queen.segments USING gin (transaction_hashes) WITH (fastupdate=off);

CREATE INDEX timers_claim_token ON queen.timers USING btree (claim_token) WHERE (claim_token IS NOT NULL);

CREATE INDEX timers_visible ON queen.timers USING btree (visible_at);

CREATE TRIGGER partitions_delete_frames AFTER DELETE ON queen.partitions REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION queen.delete_partitions_frames();

CREATE TRIGGER segments_immutable BEFORE DELETE OR UPDATE ON queen.segments FOR EACH ROW EXECUTE FUNCTION queen.segments_are_immutable();

CREATE TRIGGER segments_not_truncated BEFORE TRUNCATE ON queen.segments FOR EACH STATEMENT EXECUTE FUNCTION queen.segments_are_immutable();

CREATE TRIGGER tenants_delete_timers AFTER DELETE ON queen.tenants REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION queen.delete_tenants_timers();

CREATE TRIGGER timers_visible_above_floor BEFORE INSERT OR UPDATE OF visible_at ON queen.timers FOR EACH ROW WHEN ((new.visible_at < (clock_timestamp() + '00:01:00'::interval))) EXECUTE FUNCTION queen.timers_visible_above_floor();

ALTER TABLE ONLY queen.cursors
    ADD CONSTRAINT cursors_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES queen.partitions(partition_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.dead_letters
    ADD CONSTRAINT dead_letters_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES queen.partitions(partition_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.dead_letters
    ADD CONSTRAINT dead_letters_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES queen.queues(queue_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.dead_letters
    ADD CONSTRAINT dead_letters_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.group_policies
    ADD CONSTRAINT group_policies_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.group_subscriptions
    ADD CONSTRAINT group_subscriptions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.kv
    ADD CONSTRAINT kv_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.partitions
    ADD CONSTRAINT partitions_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES queen.queues(queue_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.partitions
    ADD CONSTRAINT partitions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.queues
    ADD CONSTRAINT queues_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.retries
    ADD CONSTRAINT retries_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES queen.partitions(partition_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.segments
    ADD CONSTRAINT segments_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES queen.partitions(partition_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.tenant_tokens
    ADD CONSTRAINT tenant_tokens_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.tenant_usage
    ADD CONSTRAINT tenant_usage_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;

ALTER TABLE ONLY queen.usage_deltas
    ADD CONSTRAINT usage_deltas_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES queen.tenants(tenant_id) ON DELETE CASCADE;
