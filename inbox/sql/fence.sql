-- The fence of every write that ends or continues a run (finish with an error or a
-- deferral, a claim under a held lease): the lease row by its primary key, locked first
-- whoever holds it, then checked: held by (holder, generation) and not lapsed. With
-- `release`, given back in the same write. No row: refused (or no such inbox).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
locked AS (
    SELECT inbox_id, holder, generation, until FROM inbox_lease
    WHERE inbox_id = %(inbox)s::bigint FOR UPDATE
)
UPDATE inbox_lease AS l SET until = CASE WHEN %(release)s::boolean THEN NULL ELSE l.until END
FROM locked, clock
WHERE l.inbox_id = locked.inbox_id
  AND locked.holder = %(holder)s::text AND locked.generation = %(generation)s::bigint
  AND locked.until >= clock.now
RETURNING clock.now
