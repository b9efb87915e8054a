-- acquire: take or renew one inbox's lease. Its row is locked by primary key, waited for;
-- the clock is read before the wait, as the lock's holder would have read it.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
candidate AS (
    SELECT l.inbox_id, (l.until IS NULL OR l.until < clock.now) AS free,
        l.holder AS old_holder, l.until AS old_until
    FROM inbox_lease AS l, clock
    WHERE l.inbox_id = %(inbox)s::bigint
    FOR UPDATE OF l
),
{take_lease}
SELECT c.inbox_id, t.generation, t.now, t.free, t.old_holder, t.old_until
FROM candidate AS c LEFT JOIN taken AS t ON true
