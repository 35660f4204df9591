-- 002 log: queues, partitions, frames, consumer cursors, dead letters.
--
-- A partition is a FIFO with dense offsets 0,1,2,…: pushers take offsets by bumping
-- partitions.next_offset under its row lock, so offsets commit (or roll back) together with the
-- frames that use them and there are never gaps. Reads of frames go through
-- queen.read_frames(), the one place that knows where a frame lives (the head table today;
-- sealed segments later), so storage can change without touching the API.

CREATE TABLE queen.queues (
    queue_id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id            integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    name                 text        NOT NULL,
    lease_time_s         integer     NOT NULL DEFAULT 300 CHECK (lease_time_s > 0),
    retry_limit          integer     NOT NULL DEFAULT 3 CHECK (retry_limit >= 0),
    delayed_processing_s integer     NOT NULL DEFAULT 0 CHECK (delayed_processing_s >= 0),
    retention_s          integer     NOT NULL DEFAULT 0 CHECK (retention_s >= 0),
    dead_letter_queue    boolean     NOT NULL DEFAULT true,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE queen.partitions (
    partition_id uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue_id     bigint      NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    name         text        NOT NULL,
    next_offset  bigint      NOT NULL DEFAULT 0,  -- offset the next pushed frame gets
    log_start    bigint      NOT NULL DEFAULT 0,  -- first retained offset
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
);
CREATE INDEX partitions_tenant ON queen.partitions (tenant_id, queue_id);

-- The head of the log: frames not (yet) sealed into a segment.
CREATE TABLE queen.frames (
    partition_id   uuid        NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    "offset"       bigint      NOT NULL,
    tenant_id      integer     NOT NULL,
    transaction_id text        NOT NULL,
    payload        jsonb       NOT NULL,
    size_bytes     integer     NOT NULL,  -- compact JSON bytes: what plans and storage count
    created_at     timestamptz NOT NULL DEFAULT now(),
    meta           jsonb,
    PRIMARY KEY (partition_id, "offset")
);
-- Acks and push de-duplication find a frame by its transactionId. Not unique: a timer that is
-- rescheduled after it fired may legitimately append a second frame with the same txn.
CREATE INDEX frames_transaction ON queen.frames (partition_id, transaction_id);

-- One row per (partition, consumer group): how far the group has committed, and the partition
-- lease of the consumer that popped last. A group that has never popped starts at log_start.
-- acked_ahead holds offsets completed past `committed` out of order (a batch acked 2 before 1),
-- so the cursor can jump over them once the gap closes. The lease is live while
-- lease_expires_at > now(); releasing it clears lease_expires_at but keeps lease_id, so late
-- acks of the batch it covered are still recognised.
CREATE TABLE queen.cursors (
    partition_id     uuid        NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    consumer_group   text        NOT NULL,
    tenant_id        integer     NOT NULL,
    committed        bigint      NOT NULL,  -- last offset done for this group (-1: none)
    acked_ahead      bigint[]    NOT NULL DEFAULT '{}',
    lease_id         uuid,
    lease_expires_at timestamptz,
    leased_to        bigint,                -- last offset handed out under the lease
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
);
CREATE UNIQUE INDEX cursors_lease ON queen.cursors (lease_id) WHERE lease_id IS NOT NULL;

-- Redelivery counts of frames that failed or whose lease expired, per group.
CREATE TABLE queen.retries (
    partition_id   uuid    NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    consumer_group text    NOT NULL,
    "offset"       bigint  NOT NULL,
    tenant_id      integer NOT NULL,
    retry_count    integer NOT NULL,
    last_error     text,
    PRIMARY KEY (partition_id, consumer_group, "offset")
);

CREATE TABLE queen.dead_letters (
    dead_letter_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue_id       bigint      NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    partition_id   uuid        REFERENCES queen.partitions ON DELETE CASCADE,
    consumer_group text        NOT NULL,
    "offset"       bigint,     -- null for frames that never had a position (timer failures)
    transaction_id text        NOT NULL,
    payload        jsonb       NOT NULL,
    size_bytes     integer     NOT NULL DEFAULT 0,
    frame_created_at timestamptz,
    retry_count    integer     NOT NULL DEFAULT 0,
    error          text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    replayed_at    timestamptz,
    replay_transaction_id text
);
CREATE INDEX dead_letters_listing ON queen.dead_letters (tenant_id, queue_id, consumer_group, dead_letter_id);

-- The one reader of frames: offsets [from_offset, from_offset + max_count) of a partition.
CREATE FUNCTION queen.read_frames(p_partition uuid, from_offset bigint, max_count integer)
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
