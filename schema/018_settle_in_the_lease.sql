-- 018 a stream's settlement carried by the sweep is written in the next lease's UPDATE
-- (queen.pop_head_take, schema/functions/log.sql): queen.pop_walk takes the cursor being
-- settled as its settlement leaves it (p_settled, p_settled_through), and
-- queen.cursor_for_update answers the cursor's attempt_offset too. The old signatures go.
DROP FUNCTION IF EXISTS queen.pop_walk(integer, text, text, text, text, integer);
DROP FUNCTION IF EXISTS queen.cursor_for_update(integer, uuid, text);
-- The sweep's work answers one composite value (queen.sweep_take, queen.sweep_run,
-- schema/functions/timers.sql) rather than rows through a layer of set-returning functions:
-- queen.sweep_due goes.
DROP FUNCTION IF EXISTS queen.sweep_due(uuid, text, integer, integer, integer, boolean,
                                        timestamp with time zone);
