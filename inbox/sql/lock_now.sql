-- The inbox's lease row locked, whoever holds it, and the clock read once the lock is granted:
-- the first statement of a write that decides by the clock under the lock (a person's answer
-- to an approval, whose deadline is checked there). The lock is taken in the subquery, so the
-- clock is read above it, after any wait for the row. No row: no such inbox.
--
-- The inbox is named by `inbox_id` or, when that is NULL, by `slug` (an InitPlan, run only
-- then); the lease row by its primary key. `now`, when given, is the clock.
SELECT l.inbox_id, COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now
FROM (
    SELECT inbox_id FROM inbox_lease
    WHERE inbox_id = COALESCE(%(inbox_id)s::bigint,
                              (SELECT id FROM inbox_inbox WHERE slug = %(slug)s::varchar))
    FOR UPDATE
) AS l
