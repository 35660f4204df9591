-- 016 the common acknowledgement in one statement.
--
-- A consumer that keeps up completes messages it was just handed: frames still in the head,
-- each found once in its lease's open range (after the group's cursor, up to leased_to, not
-- already done out of order). queen.ack_head serves exactly that case in one statement (run
-- in autocommit): lock the group's cursor, find the frames by transactionId in the head, move
-- the cursor over them, release the lease when all it handed out is done, and wake the
-- queue's long polls. Anything else (another lease, a transactionId not found in that range or
-- found twice, a repeated ack, frames sealed into segments) answers 'fallback' having changed
-- nothing, and the broker runs its general ack (queen_trio/log/store.py) instead, which looks
-- in sealed segments too and reports every error.
--
-- The caller replays the cursor's move over the returned offsets to label each
-- acknowledgement (leaseReleased), so the previous cursor is returned with them.

CREATE FUNCTION queen.ack_head(
    p_tenant integer, p_partition uuid, p_group text, p_lease uuid, p_txns text[])
RETURNS TABLE (outcome text, queue text, partition text, committed_before bigint,
               acked_ahead_before bigint[], leased_to bigint, transaction_id text,
               "offset" bigint)
LANGUAGE plpgsql AS $fn$
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
    SELECT c.committed, c.acked_ahead, c.lease_id, c.leased_to INTO cur
    FROM queen.cursors c
    WHERE c.partition_id = p_partition AND c.consumer_group = p_group
      AND c.tenant_id = p_tenant
    FOR UPDATE;
    IF NOT FOUND OR cur.leased_to IS NULL
       OR (p_lease IS NOT NULL AND cur.lease_id IS DISTINCT FROM p_lease) THEN
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

    -- Move the cursor over the offsets done out of order that now touch it.
    v_ahead := ARRAY(SELECT DISTINCT o FROM unnest(cur.acked_ahead || v_offsets) AS o ORDER BY o);
    v_committed := cur.committed;
    FOREACH v_o IN ARRAY v_ahead LOOP
        EXIT WHEN v_o <> v_committed + 1;
        v_committed := v_o;
    END LOOP;
    v_ahead := ARRAY(SELECT o FROM unnest(v_ahead) AS o WHERE o > v_committed ORDER BY o);

    UPDATE queen.cursors c
    SET committed = v_committed, acked_ahead = v_ahead,
        lease_expires_at = CASE WHEN v_committed >= cur.leased_to THEN NULL
                                ELSE c.lease_expires_at END,
        updated_at = now()
    WHERE c.partition_id = p_partition AND c.consumer_group = p_group;
    IF v_committed > cur.committed THEN
        DELETE FROM queen.retries r
        WHERE r.partition_id = p_partition AND r.consumer_group = p_group
          AND r."offset" <= v_committed;
    END IF;

    SELECT q.name, p.name INTO v_queue, v_pname
    FROM queen.partitions p JOIN queen.queues q USING (queue_id)
    WHERE p.partition_id = p_partition;
    IF v_committed >= cur.leased_to THEN
        -- The partition is free again: long polls of the queue (on every broker) look again.
        PERFORM pg_notify('queen_log', p_tenant::text || ':' || v_queue);
    END IF;

    RETURN QUERY
    SELECT 'acked', v_queue, v_pname, cur.committed, cur.acked_ahead, cur.leased_to, u.t, u.o
    FROM unnest(v_txns, v_offsets) AS u(t, o);
END
$fn$;
