-- When a consumer group subscribed to a queue with Queen's subscriptionMode=new (or
-- subscriptionFrom=now): recorded at the group's first such pop, before it looks at any
-- partition, so a partition the group first pops later (one created since, or one that was
-- empty) starts at the first message created at or after this instant, not at the later pop.
-- Keyed by the queue's name, not its id: the first pop may come before the queue exists (a
-- consumer waiting for the first push), and the messages of that first push are new to it.
CREATE TABLE queen.group_subscriptions (
    tenant_id      integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue          text        NOT NULL,
    consumer_group text        NOT NULL,
    subscribed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant_id, queue, consumer_group)
);
