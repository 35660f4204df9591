-- 007 the common pop in one statement.
--
-- A consumer that keeps up pops frames that are still in the head, that nobody has failed
-- before, from a cursor with nothing acked out of order and no expired lease to account for.
-- queen.pop_head serves exactly that case in one statement (run in autocommit): pick a
-- partition, lock the group's cursor, read the frames, take the lease (or, with autoAck,
-- advance the cursor). Anything else (a group's first pop of a partition, an expired lease
-- with frames it handed out, frames sealed into segments or with a retry history,
-- delayedProcessing, a cursor behind log_start) answers 'fallback' having changed nothing,
-- and the broker runs its general pop (queen_trio/log/store.py) instead.

CREATE FUNCTION queen.pop_head(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer,
    p_auto_ack boolean)
RETURNS TABLE (outcome text, partition_id uuid, partition text, lease_id uuid,
               lease_expires_at timestamptz, "offset" bigint, transaction_id text,
               payload jsonb, created_at timestamptz, meta jsonb)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    cand record;
    cur record;
    v_wanted bigint;
    v_offsets bigint[];
    v_txns text[];
    v_payloads jsonb[];
    v_created timestamptz[];
    v_metas jsonb[];
    v_last bigint;
    v_lease uuid;
    v_expires timestamptz;
    v_fallback boolean := false;
BEGIN
    -- The same candidates, in the same order, as the general pop (pop_candidates).
    FOR cand IN
        SELECT p.partition_id AS pid, p.name AS pname, p.log_start, p.next_offset,
               q.lease_time_s, q.delayed_processing_s
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.queue_id
        LEFT JOIN queen.cursors c
               ON c.partition_id = p.partition_id AND c.consumer_group = p_group
        WHERE q.tenant_id = p_tenant AND q.name = p_queue
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.next_offset > greatest(coalesce(c.committed + 1, 0), p.log_start)
          AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
        ORDER BY c.updated_at NULLS FIRST
        LIMIT 8
    LOOP
        IF cand.delayed_processing_s > 0 THEN
            v_fallback := true;
            EXIT;
        END IF;
        SELECT c.committed, c.acked_ahead, c.lease_expires_at, c.leased_to INTO cur
        FROM queen.cursors c
        WHERE c.partition_id = cand.pid AND c.consumer_group = p_group
          AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF NOT EXISTS (SELECT 1 FROM queen.cursors c
                           WHERE c.partition_id = cand.pid AND c.consumer_group = p_group) THEN
                v_fallback := true;  -- the group's first pop here: the broker creates the cursor
                EXIT;
            END IF;
            CONTINUE;  -- another consumer of the group holds (or is taking) it
        END IF;
        IF cardinality(cur.acked_ahead) > 0 OR cur.committed < cand.log_start - 1
           OR (cur.lease_expires_at IS NOT NULL
               AND coalesce(cur.leased_to, -1) > cur.committed) THEN
            v_fallback := true;
            EXIT;
        END IF;

        v_wanted := least(p_batch, cand.next_offset - cur.committed - 1);
        IF v_wanted <= 0 THEN
            -- Another consumer of the group took these frames between the candidates and the
            -- lock: nothing left here.
            CONTINUE;
        END IF;
        SELECT array_agg(f."offset" ORDER BY f."offset"),
               array_agg(f.transaction_id ORDER BY f."offset"),
               array_agg(f.payload ORDER BY f."offset"),
               array_agg(f.created_at ORDER BY f."offset"),
               array_agg(f.meta ORDER BY f."offset")
        INTO v_offsets, v_txns, v_payloads, v_created, v_metas
        FROM queen.read_frames(cand.pid, cur.committed + 1, v_wanted::integer) f;
        IF coalesce(cardinality(v_offsets), 0) < v_wanted  -- some are sealed
           OR EXISTS (SELECT 1 FROM queen.retries r
                      WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
                        AND r."offset" BETWEEN cur.committed + 1 AND cur.committed + v_wanted)
        THEN
            v_fallback := true;
            EXIT;
        END IF;
        v_last := v_offsets[cardinality(v_offsets)];

        IF p_auto_ack THEN
            UPDATE queen.cursors c
            SET committed = v_last, lease_expires_at = NULL, updated_at = now()
            WHERE c.partition_id = cand.pid AND c.consumer_group = p_group;
            DELETE FROM queen.retries r
            WHERE r.partition_id = cand.pid AND r.consumer_group = p_group
              AND r."offset" <= v_last;
        ELSE
            -- Losing a lease in a crash is what its expiry does anyway: the frames are handed
            -- out again. So this commit need not wait for the disk.
            PERFORM set_config('synchronous_commit', 'off', true);
            UPDATE queen.cursors c
            SET lease_id = gen_random_uuid(),
                lease_expires_at = now() + make_interval(secs => cand.lease_time_s),
                leased_to = v_last, updated_at = now()
            WHERE c.partition_id = cand.pid AND c.consumer_group = p_group
            RETURNING c.lease_id, c.lease_expires_at INTO v_lease, v_expires;
        END IF;
        RETURN QUERY
        SELECT 'messages', cand.pid, cand.pname, v_lease, v_expires, u.o, u.t, u.p, u.c, u.m
        FROM unnest(v_offsets, v_txns, v_payloads, v_created, v_metas) AS u(o, t, p, c, m);
        RETURN;
    END LOOP;

    -- Nothing to pop (no candidate, or every candidate held by another consumer of the
    -- group), or a case for the general pop.
    RETURN QUERY SELECT CASE WHEN v_fallback THEN 'fallback' ELSE 'empty' END,
                        NULL::uuid, NULL::text, NULL::uuid, NULL::timestamptz, NULL::bigint,
                        NULL::text, NULL::jsonb, NULL::timestamptz, NULL::jsonb;
END
$fn$;
