-- The sealed segments' functions: their immutability, and finding frames by transactionId in
-- the head and the segments. Applied by the migrator after the numbered migrations whenever
-- this file changes (schema/README.md): edit a body here in place; a dropped function or a
-- changed signature needs a numbered migration as well.

-- A sealed frame cannot be changed or removed by any statement: a segment is never updated,
-- and it is deleted only by retention (log_start already moved past it) or with its partition.
CREATE OR REPLACE FUNCTION queen.segments_are_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE TRIGGER segments_immutable BEFORE UPDATE OR DELETE ON queen.segments
    FOR EACH ROW EXECUTE FUNCTION queen.segments_are_immutable();
CREATE OR REPLACE TRIGGER segments_not_truncated BEFORE TRUNCATE ON queen.segments
    FOR EACH STATEMENT EXECUTE FUNCTION queen.segments_are_immutable();

-- Where the frames carrying these transactionIds sit in a partition, head and segments. STABLE:
-- both statements see the calling query's snapshot, so a frame being sealed is found once.
--
-- The planner prices `&&` on arrays like any cheap operator, so by itself it filters every
-- segment of the partition with it (1,000 x 100 comparisons per segment: 32 ms for a
-- 100-message ack among 20 segments). The GIN index is the only access path left to it here
-- (bitmap scans only, and no partition condition to prefer a btree for): under 1 ms. A hash
-- match is then checked against the texts.
CREATE OR REPLACE FUNCTION queen.find_transactions(p_partition uuid, p_txns text[])
RETURNS TABLE (transaction_id text, "offset" bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_indexscan = off
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
