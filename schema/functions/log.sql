-- The log's functions: reading the head, the cascade of a partition's frames, the one-statement
-- pop and acknowledgement. Applied by the migrator after the numbered migrations whenever this
-- file changes (schema/README.md): edit a body here in place; a dropped function or a changed
-- signature needs a numbered migration as well.

-- The one reader of frames: offsets [from_offset, from_offset + max_count) of a partition.
-- Only the head (queen.frames): sealed segments are compressed with zstd, which PostgreSQL
-- cannot decompress, so the broker reads them (queen_trio/log/frames.py).
CREATE OR REPLACE FUNCTION queen.read_frames(p_partition uuid, from_offset bigint, max_count integer)
RETURNS TABLE ("offset" bigint, transaction_id text, payload jsonb, size_bytes integer,
               created_at timestamptz, meta jsonb)
LANGUAGE sql STABLE AS $$
    SELECT f."offset", f.transaction_id, f.payload, f.size_bytes, f.created_at, f.meta
    FROM queen.frames f
    WHERE f.partition_id = p_partition
      AND f."offset" >= from_offset
      AND f."offset" < from_offset + max_count
    ORDER BY f."offset"
$$;

COMMENT ON FUNCTION queen.read_frames(uuid, bigint, integer) IS
    'The head of the log only; sealed frames are decoded by the broker (queen_trio/log/frames.py).';

-- When a partition's newest frame was pushed (windowBuffer holds the partition back until it is
-- old enough): the head's last frame, else (all sealed) the last segment's newest; -infinity for
-- an empty partition.
CREATE OR REPLACE FUNCTION queen.newest_frame_at(p_partition uuid, p_next_offset bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT f.created_at FROM queen.frames f
         WHERE f.partition_id = p_partition AND f."offset" = p_next_offset - 1),
        (SELECT s.last_created_at FROM queen.segments s
         WHERE s.partition_id = p_partition ORDER BY s.last_offset DESC LIMIT 1),
        '-infinity')
$$;

-- frames has no foreign key to partitions (the per-row check cost more than the insert: see
-- queen.frames in schema/001_baseline.sql). What the key did besides, the cascade when a
-- partition (queue, tenant) is deleted, is kept by this one statement-level trigger.
CREATE OR REPLACE FUNCTION queen.delete_partitions_frames() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM queen.frames f USING gone g WHERE f.partition_id = g.partition_id;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER partitions_delete_frames AFTER DELETE ON queen.partitions
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION queen.delete_partitions_frames();

-- The partitions a pop of the group tries, in the order it tries them: those of the queue with
-- frames past the group's cursor (or with frames at all, where it has no cursor yet), no live
-- lease and no retryDelay hold, and whose newest frame is old enough for windowBuffer.
--
-- The order is a rotation by partition name, starting after p_after (the partition the caller
-- last served; NULL: from the first name): each pop walks the partitions index from there and
-- stops at the first p_limit that qualify, so a pop over a queue of 5,000 partitions that all
-- hold frames reads a few of them, not all 5,000 with their cursors (which is what ordering by
-- when each cursor was last served took: Queen's bootstrap tests, issue 30). The caller keeps
-- the pointer (in memory: queen_trio/log/rotation.py), so a pop writes nothing to choose:
-- ordering by a stamp written on every pop would leave, behind a held snapshot, a dead index
-- entry per pop for every later pop to walk. A partition with frames past the cursor is
-- reached within one lap of the pointer, so every partition is served in turn.
-- (The laps are the branches of one UNION ALL, each walked in index order; the executor reads
-- them one after the other, and LIMIT stops it as soon as it has enough.)
--
-- p_settled, p_settled_through: a cursor of the group the caller has locked and is settling
-- (its lease's batch completed through p_settled_through: queen.pop_head_take), taken as that
-- settlement leaves it, committed through p_settled_through with no lease, though the row
-- still shows the lease: the caller writes the settlement and the next lease in one UPDATE.
CREATE OR REPLACE FUNCTION queen.pop_walk(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_after text,
    p_limit integer, p_settled uuid DEFAULT NULL, p_settled_through bigint DEFAULT NULL)
RETURNS TABLE (partition_id uuid, name text, log_start bigint, next_offset bigint,
               queue_id bigint, lease_time_s integer, retry_limit integer,
               delayed_processing_s integer, window_buffer_s integer, dead_letter_queue boolean)
LANGUAGE sql STABLE AS $$
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

-- For a long poll that found nothing: in how many seconds a partition of the queue with frames
-- past the group's cursor becomes poppable without anyone saying so (nobody NOTIFYs these):
-- its lease or its retryDelay hold ends, or its next frame matures (delayedProcessing; a
-- sealed one counts as mature). 0 or less: one looks poppable already (another consumer held
-- its cursor as we looked); NULL: none will until a NOTIFY. The same partitions, cursors and
-- tests as queen.pop_walk. Volatile: called after a pop in the same statement, it reads with a
-- snapshot of its own, taken after the pop's (queen_trio/sql/log.sql pop_head).
CREATE OR REPLACE FUNCTION queen.next_look(
    p_tenant integer, p_queue text, p_group text, p_partition text)
RETURNS float8
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- (planned once per connection, by index, as
SET enable_seqscan = off                   -- queen.pop_head)
AS $fn$
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
$fn$;

-- Whether a partition of the queue is poppable for the group right now, as a pop would find
-- it (queen.pop_walk), looking only at the next 16 partitions after the rotation pointer
-- p_after (or at the caller's own partition): true means one is, false that none of those is.
-- A pop that took messages asks this before queen.next_look, which reads every partition of
-- the queue with its cursor to find the soonest instant: while a backlog of many partitions
-- drains, the next ones in the rotation hold messages, and a few index probes find one where
-- next_look read all 5,000 partitions of Queen's bootstrap tests (7 ms for every message of a
-- group's first pass). Bounded, so that when nothing is poppable the look costs next_look's
-- read and 16 probes, not a second read of every partition. A queue with delayedProcessing is
-- left to next_look (a frame past the cursor may not be mature yet). Volatile, as next_look:
-- called after a pop in the same statement, it sees that pop's lease.
CREATE OR REPLACE FUNCTION queen.poppable_now(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_after text)
RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- (planned once per connection, by index, as
SET enable_seqscan = off                   -- queen.pop_head)
AS $fn$
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
$fn$;

-- The common pop in one statement.
--
-- A consumer that keeps up pops frames that are still in the head, that nobody has failed
-- before, from a cursor with nothing acked out of order and no expired lease to account for.
-- queen.pop_head serves exactly that case in one statement (run in autocommit): pick a
-- partition, lock the group's cursor, read the frames, take the lease (or, with autoAck,
-- advance the cursor). Queue mode's first pop of a partition creates its cursors first, as
-- the general pop would. Anything else (a named group's first pop of a partition, an expired
-- lease with frames it handed out, frames sealed into segments or with a retry history,
-- delayedProcessing or windowBuffer, a cursor behind log_start, a batch handed out again after
-- a nack) answers 'fallback' having changed nothing but such cursors, and the broker runs its
-- general pop (queen_trio/log/store.py) instead.
--
-- The work is queen.pop_head_take's, which answers the batch as arrays in one composite value
-- (called as an expression, it needs no executor of its own); queen.pop_head hands them out as
-- rows. The sweep's statement (queen.sweep_settle_and_pop, timers.sql) calls pop_head_take
-- itself with p_rows, which answers the batch as its JSON rows instead (json_rows, taken),
-- made by the read of the frames: reading the rows of a set-returning function through a
-- SELECT materialised them and started an executor for that layer, per sweeper cycle, and
-- turning arrays into JSON took a statement of its own.
--
-- With p_settle_partition, a stream's batch settled whole first (queen.settle_cursor: the
-- cursor locked, and applied only while it is exactly as that batch's pop left it; settled
-- says whether it was). The settlement is written in the pop's lease UPDATE when the pop takes
-- that same partition again (the usual case under a steady flow: one new version of the row,
-- not two, and no foreign-key check of a row this transaction wrote), else alone after the
-- pop, as queen.settle_head writes it. Either way the pop sees the partition as the settlement
-- leaves it (queen.pop_walk's p_settled).
CREATE OR REPLACE FUNCTION queen.pop_head_take(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer,
    p_auto_ack boolean, p_after text, p_settle_partition uuid, p_settle_lease uuid,
    p_settle_from bigint, p_settle_through bigint, p_rows boolean,
    OUT outcome text, OUT partition_id uuid, OUT partition text, OUT lease_id uuid,
    OUT lease_expires_at timestamptz, OUT offsets bigint[], OUT txns text[],
    OUT payloads jsonb[], OUT created timestamptz[], OUT metas jsonb[], OUT settled boolean,
    OUT json_rows jsonb, OUT taken integer)
LANGUAGE plpgsql
-- Planned once per connection: the frames' read was planned afresh at most pops, a custom
-- plan each time (180 µs of a one-message pop at a steady 500/s, bench.pg_path). Unlike sorts
-- off (see queen.ack_head), this changes no plan's shape; sequential scans off so that no plan
-- made while a table was nearly empty reads all of it once it has grown (as
-- queen.schedule_timers: every statement here has its index).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
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
$fn$;

CREATE OR REPLACE FUNCTION queen.pop_head(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer,
    p_auto_ack boolean, p_after text)
RETURNS TABLE (outcome text, partition_id uuid, partition text, lease_id uuid,
               lease_expires_at timestamptz, "offset" bigint, transaction_id text,
               payload jsonb, created_at timestamptz, meta jsonb)
LANGUAGE plpgsql
AS $fn$
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
$fn$;

-- A group's cursor of a partition, locked, for an acknowledgement (queen.ack_head,
-- queen.settle_pop_head): its newest version's ctid (the caller's UPDATE finds the row by it),
-- committed, acked_ahead, lease_id, leased_to, whether the lease is live, and the offset its
-- delivery attempts are counted from (attempt_offset); all NULL when
-- the group has no cursor there (or the tenant's is another).
--
-- The cursor is read newest version first: a backward scan of cursors_pkey, bounded by row
-- comparisons (an equality on the key would let the planner drop the ORDER BY and scan
-- forward), stops at the first version visible. Behind a held snapshot nothing of the row's
-- earlier versions can be pruned; each page they filled has an index entry (a HOT chain ends
-- where its page is full), and a forward scan walked them all, one buffer per page, every pop
-- and ack (44 buffers after 3,000 updates; this: 3). The newest version is on the newest page
-- (fillfactor 50 keeps new versions off pages already half full).
-- Sorts are off for this statement (the SET clause), so that it is planned as that backward
-- read whatever the table's size (on a small table the planner would rather sort a scan of
-- it). Off for the whole of a caller (a SET clause on queen.ack_head), every statement of the
-- ack was planned under it: PostgreSQL's CPU per timer at a steady 500/s went from 0.88 to
-- 2.3 ms and lag p50 from 9 to 38 ms (bench.peer_graphile --scenario steady). The callers'
-- own settings (a generic plan, by index) hold for it too: it runs inside them.
-- One row, not a set, and called as an expression (cur := ...): plpgsql then calls it without
-- an executor of its own, and one SET clause costs less than setting and restoring sorts
-- around the statement; 8.6 µs a call against 11.1 for the statement inline and 15.0 for a
-- set-returning function read by a SELECT (best of 25 rounds of 3,000 calls).
CREATE OR REPLACE FUNCTION queen.cursor_for_update(
    p_tenant integer, p_partition uuid, p_group text,
    OUT tid tid, OUT committed bigint, OUT acked_ahead bigint[], OUT lease_id uuid,
    OUT leased_to bigint, OUT lease_live boolean, OUT attempt_offset bigint)
LANGUAGE plpgsql
SET enable_sort = off
AS $fn$
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
$fn$;

-- The common acknowledgement in one statement.
--
-- A consumer that keeps up completes messages it was just handed: frames still in the head,
-- each found once in its lease's open range (after the group's cursor, up to leased_to, not
-- already done out of order). queen.ack_head serves exactly that case in one statement (run
-- in autocommit): lock the group's cursor, find the frames by transactionId in the head,
-- commit the cursor up to the highest of them (an offset commit, as Queen's ack: what was
-- handed out before it is done too), release the lease when all it handed out is done, and
-- wake the queue's long polls. Anything else (a lease that is not live or not the cursor's, a
-- transactionId not found in that range or found twice, a repeated ack, frames sealed into
-- segments) answers 'fallback' having changed nothing, and the broker runs its general ack
-- (queen_trio/log/store.py) instead, which looks in sealed segments too and gives every
-- acknowledgement its verdict.
--
-- The caller replays the cursor's move to label the acknowledgements (leaseReleased), so the
-- previous cursor is returned with the highest acked offset, in one row ("offset"; the
-- transaction_id column is left NULL).

CREATE OR REPLACE FUNCTION queen.ack_head(
    p_tenant integer, p_partition uuid, p_group text, p_lease uuid, p_txns text[])
RETURNS TABLE (outcome text, queue text, partition text, committed_before bigint,
               acked_ahead_before bigint[], leased_to bigint, transaction_id text,
               "offset" bigint)
LANGUAGE plpgsql
-- Planned once per connection: the frames' look-up was planned afresh at most acks (90 µs of
-- a one-message ack at a steady 500/s, bench.pg_path), by index (see queen.pop_head).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
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
$fn$;

-- A stream's batch settled whole, and the next pop, in one statement.
--
-- A streaming consumer (queen_trio/api/stream.py) that completes every message of a batch the
-- broker handed it says so by transactionId; the broker, which still holds that batch, checks
-- in memory that the settlement names exactly its messages, and then needs no look-up of the
-- frames by transactionId (what queen.ack_head spends most of its time on, a probe per message):
-- the acknowledgement is the offset commit through the batch's last offset p_through. It is
-- taken here only while the cursor is exactly as that pop left it: the lease p_lease live and
-- the cursor's, handing out (p_from - 1, p_through], nothing committed or done out of order
-- since (then every message is a plain completion, as queen.ack_head would answer). Anything
-- else answers one 'unsettled' row having changed nothing, and the broker runs its usual ack.
--
-- Then, with p_batch > 0, the group's next pop in the same statement (queen.pop_head, in its
-- rotation after p_after): a consumer draining a backlog gets its next batch without another
-- round trip, and the partition is never seen free in between (no NOTIFY, no parked pop woken
-- to find it leased again). Its rows follow, as queen.pop_head answers them; with p_batch = 0,
-- or when the pop finds nothing, one 'empty' row ('fallback': the pop's case needs the general
-- pop, and the acknowledgement has committed all the same). The queue's long polls are told
-- (NOTIFY) when the partition is left free.

-- The cursor such a settlement applies to, locked (queen.cursor_for_update): its newest
-- version's ctid and attempt_offset while it is exactly as the batch's pop left it, both NULL
-- otherwise (the cursor stays locked until the transaction ends all the same). For
-- queen.settle_head and queen.pop_head_take.
CREATE OR REPLACE FUNCTION queen.settle_cursor(
    p_tenant integer, p_group text, p_partition_id uuid, p_lease uuid, p_from bigint,
    p_through bigint, OUT tid tid, OUT attempt_offset bigint)
LANGUAGE plpgsql
AS $fn$
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
$fn$;

-- A settlement written: the cursor (its newest version, locked by queen.settle_cursor) committed
-- through p_through with its lease released, and the retry history of the frames it passed
-- dropped. For queen.settle_head, and queen.pop_head_take when the pop that follows does not
-- take the settled partition again (when it does, its lease UPDATE writes the settlement too).
CREATE OR REPLACE FUNCTION queen.settle_write(
    p_tid tid, p_partition_id uuid, p_group text, p_through bigint)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    UPDATE queen.cursors c
    SET committed = p_through, lease_expires_at = NULL, updated_at = now()
    WHERE c.ctid = p_tid;
    DELETE FROM queen.retries r
    WHERE r.partition_id = p_partition_id AND r.consumer_group = p_group
      AND r."offset" <= p_through;
END
$fn$;

-- The settlement itself, for queen.settle_pop_head (queen.sweep_settle_and_pop has
-- queen.pop_head_take write it): true when it was applied (the cursor committed through
-- p_through, its lease released, the retries it passed dropped), false when the cursor is not
-- as the batch's pop left it and nothing was changed (the cursor stays locked until the
-- transaction ends, as it did).
CREATE OR REPLACE FUNCTION queen.settle_head(
    p_tenant integer, p_group text, p_partition_id uuid, p_lease uuid, p_from bigint,
    p_through bigint)
RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- (as queen.ack_head and queen.pop_head)
SET enable_seqscan = off
AS $fn$
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
$fn$;

CREATE OR REPLACE FUNCTION queen.settle_pop_head(
    p_tenant integer, p_queue text, p_group text, p_partition_id uuid, p_lease uuid,
    p_from bigint, p_through bigint, p_pop_partition text, p_batch integer, p_after text)
RETURNS TABLE (outcome text, partition_id uuid, partition text, lease_id uuid,
               lease_expires_at timestamptz, "offset" bigint, transaction_id text,
               payload jsonb, created_at timestamptz, meta jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- (as queen.ack_head and queen.pop_head)
SET enable_seqscan = off
AS $fn$
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
$fn$;

-- A parked pop can wait for a timer's fire inside PostgreSQL.
--
-- Before an idle sweep fires a timer (the sweep is sent ahead of the due instant: see
-- queen.sweep_timers in timers.sql), the sweeper tells the broker's pops parked on that timer's
-- queue, and sends the sweep through queen.sweep_timers_for, which first takes an advisory lock
-- named after the queue (queen.fire_lock_key, timers.sql); the lock is held until the fire
-- commits. One parked pop sends queen.pop_head_after instead of its usual pop: it waits until
-- just before the due instant, then queues for a shared hold of that lock, which PostgreSQL
-- grants the moment the fire's commit is visible, and pops at once in a backend that is already
-- running. The frame leaves without waiting for a NOTIFY to reach the broker, the broker to
-- wake and a fresh statement to reach an idle backend. Waiting for a lock costs no CPU. If the
-- pop comes first (a late sweep), it pops at once, finds nothing and goes back to waiting for
-- the NOTIFY.
CREATE OR REPLACE FUNCTION queen.pop_head_after(
    p_tenant integer, p_queue text, p_group text, p_partition text, p_batch integer,
    p_auto_ack boolean, p_not_before float8, p_give_up float8)
RETURNS TABLE (outcome text, partition_id uuid, partition text, lease_id uuid,
               lease_expires_at timestamptz, "offset" bigint, transaction_id text,
               payload jsonb, created_at timestamptz, meta jsonb)
LANGUAGE plpgsql AS $fn$
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
$fn$;
