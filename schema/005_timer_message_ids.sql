-- 005 timer message ids: the id of a timer's message is minted when the timer is scheduled (a
-- UUIDv7 from the broker), promised to the client as messageId, and carried by the frame its
-- fire appends (frames.meta.messageId, which a pop hands out as the message's id). A reschedule
-- is a new timer under an old name: it gets a new id. The default only serves rows written
-- without one (the rows pending when this runs, and hand-written test rows).
ALTER TABLE queen.timers ADD COLUMN message_id uuid NOT NULL DEFAULT gen_random_uuid();

-- Their signatures change in functions/timers.sql: message ids in, and out.
DROP FUNCTION IF EXISTS queen.schedule_timers(integer, text[], text[], text[], text[], bytea[],
                                              boolean[], integer[], bigint[], bigint, integer);
DROP FUNCTION IF EXISTS queen.append_timer_frames(integer[], text[], text[], text[], text[],
                                                  text[], integer[], timestamptz[]);
