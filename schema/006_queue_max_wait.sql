-- 006 maxWaitTimeSeconds: Queen evicts a message that has waited longer than this (it is
-- deleted, not dead-lettered). Applied by the log's retention (queen.segment_droppable,
-- functions/ops.sql). 0: never.
ALTER TABLE queen.queues
    ADD COLUMN max_wait_s integer NOT NULL DEFAULT 0 CHECK (max_wait_s >= 0);
