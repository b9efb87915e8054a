-- A run that ended well, after lock.sql, in a statement of its own so that its snapshot
-- includes every event committed before the lock was granted: the fence, then, only if the
-- lease is held and every event is still running under this generation, the events done
-- (by event_running_idx or the primary key), the work recounted (by event_pending_idx: the
-- done rows leave the pending set as the snapshot has it) and, with `release`, the lease
-- given back, and the run's record written. All or nothing: refused, it writes nothing.
-- Rows are named by scalar subqueries and arrays of keys (InitPlans), never by joins the
-- planner could turn around.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
held AS (
    SELECT l.inbox_id FROM inbox_lease AS l, clock
    WHERE l.inbox_id = %(inbox)s::bigint AND l.holder = %(holder)s::text
      AND l.generation = %(generation)s::bigint AND l.until >= clock.now
),
claimed AS (
    SELECT e.id, e.updated, e.created FROM inbox_event AS e
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
),
-- The run's record, in the same all or nothing: claimed at the events' claim time (the
-- claim stamped `updated`), waiting since the oldest one arrived.
recorded AS (
    INSERT INTO inbox_runrecord (inbox_id, generation, worker, started, ended, outcome,
        error, events, waiting_since, produced, trace)
    SELECT %(inbox)s::bigint, %(generation)s::bigint, %(holder)s::text,
        COALESCE((SELECT min(updated) FROM claimed), clock.now), clock.now, 'done', '',
        to_jsonb(%(ids)s::bigint[]), (SELECT min(created) FROM claimed),
        %(produced)s::jsonb, %(trace)s::text
    FROM clock
    WHERE %(record)s::boolean AND (SELECT ok FROM whole) IS TRUE
)
SELECT clock.now, whole.ok FROM clock, whole
