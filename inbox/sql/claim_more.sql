-- claim_more: a run's join, under the lease it holds (fenced first, under the lease row's
-- lock): the inbox's fresh events of the given sources that are due, claimed into the run
-- by the claim's own marking (claim_chosen.sql). Fresh only (never attempted): a retry is
-- claimed alone, by a run of its own, and never joins another run's batch.
WITH target AS (
    SELECT %(inbox)s::bigint AS inbox_id, %(generation)s::bigint AS generation,
        %(now)s::timestamptz AS now
),
chosen AS (
    SELECT e.id FROM inbox_event AS e
    WHERE e.inbox_id = (SELECT inbox_id FROM target) AND e.status = 'pending'
      AND e.available_at <= (SELECT now FROM target) AND e.attempts = 0
      AND e.source = ANY(%(sources)s::text[])
),
{claim_chosen}
SELECT c.* FROM claimed AS c
