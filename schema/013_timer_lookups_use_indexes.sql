-- 013 the fire's look-ups use their indexes, whatever the table looked like when planned.
--
-- 012 did this for a schedule's probes. The other PL/pgSQL functions on the timer path cache
-- their plans per connection the same way, and one made while a table was nearly empty reads
-- the whole table once it has grown, on every call, until an ANALYZE invalidates the plan:
--   * queen.fire_claimed_timers finds each claimed row by its key (a LATERAL probe per
--     timer); as a sequential scan, every timer of a claimed batch reads all of queen.timers;
--   * queen.sweep_due picks the due rows in visible_at order and joins their tenants, and
--     queen.sweep_timers then looks up the earliest visible_at: as a sequential scan, every
--     sweeper cycle reads every pending timer;
--   * queen.append_timer_frames finds each destination queue and partition by name, and
--     queen.partitions grows with every partition ever written to.
-- With sequential scans off inside them, each of these plans walks an index. (A statement
-- with no index to use still scans: enable_seqscan only makes that the last resort.)
ALTER FUNCTION queen.fire_claimed_timers(uuid, integer[], text[], text[], text[])
    SET enable_seqscan = off;
ALTER FUNCTION queen.sweep_due(uuid, text, integer, integer, integer, boolean, timestamptz)
    SET enable_seqscan = off;
ALTER FUNCTION queen.sweep_timers(uuid, text, integer, integer, integer, boolean, float8)
    SET enable_seqscan = off;
ALTER FUNCTION queen.append_timer_frames(integer[], text[], text[], text[], text[], text[],
                                         integer[], timestamptz[])
    SET enable_seqscan = off;
