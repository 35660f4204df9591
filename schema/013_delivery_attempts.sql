-- 013 delivery attempts (Queen's deliveryAttempt): how many times in a row a consumer group has
-- been handed the same batch of a partition. A lease records where its batch starts
-- (attempt_offset: the cursor's next offset when it was taken); a lease that starts where the
-- previous one did is a redelivery (a nack or a lease that ran out left the cursor there) and
-- counts one more attempt, a lease anywhere else is fresh work and counts 1. Telemetry only:
-- retryLimit is spent by failed acks (queen.retries), never by this.
ALTER TABLE queen.cursors
    ADD COLUMN attempt_offset bigint,
    ADD COLUMN attempt_count integer NOT NULL DEFAULT 0;
