-- One event, waiting for the inbox's lease row where insert_try.sql would not (and always
-- inside a caller's transaction). In the order it runs (see inbox/backends/postgresql.py):
-- `fresh`, the key not stored as of the snapshot (a duplicate stops here: no lock, no
-- write); the lease row locked, FOR SHARE when `share` and the marker already stands at or
-- before the event's time, FOR UPDATE otherwise; the insert, the UNIQUE constraint
-- deciding; the marker lowered (only under FOR UPDATE); pg_notify when it moved. `again`:
-- a finish moved the marker while this statement waited to share the row, nothing was
-- stored, run it again without `share`.
--
-- Each lease row is named by a scalar subquery (an InitPlan: `inbox_id = $n`), never by a join
-- the planner could turn around into a walk of the whole index; with BY_INDEX (postgresql.py)
-- that is one probe of each key whatever the statistics say.
--
-- `lock_timeout` (NULL: none set) bounds the wait for the row: `bound` joins the locking
-- CTEs, so it is in force before the lock is requested, and lasts until the transaction
-- ends. The inbox is named by `inbox_id` or, when that is NULL, by `slug`. `%(share)s` is
-- written in as true or false (inbox/backends/postgresql.py, INSERT_ONE_SHARING), not bound.
WITH target AS (
    SELECT id FROM inbox_inbox
    WHERE id = COALESCE(%(inbox_id)s::bigint,
                        (SELECT id FROM inbox_inbox WHERE slug = %(slug)s::varchar))
), fresh AS (
    SELECT t.id FROM target AS t WHERE (
        SELECT 1 FROM inbox_event AS e
        WHERE e.inbox_id = t.id AND e.source = %(source)s::varchar
          AND e.source_id = %(source_id)s::varchar
    ) IS NULL
), clock AS (
    SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now
), bound AS (
    SELECT CASE WHEN %(lock_timeout)s::text IS NOT NULL
        THEN set_config('lock_timeout', %(lock_timeout)s::text, true) END AS v
), seen AS (
    SELECT l.inbox_id, %(share)s::boolean AND l.work_at <= (SELECT now FROM clock) AS stands
    FROM inbox_lease AS l
    WHERE l.inbox_id = (SELECT id FROM fresh)
), shared AS (
    SELECT l.inbox_id, l.work_at FROM inbox_lease AS l, bound
    WHERE l.inbox_id = (SELECT inbox_id FROM seen WHERE stands IS TRUE)
      AND l.work_at <= (SELECT now FROM clock)
    FOR SHARE OF l
), exclusive AS (
    SELECT l.inbox_id, l.work_at FROM inbox_lease AS l, bound
    WHERE l.inbox_id = (SELECT inbox_id FROM seen WHERE stands IS NOT TRUE)
    FOR UPDATE OF l
), lease AS (
    SELECT inbox_id FROM shared UNION ALL SELECT inbox_id FROM exclusive
), stored AS (
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                             claim_gen, error, available_at, created, updated)
    SELECT l.inbox_id, %(source)s::varchar, %(source_id)s::varchar, %(payload)s::jsonb,
        'pending', 0, NULL, '', c.now, c.now, c.now
    FROM lease AS l, clock AS c
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
    RETURNING id, available_at
), marked AS (
    UPDATE inbox_lease AS m SET work_at = s.available_at
    FROM stored AS s, exclusive AS k
    WHERE m.inbox_id = (SELECT inbox_id FROM exclusive)
      AND (k.work_at IS NULL OR k.work_at > s.available_at)
    RETURNING m.inbox_id
)
SELECT t.id AS inbox_id, s.id, s.available_at,
    (SELECT pg_notify(%(channel)s::text, inbox_id::text)::text FROM marked) AS notified,
    EXISTS (SELECT 1 FROM seen) AND NOT EXISTS (SELECT 1 FROM lease) AS again
FROM target AS t LEFT JOIN stored AS s ON true
