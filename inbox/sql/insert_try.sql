-- One delivery outside a transaction, the common case tried alone: the inbox's marker
-- stands and no writer holds its lease row. The row is taken FOR SHARE SKIP LOCKED, so the
-- statement never waits and sets no lock timeout; one INSERT ... SELECT, the fewest plan
-- nodes (each costs the server on every delivery). The second branch runs only when
-- nothing was stored and says why: a duplicate (`again` false), or anything else (`again`
-- true: insert_one.sql runs next). No row at all: no such inbox. The clock is the
-- statement's: it is its own transaction.
--
-- The inbox is named by `inbox_id` or, when that is NULL, by `slug` (an InitPlan, run only
-- then).
WITH stored AS (
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                             claim_gen, error, available_at, created, updated)
    SELECT l.inbox_id, %(source)s::varchar, %(source_id)s::varchar, %(payload)s::jsonb,
        'pending', 0, NULL, '',
        COALESCE(%(now)s::timestamptz, statement_timestamp()),
        COALESCE(%(now)s::timestamptz, statement_timestamp()),
        COALESCE(%(now)s::timestamptz, statement_timestamp())
    FROM inbox_lease AS l
    WHERE l.inbox_id = COALESCE(%(inbox_id)s::bigint,
                                (SELECT id FROM inbox_inbox WHERE slug = %(slug)s::varchar))
      AND l.work_at <= COALESCE(%(now)s::timestamptz, statement_timestamp())
      AND NOT EXISTS (
          SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = l.inbox_id
          AND e.source = %(source)s::varchar AND e.source_id = %(source_id)s::varchar)
    FOR SHARE OF l SKIP LOCKED
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
    RETURNING inbox_id, id, available_at
)
SELECT inbox_id, id, available_at, false AS again FROM stored
UNION ALL
SELECT l.inbox_id, NULL, NULL,
    NOT EXISTS (
        SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = l.inbox_id
        AND e.source = %(source)s::varchar AND e.source_id = %(source_id)s::varchar)
FROM inbox_lease AS l
WHERE l.inbox_id = COALESCE(%(inbox_id)s::bigint,
                            (SELECT id FROM inbox_inbox WHERE slug = %(slug)s::varchar))
  AND NOT EXISTS (SELECT 1 FROM stored)
