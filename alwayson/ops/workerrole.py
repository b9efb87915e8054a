"""The sealed worker's database role: the tables and columns a run needs, and nothing more.

Agent code runs in the worker, so whatever the worker's connection can read, an agent can
read. Sealing (alwayson/egress/sealing.py) keeps the credentials out of its environment; this
keeps the rest of the database out of its reach: a PostgreSQL role of its own that reaches
only what a run uses (its inbox's events, lease and session, what the verbs write, the
heartbeat and metrics rows, and the names of the people it notifies), never the web's
sessions (a session key logs in as its user), password hashes, login attempts, the egress
app's tables or the admin log.

What a run needs is declared here for the machinery below the runtime (inbox, timers,
approvals, outbox, ops) and by each app above it in its ready() (`need`): the runtime, the
Claude agent, the live pages' triggers, the demo. A team whose agent writes tables of its
own declares them the same way. `manage.py workerrole` grants exactly that to a role and
revokes the rest; `runworker`, sealed, checks its own role at start-up (`reach`) and refuses
to start when it reaches more, or less, than this.

Statements run as the role that makes them, never as a table's owner: PostgreSQL checks a
trigger's statements against the role whose write fired it (the live pages' triggers insert
into LiveChange and read LiveWatch as the worker), and checks a foreign key as the owner of
the table it references (a notice's recipient needs no grant on the user table's other
columns). LISTEN and NOTIFY need no grant.
"""

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import models

from alwayson.ops.models import DeadAlert, MetricTotal, Process
from approvals.models import Approval
from inbox.models import (
    Event,
    EventTrace,
    Inbox,
    Lease,
    Membership,
    RunRecord,
    Session,
    person_fields,
)
from outbox.models import Notice, OutboxMessage
from timers.models import Timer

SELECT, INSERT, UPDATE, DELETE = "SELECT", "INSERT", "UPDATE", "DELETE"
GRANTABLE = (SELECT, INSERT, UPDATE, DELETE)
# Every privilege a role can hold on a table: the check finds any of them beyond the needs.
TABLE_PRIVILEGES = (SELECT, INSERT, UPDATE, DELETE, "TRUNCATE", "REFERENCES", "TRIGGER")
# The ones PostgreSQL also grants per column: a grant on any column counts.
COLUMN_PRIVILEGES = (SELECT, INSERT, UPDATE, "REFERENCES")
# A role name the command makes: an SQL identifier as people write them, not a reserved one.
ROLE_NAME = re.compile(r"(?!pg_)[a-z_][a-z0-9_]{0,62}")
# Where the fix is explained, in every message that asks for it.
DOCS = "docs/how-to/egress.md#the-workers-database-role"


@dataclass(frozen=True)
class Need:
    """What a run needs of one table: `privileges`, and with `fields`, SELECT of these
    fields' columns only (the rest of the table stays out of reach)."""

    model: type[models.Model]
    privileges: tuple[str, ...]
    fields: tuple[str, ...] | None = None
    why: str = ""

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    @property
    def columns(self) -> tuple[str, ...] | None:
        if self.fields is None:
            return None
        return tuple(self.model._meta.get_field(name).column for name in self.fields)

    @property
    def inserts(self) -> bool:
        return INSERT in self.privileges

    def describe(self) -> str:
        if self.columns is not None:
            return f"SELECT ({', '.join(self.columns)})"
        return ", ".join(self.privileges)


_needs: dict[str, Need] = {}


def need(model, *privileges, fields=None, why=""):
    """Declare that a run needs `privileges` (SELECT, INSERT, UPDATE, DELETE) on `model`'s
    table, or with `fields` SELECT of those fields only. Called from an app's ready(); a
    second declaration of a table adds its privileges to the first."""
    if isinstance(model, str):
        model = apps.get_model(model)
    unknown = [p for p in privileges if p not in GRANTABLE]
    if not privileges or unknown:
        raise ValueError(
            f"privileges must be some of {', '.join(GRANTABLE)}, not {', '.join(privileges)}"
        )
    if fields is not None:
        fields = tuple(fields)
        if privileges != (SELECT,):
            raise ValueError("fields: a column list is for SELECT alone")
        for name in fields:
            model._meta.get_field(name)  # FieldDoesNotExist names it
    table = model._meta.db_table
    out_of_reach = forbidden_tables().get(table)
    if out_of_reach:
        raise ValueError(f"{table} ({out_of_reach}) is never in the worker's reach")
    if model is get_user_model() and (fields is None or "password" in fields):
        raise ValueError(
            "the user table's password column is never in the worker's reach: name the "
            "fields a run reads"
        )
    earlier = _needs.get(table)
    if earlier is not None:
        if (earlier.fields is None) != (fields is None):
            raise ValueError(f"{table}: declared once with a column list and once without")
        merged = tuple(p for p in GRANTABLE if p in earlier.privileges or p in privileges)
        both = None if fields is None else tuple(dict.fromkeys(earlier.fields + fields))
        why = "; ".join(filter(None, [earlier.why, why]))
        _needs[table] = Need(model, merged, both, why)
        return
    _needs[table] = Need(model, tuple(p for p in GRANTABLE if p in privileges), fields, why)


def needs() -> list[Need]:
    """Every table a run needs, by table name."""
    return [_needs[table] for table in sorted(_needs)]


def declare_machinery():
    """What a run needs of the tables below the runtime: the inbox's take and finish, what
    the verbs write (outbox messages, approvals and their notices, timers, session state),
    the dead events' alert, and this process's heartbeat and metrics. OpsConfig.ready()."""
    need(Inbox, SELECT, why="the take reads the inbox a run is for")
    need(Lease, SELECT, UPDATE, why="take, renew, fence and release the lease")
    need(Event, SELECT, UPDATE, why="claim the batch, finish it, park dead events")
    need(Session, SELECT, INSERT, UPDATE, why="the session state a run saves")
    need(RunRecord, SELECT, INSERT, UPDATE, why="the run's record: done, lost, refused")
    need(EventTrace, SELECT, why="a run's span continues its events' traces")
    need(Membership, SELECT, why="who approves: the people a notice goes to")
    need(OutboxMessage, SELECT, INSERT, why="say")
    need(Approval, SELECT, INSERT, why="ask")
    need(Notice, SELECT, INSERT, UPDATE, why="ask and dead events tell people by notice")
    need(Timer, SELECT, INSERT, UPDATE, why="schedule, and an approval's expiry timer")
    need(DeadAlert, SELECT, INSERT, UPDATE, why="dead events' alert, at most once an interval")
    need(Process, SELECT, INSERT, UPDATE, DELETE, why="the heartbeat; a day-old row is pruned")
    need(MetricTotal, SELECT, INSERT, UPDATE, why="the run counts, added at each beat")
    # The people a notice goes to, and the operators a dead-event alert goes to (who may
    # view events: through their groups' or their own permissions).
    users = get_user_model()
    need(users, SELECT, fields=person_fields(), why="the names of the people a run notifies")
    if hasattr(users, "groups") and hasattr(users, "user_permissions"):
        need(users.groups.through, SELECT, why="approvers and operators through their groups")
        need(users.user_permissions.through, SELECT, why="operators: who may view events")
        need(Group, SELECT, why="operators: who may view events")
        need(Group.permissions.through, SELECT, why="operators: who may view events")
        need(Permission, SELECT, why="operators: who may view events")
        need(ContentType, SELECT, why="operators: who may view events")


def forbidden_tables() -> dict[str, str]:
    """The tables no worker may reach, whatever a team declares, and what they hold."""
    kept = {
        "sessions": "the web's sessions: a session key logs in as its user",
        "axes": "login attempts",
        "alwayson_egress": "the egress app's tables",
        "admin": "the admin log",
    }
    tables = {}
    for label, what in kept.items():
        try:
            config = apps.get_app_config(label)
        except LookupError:
            continue  # not installed here: nothing of it to keep out
        for model in config.get_models(include_auto_created=True):
            tables[model._meta.db_table] = what
    return tables


def django_tables() -> list[str]:
    """Every table of an installed model: what the check looks at."""
    tables = {
        model._meta.db_table
        for model in apps.get_models(include_auto_created=True)
        if model._meta.managed and not model._meta.proxy
    }
    return sorted(tables)


# --- the check ---------------------------------------------------------------------------------

# Per table and privilege: whether `role` holds it, on the table or (for the privileges that
# exist per column) on any column. NULL: no such table.
HELD = """
SELECT t.name, p.privilege,
    CASE WHEN t.rel IS NULL THEN NULL
         WHEN p.privilege = ANY(%(column_privileges)s::text[])
             THEN has_any_column_privilege(%(role)s::name, t.rel, p.privilege)
         ELSE has_table_privilege(%(role)s::name, t.rel, p.privilege) END,
    CASE WHEN t.rel IS NULL THEN NULL
         ELSE has_table_privilege(%(role)s::name, t.rel, p.privilege) END
FROM (SELECT name, to_regclass(quote_ident(name)) AS rel
      FROM unnest(%(tables)s::text[]) AS name) AS t,
     unnest(%(privileges)s::text[]) AS p(privilege)
"""
# A column-limited table's columns, each with whether `role` may read it.
COLUMNS = """
SELECT a.attname, has_column_privilege(%(role)s::name, a.attrelid, a.attname, 'SELECT')
FROM pg_attribute AS a
WHERE a.attrelid = to_regclass(quote_ident(%(table)s)) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# The id sequence of each table a run inserts into (identity or serial), and whether the
# role may use it: PostgreSQL asks for it with a serial column.
SEQUENCES = """
SELECT t.name, s.seq, has_sequence_privilege(%(role)s::name, s.seq, 'USAGE')
FROM unnest(%(tables)s::text[], %(columns)s::text[]) AS t(name, pk),
     LATERAL (SELECT pg_get_serial_sequence(quote_ident(t.name), t.pk) AS seq) AS s
WHERE s.seq IS NOT NULL
"""
# What makes grants meaningless: a superuser or a role that may make roles (and so grant
# itself the owner's, before PostgreSQL 16), bypassing row security, or being (a member
# of) a table's owner; and a schema it may create objects in (a function named like one a
# query calls, found first on the search path).
ROLE = """
SELECT r.rolsuper, r.rolcreaterole, r.rolbypassrls,
    ARRAY(SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class AS c
          WHERE c.oid = ANY(ARRAY(SELECT to_regclass(quote_ident(name))
                                  FROM unnest(%(tables)s::text[]) AS name))
            AND pg_has_role(%(role)s::name, c.relowner, 'MEMBER')),
    has_schema_privilege(%(role)s::name, current_schema(), 'CREATE'),
    current_schema()
FROM pg_roles AS r WHERE r.rolname = %(role)s
"""


@dataclass
class Reach:
    """What `role` reaches compared with what a run needs: `excess` (it must not), `missing`
    (a run would fail), and `grave` (nothing granted can fix: the role's own attributes)."""

    role: str
    excess: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    grave: list[str] = field(default_factory=list)

    @property
    def right(self) -> bool:
        return not (self.excess or self.missing or self.grave)

    def problem(self) -> str:
        """One line: what is wrong with the role and what fixes it; "" when nothing is."""
        if self.right:
            return ""
        if self.grave:
            return (
                f"the worker's database role {self.role} {'; '.join(self.grave)}, so it "
                f"reaches every table an agent must not (sessions, password hashes): give "
                f"the worker a role of its own, `manage.py workerrole <role>` run as the "
                f"tables' owner after migrate, and name it in ALWAYSON_WORKER_DATABASE_URL "
                f"({DOCS})"
            )
        parts = []
        if self.excess:
            parts.append(f"reaches what a run must not ({_listed(self.excess)})")
        if self.missing:
            parts.append(f"lacks what a run needs ({_listed(self.missing)})")
        return (
            f"the worker's database role {self.role} {' and '.join(parts)}: run "
            f"`manage.py workerrole {self.role}` as the tables' owner after migrate ({DOCS})"
        )


def _listed(items, shown=6) -> str:
    more = len(items) - shown
    return "; ".join(items[:shown]) + (f"; and {more} more" if more > 0 else "")


def reach(connection, role=None) -> Reach:
    """What `role` (default: the connection's own) reaches of the tables, against the
    needs. PostgreSQL only."""
    with connection.cursor() as cursor:
        if role is None:
            cursor.execute("SELECT current_user")
            [role] = cursor.fetchone()
        tables = django_tables()
        declared = {need.table: need for need in needs()}
        forbidden = forbidden_tables()
        result = Reach(role)
        cursor.execute(ROLE, {"role": role, "tables": tables})
        row = cursor.fetchone()
        if row is None:
            result.grave.append("does not exist")
            return result
        superuser, createrole, bypassrls, owners, creates, schema = row
        if superuser:
            result.grave.append("is a superuser")  # the rest follows from it
            return result
        if createrole:
            result.grave.append("may create roles (CREATEROLE)")
        if bypassrls:
            result.grave.append("bypasses row security (BYPASSRLS)")
        for owner in owners:
            result.grave.append(
                "owns the tables" if owner == role else f"is a member of {owner}, their owner"
            )
        if result.grave:
            return result
        if creates:
            result.excess.append(f"CREATE on schema {schema}")
        cursor.execute(
            HELD,
            {
                "role": role,
                "tables": tables,
                "privileges": list(TABLE_PRIVILEGES),
                "column_privileges": list(COLUMN_PRIVILEGES),
            },
        )
        held = {}
        for table, privilege, anywhere, whole in cursor.fetchall():
            held[table, privilege] = (anywhere, whole)
        for table in tables:
            wanted = declared.get(table)
            if held[table, SELECT][0] is None:
                if wanted is not None:
                    result.missing.append(f"{table} does not exist: migrate first")
                continue
            for privilege in TABLE_PRIVILEGES:
                anywhere, whole = held[table, privilege]
                if wanted is not None and privilege in wanted.privileges:
                    if wanted.columns is None and not whole:
                        result.missing.append(f"{table}: {privilege}")
                elif anywhere:
                    what = f" ({forbidden[table]})" if table in forbidden else ""
                    result.excess.append(f"{table}: {privilege}{what}")
            if wanted is not None and wanted.columns is not None:
                _check_columns(cursor, role, wanted, result)
        _check_sequences(cursor, role, [n for n in declared.values() if n.inserts], result)
    # What an agent must never reach first (they say what they hold): what the check is for.
    result.excess.sort(key=lambda item: not item.endswith(")"))
    return result


def _check_columns(cursor, role, wanted: Need, result: Reach):
    cursor.execute(COLUMNS, {"role": role, "table": wanted.table})
    for column, readable in cursor.fetchall():
        if column in wanted.columns and not readable:
            result.missing.append(f"{wanted.table}.{column}: SELECT")
        elif column not in wanted.columns and readable:
            what = " (password hashes)" if column == "password" else ""
            result.excess.append(f"{wanted.table}.{column}: SELECT{what}")


def _check_sequences(cursor, role, inserting: list[Need], result: Reach):
    cursor.execute(
        SEQUENCES,
        {
            "role": role,
            "tables": [n.table for n in inserting],
            "columns": [n.model._meta.pk.column for n in inserting],
        },
    )
    for table, sequence, usable in cursor.fetchall():
        if not usable:
            result.missing.append(f"{sequence} (the ids of {table}): USAGE")


# --- the grants --------------------------------------------------------------------------------


def grants(connection, role) -> list[tuple[str, str]]:
    """The statements that give `role` what a run needs and take away the rest, each with
    what it does in words: revoke everything in each schema of the tables, then grant
    connect, the schemas' usage, each need, and the sequences of the tables a run inserts
    into. Run them in one transaction: the role never reaches more than before."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_database(), ARRAY(SELECT DISTINCT n.nspname FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE c.oid = ANY(ARRAY(SELECT to_regclass(quote_ident(name))"
            " FROM unnest(%s::text[]) AS name)) ORDER BY 1)",
            [django_tables()],
        )
        database, schemas = cursor.fetchone()
        inserting = [n for n in needs() if n.inserts]
        cursor.execute(
            "SELECT t.name, pg_get_serial_sequence(quote_ident(t.name), t.pk)"
            " FROM unnest(%s::text[], %s::text[]) AS t(name, pk)",
            [[n.table for n in inserting], [n.model._meta.pk.column for n in inserting]],
        )
        sequences = [(table, sequence) for table, sequence in cursor.fetchall() if sequence]
    who = quote(role)
    statements = []
    for schema in schemas:
        statements += [
            (
                f"REVOKE ALL ON ALL TABLES IN SCHEMA {quote(schema)} FROM {who}",
                f"revoked every privilege on the tables of schema {schema}",
            ),
            (f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {quote(schema)} FROM {who}", None),
        ]
    statements.append(
        (f"GRANT CONNECT ON DATABASE {quote(database)} TO {who}", f"granted CONNECT on {database}")
    )
    for schema in schemas:
        statements.append(
            (f"GRANT USAGE ON SCHEMA {quote(schema)} TO {who}", f"granted USAGE on schema {schema}")
        )
    for wanted in needs():
        if wanted.columns is not None:
            listed = ", ".join(quote(column) for column in wanted.columns)
            what = f"SELECT ({listed})"
        else:
            what = ", ".join(wanted.privileges)
        statements.append(
            (
                f"GRANT {what} ON TABLE {quote(wanted.table)} TO {who}",
                f"granted {wanted.describe()} on {wanted.table}",
            )
        )
    for table, sequence in sequences:
        # pg_get_serial_sequence answers the name quoted as needed, schema-qualified.
        statements.append(
            (
                f"GRANT USAGE ON SEQUENCE {sequence} TO {who}",
                f"granted USAGE on {sequence} ({table}'s ids)",
            )
        )
    return statements


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = 4096) -> str:
    """`password` as PostgreSQL stores it (SCRAM-SHA-256, RFC 7677), made here so that the
    password itself never reaches the server, nor its log of role statements. ASCII only:
    PostgreSQL prepares other text (SASLprep) before hashing it, and this does not."""
    if not password.isascii():
        raise ValueError("the password must be ASCII (letters, digits, punctuation)")
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = base64.b64encode
    return (
        f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
    )
