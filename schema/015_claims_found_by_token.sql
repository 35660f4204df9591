-- 015 a broker's claimed timers are found by their claim token through an index.
--
-- After transient trouble during a fire, a broker hands its claimed rows back at once
-- (release_claim: every row carrying its claim token) rather than leaving them to the lease. With
-- no index on claim_token that statement read the whole timers table: with a million timers
-- pending, a long scan at the moment the database has just come back. Only claimed rows carry a
-- token (a fire deletes them, a failure clears it), so a partial index stays a handful of entries.

CREATE INDEX timers_claim_token ON queen.timers (claim_token) WHERE claim_token IS NOT NULL;
