"""Statements the ORM builds once per process and database, run with each call's values.

Building and compiling a queryset costs several times what running it costs, and some run on
every request of a hot path: every page of an inbox reads the user's role with it, every
answer to an approval reads its request, settles it and audits it. The ORM still states
each statement, once (its rule stays in one place): where a call gives a value the
statement holds a Given, compiled as a bare placeholder; each call puts its value there,
adapted by the Given's field as the ORM adapts a value for its column.

They run as the database's backend runs its hot statements (backends/: on PostgreSQL
prepared and planned by index); their rows become model instances as a queryset's do
(converters, select_related, annotations).
"""

import inspect
from contextlib import nullcontext
from functools import partial
from typing import NamedTuple

from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.db.models import Expression
from django.db.models.query import get_related_populators

from .backends import current


class Given(Expression):
    """A value each call gives: `name`, adapted by `output_field` (a field instance)."""

    def __init__(self, name, output_field):
        super().__init__(output_field=output_field)
        self.name = name
        # What the field hands to the database unchanged (get_db_prep_save then only costs a
        # chain of calls, for each value of every call): text for a text column, a whole
        # number for an integer one or a key to one, and NULL for either.
        target = output_field.target_field if output_field.is_relation else output_field
        self.as_is = ()
        if isinstance(target, models.CharField | models.TextField):
            self.as_is = (str, type(None))
        elif isinstance(target, models.IntegerField | models.AutoField):
            self.as_is = (int, type(None))

    @classmethod
    def of(cls, model, attname):
        """A value of `model`'s column `attname` (inbox_id, not inbox), named after it."""
        field = next(f for f in model._meta.concrete_fields if f.attname == attname)
        return cls(attname, field)

    def adapted(self, value, connection):
        if type(value) in self.as_is:  # not a subclass: a bool is no whole number here
            return value
        return self.output_field.get_db_prep_save(value, connection)

    def __repr__(self):
        return f"Given({self.name!r})"

    def as_sql(self, compiler, connection):
        return "%s", [self]


class _Compiled(NamedTuple):
    sql: str
    params: tuple
    places: tuple  # (position in params, the Given there)
    rows: object  # _Rows for a SELECT, None for a write


class _Rows(NamedTuple):
    """How a SELECT's rows become instances, as ModelIterable makes them."""

    model: type
    init_list: list  # the model's own columns' attnames, in order
    start: int
    end: int
    populators: list  # select_related's
    annotations: dict  # attribute -> column
    converters: list  # (column, [converter], expression)
    from_db: object  # the model's from_db, given the queryset's fetch mode where Django has them


class Prebuilt:
    """A statement `build()` states: a QuerySet (a SELECT) or a sql.Query (an UPDATE,
    UpdateQuery; an INSERT of one row, InsertQuery), compiled on first use for each
    database vendor."""

    def __init__(self, build):
        self.build = build
        self._compiled = {}

    def _compile(self) -> _Compiled:
        compiled = self._compiled.get(connection.vendor)
        if compiled is None:
            built = self.build()
            query = getattr(built, "query", built)
            compiler = query.get_compiler(DEFAULT_DB_ALIAS)
            # Django compiles a locking read only inside a transaction (autocommit off);
            # nothing runs in the one opened here for it.
            outside = query.select_for_update and connection.get_autocommit()
            with transaction.atomic() if outside else nullcontext():
                sql = compiler.as_sql()
            if isinstance(sql, list):  # an insert: one statement per batch, here one
                [sql] = sql
            sql, params = sql
            places = tuple((n, p) for n, p in enumerate(params) if isinstance(p, Given))
            rows = (
                _rows(compiler, getattr(built, "_fetch_mode", None))
                if compiler.klass_info
                else None
            )
            compiled = self._compiled[connection.vendor] = _Compiled(sql, params, places, rows)
        return compiled

    def statement(self, **values) -> tuple[str, list]:
        """Its text and parameters, each Given's value where it was, adapted."""
        compiled = self._compile()
        params = list(compiled.params)
        for n, given in compiled.places:
            params[n] = given.adapted(values[given.name], connection)
        return compiled.sql, params

    def instances(self, rows) -> list:
        """The model instances of rows the statement answered."""
        found = self._compile().rows
        made = []
        for row in rows:
            row = list(row)
            for column, converters, expression in found.converters:
                for converter in converters:
                    row[column] = converter(row[column], expression, connection)
            obj = found.from_db(DEFAULT_DB_ALIAS, found.init_list, row[found.start : found.end])
            for populator in found.populators:
                populator.populate(row, obj)
            for name, column in found.annotations.items():
                setattr(obj, name, row[column])
            made.append(obj)
        return made

    def all(self, **values) -> list:
        """The instances the statement answers."""
        return self.instances(current().read(self.statement(**values)))

    def get(self, **values):
        """The first instance the statement answers, or None."""
        made = self.instances(current().read(self.statement(**values))[:1])
        return made[0] if made else None

    def write(self, **values) -> None:
        """Run the write (in a locked_write on PostgreSQL, sent with the next statement whose
        result is read, or with the COMMIT: backends/postgresql.py)."""
        current().write(self.statement(**values))


# Django 6.1 gave querysets a fetch mode (how a deferred field or relation loads later), which
# the populators and from_db take; 5.2 has neither.
_FETCH_MODES = "fetch_mode" in inspect.signature(get_related_populators).parameters


def _rows(compiler, fetch_mode) -> _Rows:
    klass_info, select = compiler.klass_info, compiler.select
    model = klass_info["model"]
    if _FETCH_MODES:
        if fetch_mode.track_peers:
            raise ValueError("a prebuilt statement's instances have no peers: use FETCH_ONE")
        populators = get_related_populators(klass_info, select, DEFAULT_DB_ALIAS, fetch_mode)
        from_db = partial(model.from_db, fetch_mode=fetch_mode)
    else:
        populators = get_related_populators(klass_info, select, DEFAULT_DB_ALIAS)
        from_db = model.from_db
    start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
    expressions = [column[0] for column in select[: compiler.col_count]]
    converters = []
    # Computed once per vendor: a converter reads the connection's settings, never its state.
    for n, expression in enumerate(expressions):
        found = compiler.connection.ops.get_db_converters(expression)
        found += expression.get_db_converters(compiler.connection)
        if found:
            converters.append((n, found, expression))
    return _Rows(
        model=model,
        init_list=[column[0].target.attname for column in select[start:end]],
        start=start,
        end=end,
        populators=populators,
        annotations=dict(compiler.annotation_col_map),
        converters=converters,
        from_db=from_db,
    )
