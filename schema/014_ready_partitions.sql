-- 014 the ready set: which partitions of a queue have messages past a consumer group's cursor,
-- so that a pop chooses a partition by walking an index, not every partition of the queue
-- (Queen's bootstrap tests pop queues of 5,000 partitions; issue 30).
--
-- queen.ready holds (partition, group) for every partition with frames past the group's cursor
-- (or, for a partition the group has no cursor on yet, with frames at all), and possibly some
-- that have none left (stale rows: the pops that walk past them remove them, see
-- queen.drop_stale_ready). served_at is when the group's cursor there last changed: walking
-- (queue, group, served_at) serves the least recently served partition first, as before.
-- Who writes it: schema/functions/ready.sql.
CREATE TABLE queen.ready (
    partition_id uuid NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    consumer_group text NOT NULL,
    queue_id bigint NOT NULL,
    served_at timestamptz NOT NULL DEFAULT '-infinity',  -- never served: first
    PRIMARY KEY (partition_id, consumer_group)
);
CREATE INDEX ready_walk ON queen.ready (queue_id, consumer_group, served_at, partition_id);

-- The consumer groups a queue's pushes mark partitions ready for, cursor or not: a group is
-- registered by its first pop of the queue (or a seek), which also marks what is there already.
CREATE TABLE queen.queue_groups (
    queue_id bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    consumer_group text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);

-- What exists already: every group with a cursor on a queue is registered there, and every
-- partition with frames past a registered group's cursor (or with frames, where it has none)
-- is ready for it.
INSERT INTO queen.queue_groups (queue_id, consumer_group)
SELECT DISTINCT p.queue_id, c.consumer_group
FROM queen.cursors c JOIN queen.partitions p USING (partition_id);

INSERT INTO queen.ready (partition_id, consumer_group, queue_id, served_at)
SELECT p.partition_id, g.consumer_group, p.queue_id, coalesce(c.updated_at, '-infinity')
FROM queen.queue_groups g
JOIN queen.partitions p ON p.queue_id = g.queue_id
LEFT JOIN queen.cursors c
       ON c.partition_id = p.partition_id AND c.consumer_group = g.consumer_group
WHERE p.next_offset > greatest(coalesce(c.committed + 1, 0), p.log_start);
