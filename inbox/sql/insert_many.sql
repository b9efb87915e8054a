-- Many events in one inbox, keys distinct (ingest_many): insert_one.sql's steps over a batch
-- (`batch`, in the caller's order), always FOR UPDATE. Not prepared: a generic plan, made
-- once for a batch of unknown size, would keep whatever join the table's size favoured then
-- (a hash of the whole table, on a new one). The inbox is named by `inbox_id` or, when that
-- is NULL, by `slug`; `lock_timeout` as in insert_one.sql.
WITH target AS (
    SELECT id FROM inbox_inbox
    WHERE id = COALESCE(%(inbox_id)s::bigint,
                        (SELECT id FROM inbox_inbox WHERE slug = %(slug)s::varchar))
), batch AS (
    SELECT * FROM unnest(%(sources)s::text[], %(source_ids)s::text[], %(payloads)s::text[])
        WITH ORDINALITY AS b(source, source_id, payload, n)
), fresh AS (
    SELECT b.* FROM batch AS b, target AS t WHERE NOT EXISTS (
        SELECT 1 FROM inbox_event AS e
        WHERE e.inbox_id = t.id AND e.source = b.source AND e.source_id = b.source_id
    )
), bound AS (
    SELECT CASE WHEN %(lock_timeout)s::text IS NOT NULL
        THEN set_config('lock_timeout', %(lock_timeout)s::text, true) END AS v
), lease AS (
    SELECT l.inbox_id, l.work_at FROM inbox_lease AS l, target AS t, bound
    WHERE l.inbox_id = t.id AND EXISTS (SELECT 1 FROM fresh)
    FOR UPDATE OF l
), clock AS (
    SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now
), stored AS (
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                             claim_gen, error, available_at, created, updated)
    SELECT l.inbox_id, f.source, f.source_id, f.payload::jsonb, 'pending', 0,
           NULL, '', c.now, c.now, c.now
    FROM lease AS l, clock AS c, fresh AS f ORDER BY f.n
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
    RETURNING id, source, source_id, available_at
), marked AS (
    UPDATE inbox_lease AS m SET work_at = s.first
    FROM (SELECT min(available_at) AS first FROM stored) AS s, lease AS k
    WHERE m.inbox_id = k.inbox_id AND s.first IS NOT NULL
      AND (k.work_at IS NULL OR k.work_at > s.first)
    RETURNING m.inbox_id
)
SELECT t.id AS inbox_id, s.id, s.source, s.source_id, s.available_at,
    (SELECT pg_notify(%(channel)s::text, inbox_id::text)::text FROM marked) AS notified
FROM target AS t LEFT JOIN stored AS s ON true
