-- Fragment: claiming one run's batch, the one statement of the rule on PostgreSQL (SQLite's
-- is the ORM's, in backends/base.py). Included by claim.sql and take.sql, each of which
-- names the claim's inbox, generation and clock as `target` (no row: nothing is claimed).
-- The marking itself is claim_chosen.sql's, which a run's join (claim_more.sql) shares.
--
-- The due pending rows by event_pending_idx; a due retry is claimed alone, so a poison event
-- cannot take healthy events down with it.
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
{claim_chosen}
