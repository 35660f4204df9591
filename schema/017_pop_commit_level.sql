-- 017 the pop's commit level reaches the sweeper's hand-over: queen.sweep_timers_and_pop takes
-- the level a pop's lease commits at (QUEEN_POP_COMMIT), as queen.sweep_settle_and_pop does;
-- queen.pop_head no longer turns the wait for the WAL flush off by itself (under
-- QUEEN_POP_COMMIT=sync a lease did not wait). The old signature goes.
DROP FUNCTION IF EXISTS queen.sweep_timers_and_pop(integer, text, uuid, text, integer, integer,
                                                   integer, boolean, double precision, text,
                                                   text, integer, boolean);
