-- A run that ended well, after lock.sql, in a statement of its own so that its snapshot
-- includes every event committed before the lock was granted: the fence, then, only if the
-- lease is held and every event is still running under this generation, the events done
-- (by event_running_idx or the primary key), the work recounted (by event_pending_idx: the
-- done rows leave the pending set as the snapshot has it) and, with `release`, the lease
-- given back. All or nothing: refused, it writes nothing. Rows are named by scalar
-- subqueries and arrays of keys (InitPlans), never by joins the planner could turn around.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
held AS (
    SELECT l.inbox_id FROM inbox_lease AS l, clock
    WHERE l.inbox_id = %(inbox)s::bigint AND l.holder = %(holder)s::text
      AND l.generation = %(generation)s::bigint AND l.until >= clock.now
),
claimed AS (
    SELECT e.id FROM inbox_event AS e
    WHERE e.inbox_id = (SELECT inbox_id FROM held) AND e.status = 'running'
      AND e.claim_gen = %(generation)s::bigint AND e.id = ANY(%(ids)s::bigint[])
),
whole AS (
    SELECT EXISTS (SELECT 1 FROM held)
        AND (SELECT count(*) FROM claimed) = %(count)s::int AS ok
),
done AS (
    UPDATE inbox_event AS e SET status = 'done', error = '', updated = clock.now
    FROM clock
    WHERE e.id = ANY(ARRAY(SELECT id FROM claimed)) AND e.inbox_id = %(inbox)s::bigint
      AND e.status = 'running'
      AND (SELECT ok FROM whole) IS TRUE
),
lease AS (
    UPDATE inbox_lease AS l
    SET until = CASE WHEN %(release)s::boolean THEN NULL ELSE l.until END,
        work_at = (SELECT min(available_at) FROM inbox_event
                   WHERE inbox_id = l.inbox_id AND status = 'pending')
    WHERE l.inbox_id = %(inbox)s::bigint AND (SELECT ok FROM whole) IS TRUE
)
SELECT clock.now, whole.ok FROM clock, whole
