"""Where PostgreSQL and SQLite need different statements: one interface, one module per
database.

`base.Backend` is the interface, and holds the portable form of each operation (Django's
ORM, under the lease row's lock): SQLite runs those as they are (`sqlite.SQLite` adds its
clock, its busy timeout and its insert). `postgresql.PostgreSQL` states the hot operations
as whole statements of its own (inbox/sql/), prepared, and overrides every portable form
whose rule its statements state, so that on one database each rule has one home.

`current()` is the backend of the default connection, chosen once per kind of database.
"""

import functools
import importlib

from django.db import connection

_MODULES = {"postgresql": "postgresql.PostgreSQL", "sqlite": "sqlite.SQLite"}


@functools.cache
def _for(vendor):
    module, name = _MODULES[vendor].split(".")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)()


def current():
    """The backend of the default database."""
    return _for(connection.vendor)
