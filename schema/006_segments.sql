-- 006 segments: older contiguous ranges of a partition sealed into immutable, zstd-compressed
-- segments; retention drops whole segments and advances partitions.log_start.
--
-- A partition's log is [log_start, next_offset): sealed segments first, then the head
-- (queen.frames). The broker's housekeeping seals a range in one transaction that inserts the
-- segment and deletes the head rows it replaces, so a frame is always in exactly one of them.
-- PostgreSQL cannot decompress zstd, so frames are read through the broker
-- (queen_trio/log/frames.py), which knows head from segment; queen.read_frames() reads the head.

-- "Drop a segment only once every consumer group of the partition has committed past it."
ALTER TABLE queen.queues
    ADD COLUMN retain_until_consumed boolean NOT NULL DEFAULT false;

CREATE TABLE queen.segments (
    partition_id     uuid        NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    first_offset     bigint      NOT NULL,
    last_offset      bigint      NOT NULL,  -- inclusive
    -- No key of its own to tenants: segments go with their partition (the immutability trigger
    -- below lets them go only once their partition is gone or log_start has passed them).
    tenant_id        integer     NOT NULL,
    frame_count      integer     NOT NULL,
    raw_bytes        bigint      NOT NULL,  -- sum of the frames' size_bytes (their payload JSON)
    stored_bytes     integer     NOT NULL,  -- octet_length(data): what the storage gate counts
    first_created_at timestamptz NOT NULL,
    last_created_at  timestamptz NOT NULL,  -- retention ages a segment by its newest frame
    -- transactionId of each frame, in offset order: acks and push de-duplication find sealed
    -- frames here without decompressing anything, through the index on their 64-bit hashes
    -- (an index on the texts themselves is twice the size of the compressed data).
    transaction_ids  text[]      NOT NULL,
    transaction_hashes bigint[]  NOT NULL,  -- hashtextextended(transaction_id, 0) of each
    codec            smallint    NOT NULL DEFAULT 1,  -- 1: zstd, no dictionary (segments.py)
    data             bytea       NOT NULL,
    sealed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, first_offset),
    CHECK (frame_count = last_offset - first_offset + 1),
    CHECK (cardinality(transaction_ids) = frame_count)
);
-- Readers look segments up by the range they need: the first one ending at or after an offset.
CREATE UNIQUE INDEX segments_last_offset ON queen.segments (partition_id, last_offset);
-- fastupdate off: a pending list would be scanned linearly by every lookup until a vacuum.
CREATE INDEX segments_transactions ON queen.segments USING gin (transaction_hashes)
    WITH (fastupdate = off);
-- Already compressed: TOAST would only waste time trying again.
ALTER TABLE queen.segments ALTER COLUMN data SET STORAGE EXTERNAL;

-- A sealed frame cannot be changed or removed by any statement: a segment is never updated,
-- and it is deleted only by retention (log_start already moved past it) or with its partition.
CREATE FUNCTION queen.segments_are_immutable() RETURNS trigger
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
CREATE TRIGGER segments_immutable BEFORE UPDATE OR DELETE ON queen.segments
    FOR EACH ROW EXECUTE FUNCTION queen.segments_are_immutable();
CREATE TRIGGER segments_not_truncated BEFORE TRUNCATE ON queen.segments
    FOR EACH STATEMENT EXECUTE FUNCTION queen.segments_are_immutable();

-- Where the frames carrying these transactionIds sit in a partition, head and segments. STABLE:
-- both statements see the calling query's snapshot, so a frame being sealed is found once.
--
-- The planner prices `&&` on arrays like any cheap operator, so by itself it filters every
-- segment of the partition with it (1,000 x 100 comparisons per segment: 32 ms for a
-- 100-message ack among 20 segments). The GIN index is the only access path left to it here
-- (bitmap scans only, and no partition condition to prefer a btree for): under 1 ms. A hash
-- match is then checked against the texts.
CREATE FUNCTION queen.find_transactions(p_partition uuid, p_txns text[])
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

COMMENT ON FUNCTION queen.read_frames(uuid, bigint, integer) IS
    'The head of the log only; sealed frames are decoded by the broker (queen_trio/log/frames.py).';
