-- 010 a parked pop can wait for a timer's fire inside PostgreSQL.
--
-- Before an idle sweep fires a timer (the sweep is sent ahead of the due instant: schema 008),
-- the sweeper tells the broker's pops parked on that timer's queue, and sends the sweep through
-- queen.sweep_timers_for, which first takes an advisory lock named after the queue; the lock is
-- held until the fire commits. One parked pop sends queen.pop_head_after instead of its usual
-- pop: it waits until just before the due instant, then queues for a shared hold of that lock,
-- which PostgreSQL grants the moment the fire's commit is visible, and pops at once in a backend
-- that is already running. The frame leaves without waiting for a NOTIFY to reach the broker,
-- the broker to wake and a fresh statement to reach an idle backend. Waiting for a lock costs no
-- CPU. If the pop comes first (a late sweep), it pops at once, finds nothing and goes back to
-- waiting for the NOTIFY.

-- The lock's name: class 1363170306 (schema 009 uses ...305 for timer names), key from the queue.
CREATE FUNCTION queen.fire_lock_key(p_tenant integer, p_queue text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$ SELECT hashtext(p_tenant::text || ':' || p_queue) $fn$;

CREATE FUNCTION queen.sweep_timers_for(
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

CREATE FUNCTION queen.pop_head_after(
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
    RETURN QUERY SELECT * FROM queen.pop_head(p_tenant, p_queue, p_group, p_partition, p_batch,
                                              p_auto_ack);
END
$fn$;
