-- Fragment: claiming one run's batch, the one statement of the rule on PostgreSQL (SQLite's
-- is the ORM's, in backends/base.py). Included by claim.sql and take.sql, each of which
-- names the claim's inbox, generation and clock as `target` (no row: nothing is claimed).
--
-- The due pending rows by event_pending_idx; a due retry is claimed alone, so a poison event
-- cannot take healthy events down with it. `e.status = 'pending'` is checked again on the
-- row's newest version: an event an operator parked since the snapshot is not claimed.
--
-- Rows are named by scalar subqueries and arrays of keys (InitPlans), not by joins with the
-- CTEs, which the planner may turn around into a walk of a whole index.
due AS (
    SELECT e.id, e.attempts FROM inbox_event AS e
    WHERE e.inbox_id = (SELECT inbox_id FROM target) AND e.status = 'pending'
      AND e.available_at <= (SELECT now FROM target)
),
retry AS (SELECT min(id) AS id FROM due WHERE attempts > 0),
chosen AS (SELECT due.id FROM due, retry WHERE retry.id IS NULL OR due.id = retry.id),
claimed AS (
    UPDATE inbox_event AS e
    SET status = 'running', attempts = e.attempts + 1, claim_gen = t.generation, updated = t.now
    FROM target AS t
    WHERE e.id = ANY(ARRAY(SELECT id FROM chosen)) AND e.inbox_id = (SELECT inbox_id FROM target)
      AND e.status = 'pending'
    RETURNING e.id, e.inbox_id, e.source, e.source_id, e.payload, e.status, e.attempts,
        e.claim_gen, e.error, e.available_at, e.created, e.updated
)
