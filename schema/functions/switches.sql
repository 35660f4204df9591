-- The runtime switches' trigger (table in 006_runtime_switches.sql). Applied by the migrator
-- after the numbered migrations whenever this file changes (schema/README.md).

-- Every change to a switch, from the CLI, the HTTP route or a psql prompt, tells the brokers
-- at its commit (channel queen_switches): they re-read the table at once rather than at their
-- next half-second poll.
CREATE OR REPLACE FUNCTION queen.notify_switches() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('queen_switches', '');
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER runtime_switches_notify
AFTER INSERT OR UPDATE OR DELETE ON queen.runtime_switches
FOR EACH STATEMENT EXECUTE FUNCTION queen.notify_switches();
