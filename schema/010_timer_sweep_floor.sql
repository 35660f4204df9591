-- 010 the sweep's floor: where every sweep of queen.timers starts (schema/functions/timers.sql,
-- queen.sweep_floor). Epoch microseconds of the database clock; no live timer has a visible_at
-- below it. A sequence because it is written outside the sweep's transaction, and a sequence
-- has no row versions: a table row updated by every sweep would itself pile up dead versions
-- behind a held snapshot, which is the cost the floor removes from the sweep. 0: every sweep
-- starts at the beginning until the first one has run.
CREATE SEQUENCE queen.timer_sweep_floor AS bigint MINVALUE 0 START 0;
