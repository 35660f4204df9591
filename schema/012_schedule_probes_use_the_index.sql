-- 012 a schedule's look-up of existing timers always uses the primary key.
--
-- queen.schedule_timers probes queen.timers once per timer in the bundle (schema 009). A
-- PL/pgSQL statement's plan is cached per connection and, after a few calls, kept as a
-- generic plan; one made while the table was nearly empty (a broker's first schedules, or
-- statistics taken then) probes with a sequential scan, the cheapest way to read one page.
-- The table then grows and every probe reads all of it: in a benchmark, bundles of 500
-- timers went from 12 ms to 1.3-2.3 s each once 30,000 timers were pending (auto_explain:
-- "Seq Scan on timers" inside the function), until a new ANALYZE invalidated the plan. With
-- sequential scans off inside the function, every plan it makes probes the index, whatever
-- the statistics said when it was made.
ALTER FUNCTION queen.schedule_timers(integer, text[], text[], text[], text[], bytea[],
                                     boolean[], integer[], bigint[], bigint, integer)
    SET enable_seqscan = off;
