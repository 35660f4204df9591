-- The push side of the log: creating and locking the partitions a push writes to, and the
-- common push in one statement. Applied by the migrator after the numbered migrations whenever
-- this file changes (schema/README.md).

-- Implicit creation by push (or timer): default options, never overwrites a configured queue.
CREATE OR REPLACE FUNCTION queen.ensure_queues(p_tenant integer, p_names text[])
RETURNS integer
LANGUAGE sql AS $$
    WITH created AS (
        INSERT INTO queen.queues (tenant_id, name)
        SELECT p_tenant, n FROM unnest(p_names) AS n
        ORDER BY n  -- every creator inserts in one order
        ON CONFLICT (tenant_id, name) DO NOTHING
        RETURNING 1)
    SELECT count(*)::integer FROM created
$$;

-- The missing (queue, partition) pairs of existing queues, created in one statement (5,000 new
-- partitions cost one insert, not 5,000). Returns how many it created.
CREATE OR REPLACE FUNCTION queen.ensure_partitions(p_tenant integer, p_queues text[],
                                                   p_names text[])
RETURNS integer
LANGUAGE sql AS $$
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

-- Pushers serialise per partition here; a fixed lock order keeps multi-partition pushes from
-- deadlocking each other. NO KEY UPDATE (a push changes next_offset, never the key): it leaves
-- the key-share locks that cursor and retry writes take through their foreign keys free, so an
-- ack or a pop never waits for a push, nor a push for them (FOR UPDATE made such a wait, and a
-- deadlock when an ack's partitions came in another order).
-- All or nothing: when one is missing, nothing is locked, and the caller creates the missing
-- ones holding no partition lock (creating them under other partitions' locks could deadlock
-- with a push doing the same in another order). The pairs are distinct.
CREATE OR REPLACE FUNCTION queen.lock_partitions(p_tenant integer, p_queues text[],
                                                 p_names text[])
RETURNS TABLE (partition_id uuid, queue text, name text, next_offset bigint, queue_id bigint,
               max_size bigint, encryption_enabled boolean)
LANGUAGE sql AS $$
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

-- What a push does first, in one round trip: lock its partitions, and when some are missing,
-- create them (and their queues) holding no partition lock, then lock them all.
CREATE OR REPLACE FUNCTION queen.take_partitions(p_tenant integer, p_queues text[],
                                                 p_names text[])
RETURNS TABLE (partition_id uuid, queue text, name text, next_offset bigint, queue_id bigint,
               max_size bigint, encryption_enabled boolean)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- The common push in one statement (run in autocommit).
--
-- Frames in clear into queues without maxSize, whose client transaction ids (p_dedupe) are
-- either new to their partition or held by a frame still in the head: the partitions are
-- taken (queen.take_partitions), duplicates found, offsets given, frames inserted, next offsets
-- and the stored bytes written, the queues' pops woken (p_wake: NOTIFY payloads; empty when
-- the broker sends them itself). Anything else (a queue with encryptionEnabled or maxSize, a
-- duplicate of a sealed frame) answers one 'fallback' row having written no frame, and the
-- broker runs its general append (queen_trio/log/store.py); partitions it created stay.
--
-- p_pairs are the distinct (p_queues[i], p_names[i]); frame j goes to pair p_part[j]. Each
-- frame answers: its status, its partition, its offset (a duplicate: the offset holding its
-- transaction id), and for a duplicate the holder's meta (a frame of the head) or, when the
-- holder is an earlier frame of this push, that frame's index (1-based).
CREATE OR REPLACE FUNCTION queen.push_head(
    p_tenant integer, p_queues text[], p_names text[], p_part integer[], p_txns text[],
    p_dedupe boolean[], p_payloads text[], p_metas text[], p_usage_offset bigint,
    p_wake text[])
RETURNS TABLE (outcome text, idx integer, partition_id uuid, "offset" bigint, held_meta jsonb,
               held_by integer)
LANGUAGE plpgsql AS $fn$
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
$fn$;
