-- 004 timers: one row per pending timer, outside the log until it fires.
--
-- visible_at is when a sweeper may next take the row: deliver_at at first; the claim's lease
-- expiry while a sweeper holds it (claim_token set); the retry time after a permanent failure.
-- A row is "claimed" (cancel/reschedule answer too_late) while claim_token is set and
-- visible_at is still in the future. The fire deletes the row only if claim_token is still the
-- firing sweeper's, in the transaction that appends the frame.

CREATE TABLE queen.timers (
    tenant_id     integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue         text        NOT NULL,
    timer_key     text        NOT NULL,
    partition     text        NOT NULL,
    txn           text        NOT NULL,
    payload       bytea       NOT NULL,  -- zstd-compressed JSON
    payload_bytes integer     NOT NULL,  -- its uncompressed size
    deliver_at    timestamptz NOT NULL,
    visible_at    timestamptz NOT NULL,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claim_token   uuid,
    claimed_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, queue, timer_key)
);

-- "The earliest visible_at" and "the next N due rows" are both a walk of this index.
CREATE INDEX timers_visible ON queen.timers (visible_at);
