-- take_next: an inbox with work, soonest first, by lease_work_idx under SKIP LOCKED; the
-- leftovers checks by event_running_idx and event_pending_idx; the batch by
-- event_pending_idx (the oldest due retry alone, if any). One statement, one commit.
--
-- One snapshot serves the whole statement, taken before the lease row was locked: the
-- events a delivery committed after it are not claimed now (the finish's recount, a later
-- statement, finds them). A finish of the previous run that this snapshot predates shows as
-- leftovers (its events still running): then nothing is claimed here, and the claim
-- happens in a transaction of its own that reads everything afresh (claim.sql).
--
-- After the session's state come the values apps registered in CLAIM_EXTRAS, each as
-- `(expression) AS "extra.NAME"` (the one part of the text made at run time).
WITH {pick_lease},
{take_lease},
checked AS (
    SELECT t.*,
        EXISTS (SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = t.inbox_id
                AND e.status = 'running' AND e.claim_gen < t.generation)
        OR EXISTS (SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = t.inbox_id
                   AND e.status = 'pending' AND e.attempts >= %(max_attempts)s::int)
        AS leftovers
    FROM taken AS t
),
target AS (SELECT inbox_id, generation, now FROM checked WHERE NOT leftovers),
{claim_batch}
SELECT t.now, t.generation, t.leftovers, t.old_holder, t.old_until,
    i.id AS "inbox.id", i.owner_id AS "inbox.owner_id", i.slug AS "inbox.slug",
    i.name AS "inbox.name", i.created AS "inbox.created",
    c.*, s.state{extras}
FROM checked AS t
JOIN inbox_inbox AS i ON i.id = (SELECT inbox_id FROM taken)
LEFT JOIN inbox_session AS s ON s.inbox_id = (SELECT inbox_id FROM taken)
LEFT JOIN claimed AS c ON true
