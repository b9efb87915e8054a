-- Fragment: the statement's clock and the lease of some inbox that has work and no live
-- holder, soonest first, by lease_work_idx, as `candidate` for take_lease.sql. Included by
-- acquire_next.sql and take.sql.
--
-- SKIP LOCKED: workers on many hosts look at once without queueing behind each other, and
-- the row each one locks is an inbox nobody else can take meanwhile.
clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
candidate AS (
    SELECT inbox_id, true AS free, holder AS old_holder, until AS old_until
    FROM inbox_lease
    WHERE work_at <= (SELECT now FROM clock)
      AND (until IS NULL OR until < (SELECT now FROM clock))
    ORDER BY work_at LIMIT 1
    FOR UPDATE OF inbox_lease SKIP LOCKED
)
