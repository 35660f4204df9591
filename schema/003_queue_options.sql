-- 002 queue options: the configure options of Queen's v1 wire that this broker applies, a
-- failed message's redelivery hold, and a message ceiling that is the broker's setting unless a
-- plan lowers it.

-- maxSize: the most messages a queue holds that its queue-mode consumers (__QUEUE_MODE__) have
-- not consumed yet; a push that would go past it is refused whole (0: no limit).
-- retryDelay: milliseconds a failed message waits before it is handed out again (0: at once).
-- ttl: seconds after which a message expires; applied by retention like retentionSeconds (the
-- smaller non-zero of the two is the age limit). 0: none.
-- completedRetentionSeconds: consumed messages (every consumer group committed past them) older
-- than this are dropped, even without retentionSeconds. 0: none.
-- retentionEnabled: false turns off every age-based drop of the queue (retentionSeconds, ttl,
-- completedRetentionSeconds) without forgetting them.
ALTER TABLE queen.queues
    ADD COLUMN max_size              bigint  NOT NULL DEFAULT 0 CHECK (max_size >= 0),
    ADD COLUMN retry_delay_ms        integer NOT NULL DEFAULT 0 CHECK (retry_delay_ms >= 0),
    ADD COLUMN ttl_s                 integer NOT NULL DEFAULT 0 CHECK (ttl_s >= 0),
    ADD COLUMN completed_retention_s integer NOT NULL DEFAULT 0
        CHECK (completed_retention_s >= 0),
    ADD COLUMN retention_enabled     boolean NOT NULL DEFAULT true;

-- A failed acknowledgement under retryDelay holds the partition for its group until retry_at:
-- pops skip it until then (the failed frame is next in line, so nothing behind it could be
-- handed out anyway). NULL: no hold.
ALTER TABLE queen.cursors ADD COLUMN retry_at timestamptz;

-- The message ceiling is QUEEN_MAX_MESSAGE_BYTES; a plan may lower it for a tenant. NULL: the
-- plan does not lower it. 1048576 was both the old default and the old maximum, that is the
-- broker-wide ceiling of the time: such plans lower nothing and become NULL.
ALTER TABLE queen.tenants
    ALTER COLUMN max_message_bytes DROP NOT NULL,
    ALTER COLUMN max_message_bytes DROP DEFAULT,
    DROP CONSTRAINT tenants_max_message_bytes_check,
    ADD CONSTRAINT tenants_max_message_bytes_check CHECK (max_message_bytes >= 1);
UPDATE queen.tenants SET max_message_bytes = NULL WHERE max_message_bytes = 1048576;
