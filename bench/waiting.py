"""Waiting approvals for the answer rows, enough of them before each timed run: the product's
view answers an approval once, and wrk runs for a time, not a count.

Making each through the product (`request_approval`: the approval row, its expiry timer,
the approvers' notices, in one transaction) costs 7-16 ms here, so a run's thousands would
take minutes. Instead one template per inbox is made through the product at setup, and each
run's approvals are copies of its rows, made by SQL in one statement per table: every row of
the schema that names the template's request id (the approval, its expiry timer; the owner,
the only approver, gets no notice), every column copied as it is but the generated id and the
request id replaced wherever the row names it (the timer's key, its event key, the outcome
payload). The triggers fire on the copies as on the product's rows. What was copied from where
is printed with the rows (`describe`), and a copy is checked against its template.
"""

from datetime import timedelta

TEMPLATE = "bench-tmpl-{n:03d}-x"  # no template's id is part of another's


def _quoted(name) -> str:
    return '"' + name.replace('"', '""') + '"'


class Waiting:
    """The templates (one waiting approval per inbox, by slug), and per table the ids of the
    rows naming each; `make(requests)` copies one approval per (slug, request id)."""

    def __init__(self, slugs):
        from approvals.services import request_approval

        self.templates = {}
        for n, slug in enumerate(slugs):
            request_id = TEMPLATE.format(n=n)
            request_approval(slug, request_id, "refund order 881", timedelta(days=1))
            self.templates[slug] = request_id
        self.tables, self.rows = self._rows_naming(list(self.templates.values()))
        if not all(self.rows["approvals_approval"].values()):
            raise RuntimeError("a template approval's row was not found")

    @staticmethod
    def _rows_naming(request_ids):
        """Every table of the schema with rows naming the templates' request ids: its
        columns (name, data type) but the generated ones, and the ids of those rows by
        request id."""
        from django.db import connection

        tables, rows = {}, {}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
            for (table,) in cursor.fetchall():
                cursor.execute(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
                    " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                    " WHERE i.indrelid = %s::regclass AND i.indisprimary",
                    [_quoted(table)],
                )
                keys = [name for (name,) in cursor.fetchall()]
                cursor.execute(
                    f"SELECT c.old, t.{_quoted(keys[0])} FROM {_quoted(table)} AS t"
                    " JOIN unnest(%s::text[]) AS c(old)"
                    " ON strpos(row_to_json(t)::text, c.old) > 0",
                    [request_ids],
                )
                found = cursor.fetchall()
                if not found:
                    continue
                if keys != ["id"]:
                    raise RuntimeError(f"{table} names an approval but its key is not one id")
                rows[table] = {request_id: [] for request_id in request_ids}
                for request_id, row_id in found:
                    rows[table][request_id].append(row_id)
                cursor.execute(
                    "SELECT column_name, data_type FROM information_schema.columns"
                    " WHERE table_schema = current_schema() AND table_name = %s"
                    " AND is_identity = 'NO' AND is_generated = 'NEVER'"
                    " AND coalesce(column_default, '') NOT LIKE 'nextval(%%'"
                    " ORDER BY ordinal_position",
                    [table],
                )
                tables[table] = cursor.fetchall()
        return tables, rows

    def describe(self) -> str:
        """The tables the copies are made in, with the rows each template has there."""
        return ", ".join(
            f"{table} ({max(len(ids) for ids in self.rows[table].values())} row(s))"
            for table in self.tables
        )

    def make(self, requests) -> int:
        """One waiting approval per (slug, request id), copied from the slug's template in
        one transaction: how many approvals were made."""
        from django.db import connection, transaction

        made = 0
        with transaction.atomic(), connection.cursor() as cursor:
            for table, columns in self.tables.items():
                ids, olds, news = [], [], []
                for slug, request_id in requests:
                    old = self.templates[slug]
                    for row_id in self.rows[table][old]:
                        ids.append(row_id)
                        olds.append(old)
                        news.append(request_id)
                cursor.execute(_copy(table, columns), [ids, olds, news])
                if table == "approvals_approval":
                    made = cursor.rowcount
        if made != len(requests):
            raise RuntimeError(f"made {made} waiting approvals of the {len(requests)} asked")
        return made

    def check_copy(self, slug, request_id):
        """A copy is its template but for its id and its request id."""
        from approvals.models import Approval

        template = Approval.objects.get(inbox__slug=slug, request_id=self.templates[slug])
        copy = Approval.objects.get(inbox__slug=slug, request_id=request_id)
        for field in Approval._meta.concrete_fields:
            if field.attname in ("id", "request_id"):
                continue
            ours, theirs = getattr(copy, field.attname), getattr(template, field.attname)
            if ours != theirs:
                raise RuntimeError(
                    f"a copied approval's {field.attname} is {ours!r}, not {theirs!r}"
                )


def _copy(table, columns) -> str:
    """INSERT a copy of each row of `table` whose id is in parameter 1, its old request id
    (parameter 2) replaced by the new one (parameter 3) in every text or JSON column."""
    names, values = [], []
    for name, data_type in columns:
        column = f"t.{_quoted(name)}"
        names.append(_quoted(name))
        if data_type in ("text", "character varying"):
            values.append(f"replace({column}, c.old, c.new)")
        elif data_type in ("json", "jsonb"):
            values.append(f"replace({column}::text, c.old, c.new)::{data_type}")
        else:
            values.append(column)
    return (
        f"INSERT INTO {_quoted(table)} ({', '.join(names)})"
        f" SELECT {', '.join(values)}"
        " FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS c(id, old, new)"
        f" JOIN {_quoted(table)} AS t ON t.id = c.id"
    )
