-- (issue 32's migration 015, numbered 012 on its branch: the migrator wants no gaps.)
--
-- queen.schedule_timers takes its timers as one JSON array (schema/functions/timers.sql) and
-- mints their message ids itself: the version taking ten arrays and the broker's ids goes.
DROP FUNCTION IF EXISTS queen.schedule_timers(integer, text[], text[], text[], text[], uuid[],
                                              bytea[], boolean[], integer[], bigint[], bigint,
                                              integer);

-- timers has no foreign key to tenants any more: its per-row check cost a bundle of 500 new
-- timers more PostgreSQL CPU than any other step of the insert. queen.schedule_timers locks the
-- tenant's row once per statement instead (what the check's FOR KEY SHARE did), and a trigger
-- on tenants (functions/timers.sql) deletes a deleted tenant's timers, as the cascade did.
ALTER TABLE queen.timers DROP CONSTRAINT IF EXISTS timers_tenant_id_fkey;
