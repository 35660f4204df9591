-- 008 pop semantics (Queen 2): one lease for a pop over several partitions, and windowBuffer.

-- A pop that takes several partitions holds them under ONE lease, as Queen does: every cursor it
-- leased carries the same lease_id, and acks, extensions and expiry act on all of them. The
-- lease index stays (extend, requiredLeases and late acks look leases up by id) but is no
-- longer unique.
DROP INDEX queen.cursors_lease;
CREATE INDEX cursors_lease ON queen.cursors (lease_id) WHERE lease_id IS NOT NULL;

-- windowBuffer: seconds a partition is held back after its newest message (Queen's debounce:
-- nothing of the partition is handed out until its newest message is that old). 0: none.
ALTER TABLE queen.queues
    ADD COLUMN window_buffer_s integer NOT NULL DEFAULT 0 CHECK (window_buffer_s >= 0);
