-- 011 consumer-group delivery policy: Queen's conflation belongs to a consumer group on a queue,
-- not to a request. The group's first pop registers it (conflation as that pop asked, false when
-- it did not say); from then on the stored value applies to every consumer of the group, and a
-- pop asking otherwise is told so (conflationConflict). Deleting the group with its metadata
-- (or the queue) forgets it. Keyed by the queue's name, like queen.group_subscriptions: a first
-- pop may come before the queue exists.
CREATE TABLE queen.group_policies (
    tenant_id      integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    queue          text        NOT NULL,
    consumer_group text        NOT NULL,
    conflation     boolean     NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, queue, consumer_group)
);
