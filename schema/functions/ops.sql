-- Housekeeping functions the broker calls. Applied by the migrator after the numbered
-- migrations whenever this file changes (schema/README.md): edit a body here in place; a
-- dropped function or a changed signature needs a numbered migration as well.

-- Tables that have outgrown their planner statistics are analyzed at once.
--
-- A plan made while a table held a handful of rows reads it whole (a sequential scan is then
-- the cheapest way), and connections keep their plans (psycopg's prepared statements, the
-- PL/pgSQL functions' cached plans) until the table's statistics change: until autovacuum's
-- next ANALYZE, up to a minute after the table has grown. Each broker calls this every few
-- seconds (queen_trio/db/analyze.py); ANALYZE invalidates every plan that depends on the table
-- on every connection, so a plan made small outlives the growth by seconds, not a minute.
--
-- ANALYZE each table of the queen schema that now holds more than twice the rows its
-- statistics were taken at, and at least p_slack more (never analyzed counts as none). A table
-- another session is already analyzing or vacuuming is left to it (SKIP_LOCKED). Answers the
-- tables analyzed.
CREATE OR REPLACE FUNCTION queen.analyze_grown_tables(p_slack integer)
RETURNS TABLE (table_name text, live_rows bigint, rows_before real)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- Whether retention may drop a run of a queue's partition ending at p_last_offset, whose newest
-- frame was written at p_last_created: a sealed segment (queen_trio/sql/segments.sql asks it for
-- the oldest segment of each partition, then for each segment of one partition), or the head's
-- oldest run (cut by the same rule, so that data not yet sealed is not kept past its age limit
-- either).
--
-- * retentionSeconds and ttl (Queen's message time-to-live: the same thing seen from the
--   message) are one age limit, the smaller non-zero of the two; with retainUntilConsumed the
--   run must also be committed by every consumer group of the partition (none: nobody).
-- * completedRetentionSeconds drops a run every consumer group has committed past once it
--   is that old, with or without retentionSeconds.
-- * retentionEnabled = false turns all of the above off for the queue.
-- * maxWaitTimeSeconds (Queen's eviction, which its retentionEnabled does not govern) drops a
--   run that old: its messages have waited too long. Queen keeps the ones every consumer group
--   has consumed; a log can only drop a prefix, and keeping those would keep every waiting one
--   behind them, so they go too (no group loses anything: each has had them).
--
-- PL/pgSQL rather than SQL only because an SQL body is checked against the tables when it is
-- created: the migrator applies this file after an older subset of migrations too (before the
-- one adding max_wait_s), and a PL/pgSQL body is checked when it first runs.
CREATE OR REPLACE FUNCTION queen.segment_droppable(
    q queen.queues, p_partition uuid, p_last_offset bigint, p_last_created timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $fn$
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
$fn$;

COMMENT ON FUNCTION queen.segment_droppable(queen.queues, uuid, bigint, timestamptz) IS
    'Retention''s rule for a run of frames: retentionSeconds/ttl, completedRetentionSeconds, maxWaitTimeSeconds.';
