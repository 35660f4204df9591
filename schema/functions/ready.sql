-- The ready set (queen.ready, schema/014_ready_partitions.sql): for each consumer group, the
-- partitions of a queue with frames past its cursor, so that a pop walks an index to its
-- partition instead of looking at every partition of the queue. Applied by the migrator after
-- the numbered migrations whenever this file changes (schema/README.md).
--
-- Who writes a row, and why no row that matters is ever missed:
-- - a push (any writer of partitions.next_offset: push, append, a timer's fire) marks its
--   partitions ready for every group registered on the queue (queen.mark_pushed_ready);
-- - a group's registration (its first pop of the queue, or a seek) marks what is there
--   already (queen.register_group); pushes and registrations exclude each other through an
--   advisory lock on the queue (shared by pushes, exclusive by a registration), so every push
--   either sees the group or is seen by the registration;
-- - a cursor moved back (a seek) marks its partition (queen.cursor_served);
-- - only queen.drop_stale_ready removes a row, holding the row and its partition (no push in
--   flight there) and reading the cursor afresh.
-- Rows with nothing left (drained, acknowledged, dropped by retention) stay until a pop walks
-- past them and drops them: each once.

-- Pushes take it shared, a registration exclusive (queen.register_group).
CREATE OR REPLACE FUNCTION queen.ready_lock_key(p_queue_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_queue_id % 2147483647)::integer
$$;

CREATE OR REPLACE FUNCTION queen.mark_pushed_ready() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM grown n JOIN was o USING (partition_id)
                   WHERE n.next_offset > o.next_offset) THEN
        RETURN NULL;  -- (log_start moved: retention)
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1363170308, queen.ready_lock_key(q.queue_id))
    FROM (SELECT DISTINCT n.queue_id FROM grown n JOIN was o USING (partition_id)
          WHERE n.next_offset > o.next_offset ORDER BY 1) q;
    -- (A new statement: it sees every registration committed before the lock.)
    INSERT INTO queen.ready (partition_id, consumer_group, queue_id, served_at)
    SELECT n.partition_id, g.consumer_group, n.queue_id, coalesce(c.updated_at, '-infinity')
    FROM grown n
    JOIN was o USING (partition_id)
    JOIN queen.queue_groups g ON g.queue_id = n.queue_id
    LEFT JOIN queen.cursors c
           ON c.partition_id = n.partition_id AND c.consumer_group = g.consumer_group
    WHERE n.next_offset > o.next_offset
    ORDER BY n.partition_id, g.consumer_group
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER partitions_mark_ready AFTER UPDATE ON queen.partitions
    REFERENCING OLD TABLE AS was NEW TABLE AS grown
    FOR EACH STATEMENT EXECUTE FUNCTION queen.mark_pushed_ready();

-- The walk serves the least recently served partition first: served_at is when the group's
-- cursor there last changed (a pop, an ack, a lease), by the clock (the cursor's updated_at is
-- the transaction's start: a general pop creating cursors and popping one would leave them all
-- equal). A cursor moved back (a seek) may have frames past it again: its partition is marked
-- (the row is written, so a concurrent drop_stale_ready either skips it or is waited for).
CREATE OR REPLACE FUNCTION queen.cursor_served() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.committed < OLD.committed THEN
        INSERT INTO queen.ready (partition_id, consumer_group, queue_id, served_at)
        SELECT NEW.partition_id, NEW.consumer_group, p.queue_id, clock_timestamp()
        FROM queen.partitions p WHERE p.partition_id = NEW.partition_id
        ON CONFLICT (partition_id, consumer_group) DO UPDATE SET served_at = excluded.served_at;
    ELSE
        -- (Never waiting: a row held by a seed or a drop keeps its time, which costs that
        -- partition its place in the order at most; a wait here closed deadlock cycles.)
        UPDATE queen.ready r SET served_at = clock_timestamp()
        WHERE (r.partition_id, r.consumer_group) IN (
            SELECT x.partition_id, x.consumer_group FROM queen.ready x
            WHERE x.partition_id = NEW.partition_id AND x.consumer_group = NEW.consumer_group
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER cursors_served AFTER UPDATE ON queen.cursors
    FOR EACH ROW EXECUTE FUNCTION queen.cursor_served();

-- A group's first pop of a queue (or seek) registers it there and marks every partition with
-- frames past its cursor (or with frames, where it has none). Whether it registered it now.
-- Run before the group creates any cursor on the queue; the lock is held to the caller's
-- commit, so pushes into the queue wait for that (once per group and queue).
CREATE OR REPLACE FUNCTION queen.register_group(p_queue_id bigint, p_group text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM queen.queue_groups g
               WHERE g.queue_id = p_queue_id AND g.consumer_group = p_group) THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(1363170308, queen.ready_lock_key(p_queue_id));
    INSERT INTO queen.queue_groups (queue_id, consumer_group) VALUES (p_queue_id, p_group)
    ON CONFLICT (queue_id, consumer_group) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO queen.ready (partition_id, consumer_group, queue_id, served_at)
    SELECT p.partition_id, p_group, p.queue_id, coalesce(c.updated_at, '-infinity')
    FROM queen.partitions p
    LEFT JOIN queen.cursors c ON c.partition_id = p.partition_id AND c.consumer_group = p_group
    WHERE p.queue_id = p_queue_id
      AND p.next_offset > greatest(coalesce(c.committed + 1, 0), p.log_start)
    ORDER BY p.partition_id
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;
    RETURN true;
END
$fn$;

-- Drop the rows of partitions the group has nothing left in (a pop walked past them). Rows
-- being written (a seek, a registration) and partitions being pushed to are skipped, never
-- waited for; the cursors and partitions are read after those locks are held, so nothing
-- pushed before is missed, and a push after waits for this commit and marks its partition
-- again. How many it dropped.
CREATE OR REPLACE FUNCTION queen.drop_stale_ready(p_group text, p_pids uuid[])
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_pids uuid[];
    v_n integer;
BEGIN
    v_pids := ARRAY(SELECT r.partition_id FROM queen.ready r
                    WHERE r.partition_id = ANY(p_pids) AND r.consumer_group = p_group
                    ORDER BY r.partition_id
                    FOR UPDATE SKIP LOCKED);
    v_pids := ARRAY(SELECT p.partition_id FROM queen.partitions p
                    WHERE p.partition_id = ANY(v_pids)
                    ORDER BY p.partition_id
                    FOR SHARE SKIP LOCKED);
    DELETE FROM queen.ready r
    USING queen.partitions p
    WHERE r.partition_id = ANY(v_pids) AND r.consumer_group = p_group
      AND p.partition_id = r.partition_id
      AND p.next_offset <= greatest(
          coalesce((SELECT c.committed + 1 FROM queen.cursors c
                    WHERE c.partition_id = r.partition_id AND c.consumer_group = p_group), 0),
          p.log_start);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$fn$;
