-- 007 runtime switches: an operator pauses the KV surface, the scheduling of timers or their
-- fire while the broker keeps running (Queen's kill switches, PLAN_KV_TIMERS.md §12.1). One row
-- per switch; every broker reads them (queen_trio/switches.py), at once on the NOTIFY a change
-- through the CLI or the HTTP route sends (channel queen_switches) and at least every half
-- second anyway (a row changed by hand in psql). A switch without a row counts as on: a kill
-- switch is born on, and only an operator turns it off.
CREATE TABLE queen.runtime_switches (
    name       text PRIMARY KEY
               CHECK (name IN ('kv_enabled', 'timers_schedule_enabled', 'timers_fire_enabled')),
    enabled    boolean NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.runtime_switches (name)
VALUES ('kv_enabled'), ('timers_schedule_enabled'), ('timers_fire_enabled');
