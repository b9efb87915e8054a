"""Where PostgreSQL and SQLite need different statements: one interface, one module per
database.

`base.Backend` is the interface, and holds the portable form of each operation (Django's
ORM, under the lease row's lock): SQLite runs those as they are (`sqlite.SQLite` adds its
clock, its busy timeout and its insert). `postgresql.PostgreSQL` states the hot operations
as whole statements of its own (inbox/sql/), prepared, and overrides every portable form
whose rule its statements state, so that on one database each rule has one home.

`current()` is the backend of the default database, chosen once.
"""

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.module_loading import import_string

# By name, imported when chosen: the PostgreSQL module loads psycopg, a tenth of a manage.py
# command's start-up, which a process on SQLite never needs.
BACKENDS = {
    "postgresql": "inbox.backends.postgresql.PostgreSQL",
    "sqlite": "inbox.backends.sqlite.SQLite",
}
_current = None


def current():
    """The backend of the default database, chosen on the first call (a process has one
    default database; every delivery asks, so the answer is kept)."""
    return _current or _choose()


def _choose():
    global _current
    _current = import_string(BACKENDS[connections[DEFAULT_DB_ALIAS].vendor])()
    return _current
