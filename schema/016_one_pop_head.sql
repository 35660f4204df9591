-- 016 one queen.pop_head: the form without a rotation pointer (p_after) goes; its callers
-- (queen.pop_head_after, the sweeper's hand-over) pass NULL, which starts the walk at the
-- first name. A function's body lives in one place, and two signatures of one name were two.
DROP FUNCTION IF EXISTS queen.pop_head(integer, text, text, text, integer, boolean);
