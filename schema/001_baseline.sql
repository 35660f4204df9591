-- 001 baseline: the schema queen's tables, indexes and the default tenant.
--
-- Functions, trigger functions and their triggers are not here: each lives, with its current
-- body, in schema/functions/<area>.sql, which the migrator applies after the numbered files
-- (schema/README.md). Columns are in the order existing databases have them: some were added
-- to their table later, so they come last.

CREATE SCHEMA IF NOT EXISTS queen;

-- Tenants -------------------------------------------------------------------------------------

-- Every other table of the broker carries a tenant_id referencing this table: tenants are the
-- unit of isolation. With QUEEN_AUTH=off every request belongs to the tenant named 'default'.
-- A plan: the message ceiling, the storage gate and the request-rate quota. NULL = unlimited.
CREATE TABLE queen.tenants (
    tenant_id  integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE
               CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    max_message_bytes   integer NOT NULL DEFAULT 1048576
        CHECK (max_message_bytes BETWEEN 1 AND 1048576),
    max_stored_bytes    bigint CHECK (max_stored_bytes >= 0),
    requests_per_second integer CHECK (requests_per_second >= 1),
    plan_updated_at     timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.tenants (name) VALUES ('default');

-- Bearer tokens: shown once at creation, stored as a salted SHA-256 of the secret part. The
-- prefix (public, unique) finds the row; the hash is compared in constant time.
CREATE TABLE queen.tenant_tokens (
    token_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    prefix     text        NOT NULL UNIQUE,
    salt       bytea       NOT NULL,
    hash       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- Stored bytes per tenant, for the storage gate. Writers append deltas (no hot row to fight
-- over); the broker folds them into tenant_usage every second.
CREATE TABLE queen.usage_deltas (
    tenant_id integer NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    bytes     bigint  NOT NULL
);
CREATE TABLE queen.tenant_usage (
    tenant_id    integer PRIMARY KEY REFERENCES queen.tenants ON DELETE CASCADE,
    stored_bytes bigint  NOT NULL DEFAULT 0
);

-- The log -------------------------------------------------------------------------------------
--
-- A partition is a FIFO with dense offsets 0,1,2,…: pushers take offsets by bumping
-- partitions.next_offset under its row lock, so offsets commit (or roll back) together with the
-- frames that use them and there are never gaps. A partition's log is [log_start, next_offset):
-- sealed segments first, then the head (queen.frames). The broker's housekeeping seals a range
-- in one transaction that inserts the segment and deletes the head rows it replaces, so a frame
-- is always in exactly one of them. PostgreSQL cannot decompress zstd, so frames are read
-- through the broker (queen_trio/log/frames.py), which knows head from segment;
-- queen.read_frames() (functions/log.sql) reads the head.

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
    -- "Drop a segment only once every consumer group of the partition has committed past it."
    retain_until_consumed boolean    NOT NULL DEFAULT false,
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
--
-- No foreign key to partitions: its per-row check cost more than the insert itself (of a
-- 500-timer fire's 29 ms, 14 were RI triggers, one per frame) and added no safety, as every
-- writer of frames (a push, a fire) holds its partition row locked FOR UPDATE. What the key did
-- besides, the cascade when a partition (queue, tenant) is deleted, is kept by the statement
-- trigger partitions_delete_frames (functions/log.sql).
CREATE TABLE queen.frames (
    partition_id   uuid        NOT NULL,
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

-- Sealed segments: older contiguous ranges of a partition, immutable and zstd-compressed;
-- retention drops whole segments and advances partitions.log_start. The triggers that keep
-- them immutable are in functions/segments.sql.
CREATE TABLE queen.segments (
    partition_id     uuid        NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    first_offset     bigint      NOT NULL,
    last_offset      bigint      NOT NULL,  -- inclusive
    -- No key of its own to tenants: segments go with their partition (the immutability trigger
    -- lets them go only once their partition is gone or log_start has passed them).
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

-- KV state ------------------------------------------------------------------------------------

CREATE TABLE queen.kv (
    tenant_id  integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    size_bytes integer     NOT NULL,
    expires_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, namespace, key)
);
-- The purge task's scan: only keys that can expire.
CREATE INDEX kv_expiry ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- Timers --------------------------------------------------------------------------------------
--
-- One row per pending timer, outside the log until it fires.
--
-- visible_at is when a sweeper may next take the row: deliver_at at first; the claim's lease
-- expiry while a sweeper holds it (claim_token set); the retry time after a permanent failure.
-- A row is "claimed" (cancel/reschedule answer too_late) while claim_token is set and
-- visible_at is still in the future. The fire deletes the row only if claim_token is still the
-- firing sweeper's, in the transaction that appends the frame.
--
-- Most payloads are small JSON that zstd cannot shrink: they are stored as their JSON text
-- (payload_zstd = false), and PostgreSQL fires such rows itself inside the sweep statement
-- (queen.sweep_timers, functions/timers.sql). Rows whose payload is compressed (or over the
-- tenant's ceiling) are claimed under a lease and fired by the broker, which decompresses them.
CREATE TABLE queen.timers (
    tenant_id     integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue         text        NOT NULL,
    timer_key     text        NOT NULL,
    partition     text        NOT NULL,
    txn           text        NOT NULL,
    payload       bytea       NOT NULL,
    payload_bytes integer     NOT NULL,  -- its uncompressed size
    deliver_at    timestamptz NOT NULL,
    visible_at    timestamptz NOT NULL,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claim_token   uuid,
    claimed_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    payload_zstd  boolean     NOT NULL DEFAULT true,
    PRIMARY KEY (tenant_id, queue, timer_key)
);
COMMENT ON COLUMN queen.timers.payload IS
    'the payload''s compact JSON text, zstd-compressed when payload_zstd';

-- "The earliest visible_at" and "the next N due rows" are both a walk of this index.
CREATE INDEX timers_visible ON queen.timers (visible_at);
-- After transient trouble during a fire, a broker hands its claimed rows back at once
-- (release_claim: every row carrying its claim token) rather than leaving them to the lease.
-- Without this index that statement read the whole timers table: with a million timers
-- pending, a long scan at the moment the database has just come back. Only claimed rows carry a
-- token (a fire deletes them, a failure clears it), so the partial index stays a handful of
-- entries.
CREATE INDEX timers_claim_token ON queen.timers (claim_token) WHERE claim_token IS NOT NULL;
