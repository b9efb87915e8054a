-- claim_batch, and take_next's claim after settling leftovers: the batch of an inbox whose
-- lease the caller holds (fenced, under the lease row's lock), with the session state.
WITH target AS (
    SELECT %(inbox)s::bigint AS inbox_id, %(generation)s::bigint AS generation,
        %(now)s::timestamptz AS now
),
{claim_batch}
SELECT c.*, (SELECT state FROM inbox_session WHERE inbox_id = %(inbox)s::bigint) AS state
FROM claimed AS c
