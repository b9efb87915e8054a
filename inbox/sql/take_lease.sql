-- Fragment: taking an inbox's lease, the one statement of the rule on PostgreSQL (SQLite's
-- is Lease.take). Included by acquire.sql, acquire_next.sql and take.sql, each of which
-- names the row to take as `candidate` (inbox_id, free, old_holder, old_until, locked by
-- then) and the statement's clock as `clock`.
--
-- A free lease (released, never held or lapsed) is a takeover: a new generation, so claims
-- made under the old one can be told apart. A live lease is renewed by its own holder only,
-- keeping its generation; anyone else gets no row.
taken AS (
    UPDATE inbox_lease AS l
    SET holder = %(holder)s::text,
        generation = l.generation + CASE WHEN c.free THEN 1 ELSE 0 END,
        until = clock.now + %(ttl)s::interval
    FROM candidate AS c, clock
    WHERE l.inbox_id = (SELECT inbox_id FROM candidate)
      AND (c.free OR c.old_holder = %(holder)s::text)
    RETURNING l.inbox_id, l.generation, clock.now, c.free, c.old_holder, c.old_until
)
