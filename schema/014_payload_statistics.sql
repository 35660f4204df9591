-- 014 no planner statistics on payload columns. Every few seconds the broker analyzes a queen
-- table that has doubled (queen_trio/db/analyze.py), so a burst analyzes queen.frames and
-- queen.timers several times while it drains. No statement filters, joins or sorts on a
-- payload, so their statistics were never read, and computing them (detoasting and sorting a
-- sample of every jsonb and bytea value) was most of the cost: ANALYZE of 50,000 fired frames
-- took 400-500 ms with them and 85-200 ms without. The planner keeps using the statistics of
-- the columns it filters on (partition, offset, transaction id, instants).
ALTER TABLE queen.frames ALTER COLUMN payload SET STATISTICS 0,
                         ALTER COLUMN meta SET STATISTICS 0;
ALTER TABLE queen.timers ALTER COLUMN payload SET STATISTICS 0;
ALTER TABLE queen.dead_letters ALTER COLUMN payload SET STATISTICS 0;
ALTER TABLE queen.kv ALTER COLUMN value SET STATISTICS 0;
ALTER TABLE queen.segments ALTER COLUMN data SET STATISTICS 0;
