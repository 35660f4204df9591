-- The timers' functions: scheduling by name, the sweep that fires due timers inside PostgreSQL,
-- and the broker's half of a fire. Applied by the migrator after the numbered migrations
-- whenever this file changes (schema/README.md): edit a body here in place; a dropped function
-- or a changed signature needs a numbered migration as well.
--
-- The table is queen.timers (schema/001_baseline.sql), whose header says what visible_at and a
-- claim mean.

-- Scheduling ----------------------------------------------------------------------------------

-- Schedules and cancels of one timer wait for each other; only a fire answers too_late.
--
-- A schedule or cancel skips a timer row that is locked (FOR UPDATE SKIP LOCKED) and answers
-- too_late, because a sweeper firing the timer holds that lock and must never be waited for.
-- But another schedule or cancel of the same timer, still uncommitted, holds the same row lock,
-- and two clients rescheduling one name at the same moment would get too_late although nothing
-- was being fired. So every schedule and cancel first takes a transaction-level advisory lock on
-- the timer's name (in one order, so concurrent bundles cannot deadlock on them): they queue
-- behind each other there, and a row lock still in the way can only be a sweeper's.
--
-- Advisory locks of the form (class, hash): this class is timer names. A hash collision only
-- makes two unrelated schedules wait for each other.
-- The hash of one timer's name in that class: the one spelling of it, for the set-based
-- functions and the single-timer ones alike (a second spelling that drifted would let a lone
-- schedule and a bundle decide one name at once). Inlined where it is called.
CREATE OR REPLACE FUNCTION queen.timer_name_hash(p_tenant integer, p_queue text, p_key text)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT hashtext(p_tenant::text || '/' || length(p_queue)::text || '/' || p_queue || '/' || p_key)
$fn$;

CREATE OR REPLACE FUNCTION queen.lock_timer_names(p_tenant integer, p_queues text[], p_keys text[])
RETURNS void
-- PL/pgSQL, not SQL: a SQL function's statement was parsed and planned again in every
-- transaction that called it (about a tenth of a millisecond, for every bundle); this one's
-- plan is kept for the session.
LANGUAGE plpgsql AS $fn$
BEGIN
    -- One statement: the locks are taken as the sorted rows go by.
    PERFORM count(pg_advisory_xact_lock(1363170305, h.name))
    FROM (SELECT DISTINCT queen.timer_name_hash(p_tenant, u.q, u.k) AS name
          FROM unnest(p_queues, p_keys) AS u(q, k)
          ORDER BY 1) AS h;
END
$fn$;

-- What storing timers implies besides their rows, for queen.schedule_timers' two paths: the
-- queues of the timers stored (p_queues, repeats allowed) exist, the change of stored bytes is
-- recorded, and when one is due soon (p_soonest, or NULL) the sweepers are woken by a NOTIFY
-- (sent only if the caller commits). Sweepers look again within MAX_SLEEP anyway; only sooner
-- timers need a wake-up. The due instant goes in epoch microseconds: a sweeper woken even a
-- fraction of a millisecond early finds nothing due and then owes a whole MIN_SLEEP.
CREATE OR REPLACE FUNCTION queen.timers_stored(
    p_tenant integer, p_queues text[], p_delta bigint, p_soonest timestamptz)
RETURNS void
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- Schedules (creates or replaces) timers of one tenant in one statement, the caller's
-- transaction deciding their fate: an upsert decided under the rows' locks, never waiting on a
-- row a sweeper holds (that one answers too_late), as is a row under a live claim. The timer
-- names' locks (queen.lock_timer_names) are taken first. Answers one row per input, by position
-- (ord, 1-based), with the message id minted for each scheduled timer (a reschedule takes a new
-- one: it is a new timer under an old name): a version 7 UUID, its first 48 bits the Unix time
-- in milliseconds of the call, then random bits (PostgreSQL 18's uuidv7(), spelled for older
-- servers). Also creates the queues of new timers, records the change of stored bytes and, for
-- a timer due within p_notify_within_ms, wakes the sweepers with a NOTIFY (sent only if the
-- caller commits).
--
-- The timers come as parallel arrays, one element per timer (queen_trio/timers/store.py
-- writes each array's text in C, as msgspec writes a JSON array: PostgreSQL's array input
-- reads that as it is): queue, key, partition, txn, delayMs, the payload's JSON size, the
-- payload as it is stored (p_payloads: its JSON text, or base64 of its zstd bytes where
-- p_zstd). Ten arrays that psycopg adapted element by element cost the broker more than the
-- statement costs PostgreSQL; a JSON array of objects costs PostgreSQL a hash table per object
-- to read (json_to_recordset), where array input reads a text per element.
--
-- p_attempt 0 is a first attempt whose caller takes a short answer when every timer was new
-- (the usual bundle): one row, ord 0, status 'scheduled', txn NULL, message_id the call's base
-- id, deliver_at now(); timer i's message id is then the base id with i XORed into its last
-- 64 bits, its due instant now() plus its delay, its txn the one it was given. Making,
-- sending and reading a row per timer cost PostgreSQL and the broker more than the broker's
-- writing those answers itself. Any other answer is a row per timer, as for p_attempt 1 (the
-- default, a previous release's broker's).
--
-- enable_seqscan = off: the look-up of existing timers always uses the primary key. A PL/pgSQL
-- statement's plan is cached per connection and, after a few calls, kept as a generic plan; one
-- made while the table was nearly empty (a broker's first schedules, or statistics taken then)
-- probes with a sequential scan, the cheapest way to read one page. The table then grows and
-- every probe reads all of it: in a benchmark, bundles of 500 timers went from 12 ms to 1.3-2.3 s
-- each once 30,000 timers were pending (auto_explain: "Seq Scan on timers" inside the function),
-- until a new ANALYZE invalidated the plan. With sequential scans off inside the function, every
-- plan it makes probes the index, whatever the statistics said when it was made.
CREATE OR REPLACE FUNCTION queen.schedule_timer_list(
    p_tenant integer, p_queues text[], p_keys text[], p_partitions text[], p_txns text[],
    p_delays bigint[], p_sizes integer[], p_payloads text[], p_zstd boolean[],
    p_notify_within_ms bigint, p_attempt integer DEFAULT 1)
RETURNS TABLE (ord integer, status text, txn text, message_id uuid, deliver_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
-- Its statements' parameters are arrays and scalars whose values never change a good plan:
-- planned once per connection, not again at every call (a custom plan each time cost more
-- than a bundle of a few timers itself).
SET plan_cache_mode = force_generic_plan
AS $fn$
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
$fn$;


-- The same, the timers as one JSON array of objects: {"q": queue, "k": key, "p": partition,
-- "t": txn, "d": delayMs, "b": JSON size, and "j": the payload's JSON text as it is stored, or
-- "z": base64 of its zstd bytes} (queen.schedule_timer's retry, and a broker of the previous
-- release during a rolling upgrade).
CREATE OR REPLACE FUNCTION queen.schedule_timers(
    p_tenant integer, p_timers json, p_notify_within_ms bigint, p_attempt integer DEFAULT 1)
RETURNS TABLE (ord integer, status text, txn text, message_id uuid, deliver_at timestamptz)
LANGUAGE sql AS $fn$
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
$fn$;

-- One timer (the usual PUT, a batch of one op, a bundle's lone timer): what schedule_timers
-- decides for a list of one, in a few straight-line statements. The set-based statement costs
-- PostgreSQL some 300 µs to start up whatever its size (a dozen plan nodes, sorts and hash
-- tables: bench/results/timer_pg_cost.md); these cost a few key probes. Same locks, same
-- answers: the name's lock first, a row a sweeper holds (locked, or under a live claim) is
-- too_late, an existing one is rescheduled under its row lock, a new one inserted. The payload
-- comes as stored (p_zstd says how), its JSON size as p_bytes.
CREATE OR REPLACE FUNCTION queen.schedule_timer(
    p_tenant integer, p_queue text, p_key text, p_partition text, p_txn text, p_delay_ms bigint,
    p_bytes integer, p_payload bytea, p_zstd boolean, p_notify_within_ms bigint,
    OUT ord integer, OUT status text, OUT txn text, OUT message_id uuid,
    OUT deliver_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off  -- (every probe by the primary key: see schedule_timers)
SET plan_cache_mode = force_generic_plan  -- (parameters only, never worth re-planning)
AS $fn$
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
$fn$;

-- timers has no foreign key to tenants (its per-row check was the costliest step of scheduling
-- a bundle: schema/012_schedule_timers_json.sql). What the key did besides, the cascade when a
-- tenant is deleted, is kept by this one statement-level trigger.
CREATE OR REPLACE FUNCTION queen.delete_tenants_timers() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM queen.timers t USING gone g WHERE t.tenant_id = g.tenant_id;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER tenants_delete_timers AFTER DELETE ON queen.tenants
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION queen.delete_tenants_timers();

-- Cancels timers of one tenant in one statement (the caller's transaction deciding their fate),
-- after the timer names' locks (queen.lock_timer_names): a pending timer is deleted (cancelled,
-- with its stored txn); a timer a sweeper holds (its row locked by a fire, or under a live
-- claim) is left alone (too_late, with its stored txn); no timer is absent, with the txn the
-- caller gave (p_txns, NULL for none): absent may mean "already delivered", and the log is the
-- authority on that. Answers one row per input, by position (ord, 1-based). The keys must be
-- distinct. Records the change of stored bytes.
CREATE OR REPLACE FUNCTION queen.cancel_timers(
    p_tenant integer, p_queues text[], p_keys text[], p_txns text[])
RETURNS TABLE (ord integer, status text, txn text)
LANGUAGE plpgsql
SET enable_seqscan = off  -- (the key probes always use the primary key: see schedule_timers)
SET plan_cache_mode = force_generic_plan  -- (planned once per connection: see schedule_timers)
AS $fn$
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
$fn$;

-- One timer (DELETE /api/v1/timers/{queue}/{key}): what cancel_timers decides for a list of
-- one, in a few straight-line statements (see schedule_timer for why).
CREATE OR REPLACE FUNCTION queen.cancel_timer(
    p_tenant integer, p_queue text, p_key text, p_txn text,
    OUT ord integer, OUT status text, OUT txn text)
LANGUAGE plpgsql
SET enable_seqscan = off  -- (the key probes always use the primary key: see schedule_timers)
SET plan_cache_mode = force_generic_plan  -- (parameters only, never worth re-planning)
AS $fn$
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
$fn$;

-- Firing --------------------------------------------------------------------------------------
--
-- Timers are fired by PostgreSQL itself, in the statement that finds them due. A fire used to
-- be two transactions and half a dozen round trips from the broker: claim the due rows under a
-- lease, then delete them and append their frames. Most payloads are small JSON that zstd
-- cannot shrink, so they are stored as their JSON text (payload_zstd = false) and the
-- sweeper's one statement, queen.sweep_timers, appends their frames and deletes their rows
-- while it holds the rows' locks: one round trip and one commit per cycle. Rows whose payload
-- is compressed (or over the tenant's ceiling) are still claimed under a lease and fired by the
-- broker, which decompresses them, through queen.fire_claimed_timers.
--
-- While the sweep statement runs, its row locks stand in for the claim: a cancel or a
-- reschedule skips a locked row and answers too_late, exactly as for a leased claim.

-- A fired timer's frame meta: its message id (the id its pops hand out) and the timer's key
-- and deliverAt (UTC, microseconds), as pops answer them. The one place of that shape for both
-- appends (queen.append_timer_frames, queen.sweep_take's one-partition fire); an SQL function
-- whose body is one expression, so the planner inlines it into the INSERT (STABLE, as to_char).
CREATE OR REPLACE FUNCTION queen.timer_frame_meta(p_message_id uuid, p_key text,
                                                  p_deliver_at timestamptz) RETURNS jsonb
LANGUAGE sql STABLE AS $fn$
    SELECT jsonb_build_object('messageId', p_message_id, 'timer', jsonb_build_object(
        'key', p_key,
        'deliverAt', to_char(p_deliver_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
$fn$;

-- Appends timer frames to their partitions (creating queues and partitions as needed), in the
-- order of the arrays, which is the order of expiry. The caller has already deleted the rows.
-- Each frame carries its timer's message id (meta.messageId, the id its pops hand out).
-- Mirrors the log's push path (queen_trio/sql/log.sql insert_frames): dense offsets taken
-- under the partition row locks, locked in partition_id order like every pusher. A timer's
-- frame is never stamped before its deliverAt: a staged fire (queen.sweep_timers) writes the
-- frame just before the instant, and it becomes visible after it.
CREATE OR REPLACE FUNCTION queen.append_timer_frames(
    p_tenants integer[], p_queues text[], p_keys text[], p_partitions text[], p_txns text[],
    p_message_ids uuid[], p_texts text[], p_payload_bytes integer[], p_deliver_at timestamptz[])
RETURNS integer  -- frames appended
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- The sweep waits for its instant inside PostgreSQL.
--
-- On this kind of machine a process that has been idle for a few milliseconds runs its next
-- piece of work about twice as slowly (cold caches, a halted virtual CPU to wake), and a sweep
-- at a timer's due instant always follows an idle spell. So the sweeper sends its statement a
-- little before the instant, and queen.sweep_timers waits for it in the backend: it sleeps
-- until about a millisecond before (pg_sleep rounds up to whole milliseconds) and spins the
-- rest on clock_timestamp(). The backend is running when the instant comes instead of being
-- woken by a packet.
--
-- The instant a sweep was asked to wait for, as a timestamp; NULL or past: at once. Waits at
-- most 100 ms: a sweeper never plans further ahead than a few milliseconds, and a bad clock
-- estimate must not hold a connection.
CREATE OR REPLACE FUNCTION queen.wait_until(p_epoch float8) RETURNS timestamptz
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- How long before its instant a planned sweep does its work: about what the work takes on an
-- idle machine, so that the commit lands at the instant rather than after it.
CREATE OR REPLACE FUNCTION queen.sweep_lead_s() RETURNS float8
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 0.001::float8 $fn$;

-- The sweep's floor ------------------------------------------------------------------------
--
-- Why every sweep starts at a floor rather than at the beginning of timers_visible: a fired
-- timer's row is deleted, and its index entry stays in timers_visible, at the low end where
-- every sweep starts, until vacuum removes it. Scans mark such entries dead and skip them
-- afterwards, but only once the row is dead to every snapshot: while any snapshot older than
-- the fire is held (a long report, pg_dump, a replica with hot_standby_feedback) each sweep
-- stepped through the entries of every timer fired since, and visited their rows. Measured
-- (bench/timer_scale.py, a REPEATABLE READ snapshot held 3 min under 300 timers/s): shared
-- buffers per sweep 625 -> 4,257, lag p99 70 -> 273 ms, growing with the snapshot's age. From
-- a floor below which no timer is pending, a sweep steps over only what was fired since the
-- floor last moved: about one sweep's batch, however old the oldest snapshot.
--
-- The floor (queen.timer_sweep_floor, epoch microseconds) is a lower bound of the visible_at
-- of every timer, pending now or written later. Each sweep raises it (queen.advance_sweep_floor)
-- to the least of, read in one statement (one snapshot):
--   * the earliest visible_at it can see at or above the current floor (locked rows included:
--     a sweep that rolls back leaves its rows where they were);
--   * the clock, read before that snapshot: a transaction that takes its transaction id later
--     writes no visible_at below the clock it reads then (the trigger below);
--   * the start of every transaction of this database holding a transaction id, read before
--     that snapshot (a lone writer's id can be at or above the snapshot's xmax, so the
--     snapshot's own list of transactions in progress misses it: timers were left below the
--     floor that way); and if the snapshot lists one that read did not see, the floor stays.
-- A value once right stays right, so concurrent sweepers may each write theirs. A transaction
-- that holds a transaction id for a long time (anything writing to this database) holds the
-- floor at its start for that long; prepared transactions (two-phase commit) hold it until
-- they end.

-- The floor's current value, a millisecond below what was written (to_timestamp's rounding).
-- STABLE so a scan can start at it (its value may move within a statement: any value is safe).
-- PL/pgSQL: an SQL body is checked against the tables when it is created, and the migrator
-- applies this file after an older subset of migrations too (before 010 made the sequence).
-- pg_sequence_last_value (NULL until the first setval: then the sequence's START, 0), not a
-- SELECT from the sequence: an expression PL/pgSQL evaluates without the executor, where the
-- query was a plan of its own, started at every call (three a sweep). That plan also took
-- the settings of the session's first caller: made inside queen.sweep_take (sequential scans
-- off, and a sequence can only be scanned so) it would cost 10^10, and PostgreSQL would
-- compile it with JIT at every call after (some 20 ms each: seen while reordering the calls).
CREATE OR REPLACE FUNCTION queen.sweep_floor() RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN to_timestamp(coalesce(pg_sequence_last_value('queen.timer_sweep_floor'::regclass), 0)
                        / 1000000.0) - interval '1 millisecond';
END
$fn$;

-- Raises (or sets) the floor as described above; answers it. A floor less than 50 ms behind
-- the clock (and not ahead of it) is left as it is: it was raised moments ago, and a sweep from
-- it steps over no more than the timers fired since (their index entries). Raising it costs
-- more than the rest of a small sweep's bookkeeping (reading every backend's state above all),
-- and under a steady flow sweeps come every 10 ms (MIN_SLEEP) with the floor a cycle behind
-- (at the oldest timer not yet fired): it is now raised at about every fourth one. Under a
-- held snapshot, where those entries cannot be cleaned, a sweep steps over at most 50 ms of
-- fires more (25 entries at a steady 500 timers/s). A floor ahead of the clock (the clock
-- stepped back) is recomputed at once, so it comes down to the clock as before.
CREATE OR REPLACE FUNCTION queen.advance_sweep_floor() RETURNS timestamptz
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- Every write of a visible_at that is due (or nearly) is raised to the clock read after the
-- writer's transaction id exists: a sweep whose snapshot did not list the writer read its own
-- clock before that, so the row is not below the floor that sweep sets. A timer scheduled with
-- a delay in the past keeps its deliver_at (the instant asked for) and fires at once. Rows due
-- more than a minute ahead are left as they are: above any floor a sweep can set before the
-- writer commits.
CREATE OR REPLACE FUNCTION queen.timers_visible_above_floor() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_current_xact_id();
    NEW.visible_at := greatest(NEW.visible_at, clock_timestamp());
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE TRIGGER timers_visible_above_floor
    BEFORE INSERT OR UPDATE OF visible_at ON queen.timers
    FOR EACH ROW WHEN (NEW.visible_at < clock_timestamp() + interval '1 minute')
    EXECUTE FUNCTION queen.timers_visible_above_floor();

-- One sweep's work at the instant p_now: lock up to p_batch due rows, fire the leading run
-- PostgreSQL can fire itself (when p_fire), claim the rest. Raises (data_exception, say) if a
-- payload taken for a direct fire cannot become a frame; the caller (queen.sweep_run) runs
-- it inside an EXCEPTION block. Answers one composite value (called as an expression, it
-- starts no executor of its own, as reading a set-returning function through a SELECT did):
-- the instant and tenant of each timer fired, in the order of expiry, and the rows claimed for
-- the broker as arrays of their columns (NULL when none).
--
-- Why the lock, the fire and the claims are all made here, by the one (sub)transaction of the
-- caller's EXCEPTION block: so that a fired timer's row leaves an index entry the next scan can
-- skip for good. Under a steady flow (1,000 timers/s) each sweep used to take longer than the
-- one before: 1 ms with an empty history, 9 ms once 27,000 fired timers had been deleted since
-- the last vacuum. Every scan of timers_visible (the due rows, the next due time) stepped
-- through the index entries of all the rows fired since then and visited their heap tuples,
-- every time. An index scan marks the entry of a tuple it finds dead to everyone, and later
-- scans skip such entries without visiting the heap (and inserts reclaim them). It cannot do so
-- when the deleting transaction is recorded as a MultiXact, and that is what a sweep left when
-- it locked the due rows (FOR UPDATE) in its transaction and deleted them inside the EXCEPTION
-- block, a subtransaction: each deleted row carried both the lock and the delete. If a payload
-- cannot become a frame, the block is rolled back whole and the due rows are locked again and
-- all claimed for the broker.
CREATE OR REPLACE FUNCTION queen.sweep_take(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_now timestamptz, p_floor timestamptz,
    OUT fired_at timestamptz[], OUT fired_tenants integer[],
    OUT claimed_tenants integer[], OUT claimed_queues text[], OUT claimed_keys text[],
    OUT claimed_partitions text[], OUT claimed_txns text[], OUT claimed_payloads bytea[],
    OUT claimed_zstd boolean[], OUT claimed_bytes integer[],
    OUT claimed_deliver_at timestamptz[], OUT claimed_attempts integer[],
    OUT claimed_due_at timestamptz[])
LANGUAGE plpgsql
-- Planned once per connection (its statements' parameters are ctids, arrays and instants whose
-- values never change a good plan): the fire's DELETE was planned afresh at every sweep, a
-- custom plan each time (170 µs of a 7-timer sweep's 1.1 ms at a steady 500/s, bench.pg_path).
-- Sequential scans off: no plan made while a table was nearly empty reads all of it once it has
-- grown (as queen.schedule_timers).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
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
$fn$;

-- One sweeper cycle in one statement (run it in autocommit: it is its own transaction).
--
-- Takes up to p_batch due rows no other sweeper holds, in order of visible_at. The leading run
-- of rows PostgreSQL can fire itself (JSON text within the tenant's ceiling) is fired here when
-- p_fire: frames appended, rows deleted, committed together. From the first row that needs the
-- broker on, rows are claimed under a lease (visible_at = the sweep's instant + lease,
-- claim_token) and returned with fired = false, so the broker fires them in order after these.
-- Answers one row per fired timer (fired = true, deliver_at only), one per claimed timer, and
-- one clock row (fired IS NULL) with the earliest visible_at left (next_due, and that timer's
-- tenant_id, queue and partition) and the database's clock. A row that cannot become a frame
-- (a malformed stored payload, or any error but the database's own trouble) undoes the direct
-- fire and falls back to claiming every row, so the broker spends that timer's attempt and
-- fires the others. The work itself is queen.sweep_take's (through queen.sweep_run).
--
-- p_not_before (epoch seconds, the database's clock; NULL: at once) is the instant the sweep
-- was planned for, and the fire is staged just ahead of it and committed at it. An idle sweep
-- is sent ahead of its timer's instant and the backend waits for it (queen.wait_until). If it
-- then did the whole fire at the instant (lock the due rows, delete them, append the frames,
-- then the commit), that took 0.5-0.9 ms on this kind of machine, and every consumer waited for
-- it. So the backend does that work a millisecond (queen.sweep_lead_s) before the instant,
-- waits for the instant with the rows locked, and returns, so the commit follows the instant by
-- microseconds. Nothing becomes visible before the instant: the frames and the deletions are
-- one transaction, committed after it. A cancel or reschedule of one of these rows in that last
-- millisecond finds it locked and answers too_late, as it does for any timer a broker is
-- firing. What is due is decided by the instant the sweep was planned for (the rows due by
-- then), not by the clock read after the wait.
-- The work is queen.sweep_run's, which answers one composite value: the fires, the claims as
-- arrays of their columns, the clock row's values. Called as an expression it starts no
-- executor of its own; queen.sweep_timers hands its answer out as rows, and the sweep of a
-- steady flow (queen.sweep_settle_and_pop) calls it itself: each set-returning layer the rows
-- went through (sweep_settle_and_pop, sweep_timers, the fire itself) was a query started and
-- its rows materialised, per sweeper cycle.
CREATE OR REPLACE FUNCTION queen.sweep_run(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8,
    OUT fired_at timestamptz[], OUT fired_tenants integer[],
    OUT claimed_tenants integer[], OUT claimed_queues text[], OUT claimed_keys text[],
    OUT claimed_partitions text[], OUT claimed_txns text[], OUT claimed_payloads bytea[],
    OUT claimed_zstd boolean[], OUT claimed_bytes integer[],
    OUT claimed_deliver_at timestamptz[], OUT claimed_attempts integer[],
    OUT claimed_due_at timestamptz[],
    OUT next_tenant integer, OUT next_queue text, OUT next_partition text,
    OUT next_due float8, OUT db_now float8)
LANGUAGE plpgsql AS $fn$
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
$fn$;

CREATE OR REPLACE FUNCTION queen.sweep_timers(
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- The fire lock a parked pop waits behind (queen.pop_head_after in log.sql says why): class
-- 1363170306 (queen.lock_timer_names uses ...305 for timer names), key from the queue.
CREATE OR REPLACE FUNCTION queen.fire_lock_key(p_tenant integer, p_queue text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$ SELECT hashtext(p_tenant::text || ':' || p_queue) $fn$;

-- queen.sweep_timers holding the fire lock of one queue until the fire commits: the sweeper
-- sends this when it has told the broker's pops parked on that queue of the coming fire.
CREATE OR REPLACE FUNCTION queen.sweep_timers_for(
    p_lock_tenant integer, p_lock_queue text,
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- queen.sweep_timers_for, then, in the same transaction, queen.pop_head for one pop parked in
-- this broker on the announced queue (the broker reserved it before sending this): the frame,
-- its timer's deletion and the pop's lease commit together, and the broker hands the popped
-- rows to that pop itself. The frame reaches its consumer when the sweep's answer reaches the
-- broker, instead of after the lock's release wakes a waiting backend that then pops. The pop
-- runs after the instant (queen.sweep_timers returns at it), so it takes nothing the consumer
-- could not have taken by then. Its rows come back as one jsonb array in one last row (fired
-- and popped both NULL on the clock row, popped set on this one, with the clock read again
-- after the pop); the broker releases the lease (no retry spent) if its pop has gone
-- meanwhile.
CREATE OR REPLACE FUNCTION queen.sweep_timers_and_pop(
    p_lock_tenant integer, p_lock_queue text,
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8,
    p_pop_group text, p_pop_partition text, p_pop_batch integer, p_pop_auto_ack boolean,
    p_pop_commit text)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8, popped jsonb)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- queen.sweep_timers_and_pop for a streaming consumer's pop that also carries the settlement of
-- the batch it was handed last (queen_trio/api/stream.py): that batch completed whole, applied
-- as queen.settle_pop_head applies it (the offset commit through p_settle_through while the
-- cursor is as the batch's pop left it), then the pop, all in the fire's transaction. Under a
-- steady flow a consumer's cycle is then one statement (the fire, the last batch's settlement
-- and the next batch), not two (the fire and pop, then the settlement and a pop that finds
-- nothing and parks). The settlement waits for this sweep only briefly: the broker applies it
-- alone if no sweep takes it within milliseconds.
--
-- Without a settlement (p_settle_partition NULL) it is the pop alone, for a stream's pop
-- whose settlement went its own way: the answer below says whether it drained the queue.
--
-- The last row's popped is an object: rows (queen.pop_head's rows, or queen.settle_pop_head's),
-- settled (false: the settlement's case needs the broker's general ack, nothing of it was
-- applied and the pop ran alone), pid (this backend: the queue's NOTIFY below comes from it),
-- and drained: the pop took fewer than its batch and nothing else of the queue is poppable for
-- the group (queen.next_look), so that NOTIFY is no news to this pop. The queue is NOTIFYed
-- once whatever happened (a transaction's identical NOTIFYs are delivered once): the broker
-- then knows which NOTIFY came from this sweep. With a settlement applied or a lease taken, the
-- commit waits for the disk as the broker's settlements and pops of a stream do (p_ack_commit:
-- 'off' under QUEEN_POP_COMMIT=async, NULL as the server is configured), the fire's with them:
-- by default the frame reaches an idle consumer a WAL flush sooner; otherwise it is left as the
-- sweep leaves it.
CREATE OR REPLACE FUNCTION queen.sweep_settle_and_pop(
    p_lock_tenant integer, p_lock_queue text,
    p_token uuid, p_broker text, p_batch integer, p_lease_ms integer, p_max_payload integer,
    p_fire boolean, p_not_before float8,
    p_pop_group text, p_pop_partition text, p_pop_batch integer,
    p_settle_partition uuid, p_settle_lease uuid, p_settle_from bigint,
    p_settle_through bigint, p_after text, p_ack_commit text)
RETURNS TABLE (fired boolean, tenant_id integer, queue text, timer_key text, partition text,
               txn text, payload bytea, payload_zstd boolean, payload_bytes integer,
               deliver_at timestamptz, attempts integer, due_at timestamptz,
               next_due float8, db_now float8, popped jsonb)
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- The broker's half of a fire, for rows it claimed: deletes those still carrying its claim
-- token and appends their frames (payload texts decompressed by the broker), in one
-- statement. Answers the keys it fired; the others were taken over after the lease expired.
CREATE OR REPLACE FUNCTION queen.fire_claimed_timers(
    p_token uuid, p_tenants integer[], p_queues text[], p_keys text[], p_texts text[])
RETURNS TABLE (tenant_id integer, queue text, timer_key text)
LANGUAGE plpgsql AS $fn$
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
$fn$;
