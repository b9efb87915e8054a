-- Fragment: the chosen events claimed under `target`'s generation, each attempt counted: the
-- one statement of what a claim writes on PostgreSQL (SQLite's is Backend.mark_claimed).
-- Included by claim_batch.sql (a run's batch) and claim_more.sql (a run's join), each of
-- which names the claim's inbox, generation and clock as `target`, and the ids as `chosen`.
-- `e.status = 'pending'` is checked again on the row's newest version: an event an operator
-- parked since the snapshot is not claimed.
claimed AS (
    UPDATE inbox_event AS e
    SET status = 'running', attempts = e.attempts + 1, claim_gen = t.generation, updated = t.now
    FROM target AS t
    WHERE e.id = ANY(ARRAY(SELECT id FROM chosen)) AND e.inbox_id = (SELECT inbox_id FROM target)
      AND e.status = 'pending'
    RETURNING e.id, e.inbox_id, e.source, e.source_id, e.payload, e.status, e.attempts,
        e.claim_gen, e.error, e.available_at, e.created, e.updated
)
