-- The lease row by its primary key, locked first whoever holds it (then checked): the first
-- statement of a finish, so that the next one's snapshot includes every event committed
-- before the lock was granted (later ones wait for it).
SELECT inbox_id FROM inbox_lease WHERE inbox_id = %(inbox)s::bigint FOR UPDATE
