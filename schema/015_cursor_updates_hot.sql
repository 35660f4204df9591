-- 015 cursor updates HOT: a consumer group's cursor row is updated by every pop (it takes the
-- lease: a new lease_id) and every ack. With lease_id indexed (cursors_lease) the pop's update
-- could never be HOT: each one added an entry to every index of queen.cursors, cursors_pkey
-- included, and behind a held snapshot (a long report, pg_dump, a replica with
-- hot_standby_feedback) none of them can be removed, so every later pop, ack and sweep-carried
-- pop of that cursor walked them all (buffers per cursor update went 15 -> 230 in two
-- minutes at 500 timers/s: docs/timers-at-scale.md). With no index on a column any update sets,
-- every cursor update is HOT: the new version goes on the same page, cursors_pkey is not
-- touched. The few lookups by lease id (extending a lease, a transaction's requiredLeases) read
-- the cursors table instead (queen_trio/sql/log.sql).
DROP INDEX IF EXISTS queen.cursors_lease;

-- Room on each page for the next versions of its rows: a HOT update needs free space on the
-- row's own page (a page filled by inserts, as seed_cursors' 5,000 cursors are, sends the first
-- update of each row elsewhere, with an index entry). New pages only; vacuum keeps it so.
ALTER TABLE queen.cursors SET (fillfactor = 50);
