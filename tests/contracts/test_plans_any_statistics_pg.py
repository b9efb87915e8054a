"""Every hot statement finds its rows through an index whatever the statistics say (PostgreSQL).

The statements a delivery (by slug, by id, by Inbox object, through a webhook, the duplicate
path), a worker's take and finish, and an approval's answer send are captured as the code
sends them (on psycopg's cursors, with their parameters and the settings sent before them),
then each is PREPAREd and EXPLAINed as EXECUTE under plan_cache_mode = force_generic_plan,
the plan a prepared statement keeps, after the settings the code sent in the same
transaction. Three states of the statistics, each gathered by ANALYZE before the
statements run:

- nearly empty tables (a new deployment);
- 120 inboxes whose work markers are all NULL (a fresh deployment, or a quiet moment: the
  planner then expects one lease row and turned the delivery into two nested seq scans);
- 2,000 inboxes and 200,000 events.

No plan may read a table that grows with the deployment by a sequential scan, and every
index read has a condition on its index's first column (not a walk of the whole index).
The captures go through the cursor path: the libpq path of the delivery's try (_Direct)
sends the same two statements (tests/inbox/test_ingest_pg.py checks it prepares them).

Each state's rows are made once for the module (the large one takes seconds); each test has a
desk of its own, made and analyzed with them and deleted after it, and the tables are checked
to hold the state's rows alone again.
"""

import itertools
import json
import re
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client

from alwayson.runtime.api import answer_approval, finish, ingest, request_approval
from approvals.services import answer_at_once
from inbox.models import Event, Inbox, Lease, Membership, Role, Session
from inbox.services import Held, claim_more, take_next
from tests.support.clock import T0
from tests.support.webhooks import BODY, GITHUB_SECRET, post, signed

pytestmark = [
    pytest.mark.postgres_only,
    # For pytest-django to make the test database; the fixtures below give the access.
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("github_secret"),
]


@pytest.fixture(autouse=True)
def _django_db_marker():
    """Overrides pytest-django's fixture of this name, which runs each django_db test as a
    TransactionTestCase, whose flush would empty the state after every test. Here `state` and
    `desk` open the database (autocommit, as a transactional test does) and leave it as they
    found it. Were pytest-django to rename its fixture, the flush would come back and `desk`
    would fail at once: the state's rows gone."""


# Tables that grow with the deployment: every table of the project's apps and the users'.
GROWING = re.compile(r"^(inbox|approvals|timers|outbox|alwayson|auth)_")
STATES = ["nearly-empty", "markers-null", "large"]


@pytest.fixture
def github_secret(settings):
    settings.ALWAYSON_GITHUB_SECRETS = [GITHUB_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}


# --- the statistics --------------------------------------------------------------------------


def inboxes(owner, count, t0):
    """`count` inboxes with their lease and session rows (bulk_create skips Inbox.save)."""
    made = Inbox.objects.bulk_create(
        Inbox(owner=owner, slug=f"noise-{n}", created=t0) for n in range(count)
    )
    Lease.objects.bulk_create(Lease(inbox=inbox, holder="", generation=0) for inbox in made)
    Session.objects.bulk_create(Session(inbox=inbox) for inbox in made)
    return made


def done_events(count, t0):
    """`count` finished events spread over every inbox, as history piles up."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                                     claim_gen, error, available_at, created, updated)
            SELECT i.ids[1 + n %% cardinality(i.ids)], 'chat', 'old-' || n, '{}', 'done', 1,
                   1, '', %s, %s, %s
            FROM generate_series(1, %s) AS n, (SELECT array_agg(id) AS ids FROM inbox_inbox) AS i
            """,
            [t0, t0, t0, count],
        )


def analyze():
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def row_counts():
    """Rows per table of the project, its users' and Django's."""
    tables = connection.introspection.django_table_names(only_existing=True)
    with connection.cursor() as cursor:
        return {
            table: cursor.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            for table in sorted(tables)
        }


@pytest.fixture(scope="module", params=STATES)
def state(request, django_db_setup, django_db_blocker):
    """The rows of the state besides the desk, made once for the module's tests of that state:
    the desk's owner and approver, and the noise. The database is flushed at the end, as a
    transactional test leaves it."""
    with django_db_blocker.unblock():
        owner = get_user_model().objects.create(username="owner")
        approver = get_user_model().objects.create(username="approver")
        if request.param == "markers-null":
            inboxes(owner, 120, T0)
        elif request.param == "large":
            noise = inboxes(owner, 2000, T0)
            done_events(200_000, T0 - timedelta(days=30))
            # Half the inboxes have work coming (a retry's backoff, a timer): the markers are set.
            Lease.objects.filter(inbox__in=noise[::2]).update(work_at=T0 + timedelta(days=1))
        try:
            yield owner, approver, row_counts()
        finally:
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture
def desk(state, django_db_blocker, t0):
    """The inbox the statements run on, "desk", in a database whose statistics are those of
    the state; an approver of it and a request waiting for an answer. Deleted after the test,
    with all it made: every table then holds the state's rows again."""
    owner, approver, counts = state
    with django_db_blocker.unblock():
        desk = Inbox.objects.create(owner=owner, slug="desk")
        Membership.objects.create(inbox=desk, user=approver, role=Role.APPROVER)
        analyze()
        request_approval(desk, "r1", "refund order 42", 3600, now=t0)
        desk.approver = approver
        yield desk
        restore(counts)


def restore(counts):
    """The state's rows alone again, as a flush and the state's making would leave them: the
    desk deleted with all it made, the rows the test wrote elsewhere (a metric's total)
    deleted, and the dead rows vacuumed away, so that every table has the pages it would
    have (a few dead rows in an emptied table already changed a plan)."""
    Inbox.objects.filter(slug="desk").delete()
    with transaction.atomic(), connection.cursor() as cursor:
        # Foreign keys are checked at the commit (Django makes them deferrable): any order.
        for table, count in row_counts().items():
            if count and not counts[table]:
                cursor.execute(f'DELETE FROM "{table}"')
    with connection.cursor() as cursor:
        cursor.execute("VACUUM " + ", ".join(f'"{table}"' for table in counts))
    assert row_counts() == counts, "the test changed the state's own rows"


# --- capturing and explaining ----------------------------------------------------------------


class Sent:
    """The statements psycopg's cursors send while `capturing`, with their parameters and
    whether each began a transaction (no transaction open and not queued behind another in
    a pipeline): there the settings of earlier statements no longer hold."""

    def __init__(self):
        self.statements = []  # (sql, params, fresh)
        self.last_pipeline = None

    def record(self, cursor, query, params):
        conn = cursor.connection
        pipeline = conn._pipeline
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        fresh = idle and (pipeline is None or pipeline is not self.last_pipeline)
        self.last_pipeline = pipeline
        self.statements.append((str(query), params, fresh))


@pytest.fixture
def capture(monkeypatch):
    """Run `work()`, return what it sent. An execute wrapper is installed meanwhile, so every
    statement goes through psycopg's cursors (the libpq path is not taken)."""

    def run(work):
        sent = Sent()
        execute = psycopg.Cursor.execute

        def recording(cursor, query, params=None, **kwargs):
            sent.record(cursor, query, params)
            return execute(cursor, query, params, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", recording)
        try:
            with connection.execute_wrapper(lambda call, *args: call(*args)):
                work()
        finally:
            monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        return sent.statements

    return run


_NAMED = re.compile(r"%\((\w+)\)s")
_names = (f"plans_{n}" for n in itertools.count())


def positional(sql, params):
    """`sql` with $1, $2, ... for its parameters (psycopg's %(name)s or %s), and their values
    in that order."""
    if isinstance(params, dict):
        names = []

        def number(match):
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        return _NAMED.sub(number, sql).replace("%%", "%"), [params[name] for name in names]
    counter = itertools.count(1)
    parts = sql.split("%%")
    text = "%".join(re.sub(r"%s", lambda _: f"${next(counter)}", part) for part in parts)
    return text, list(params or [])


CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


def generic_plans(sent):
    """(sql, plan) of each statement of `sent`, its generic plan under the settings the code
    sent before it, in one transaction rolled back."""
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        for sql, params, fresh in sent:
            if sql.lstrip().upper().startswith(CONTROL):
                continue
            if fresh:  # the settings of the statements before ended with their transaction
                cursor.execute("SET LOCAL enable_seqscan = on")
            if sql.startswith("SELECT set_config("):
                cursor.execute(sql, params)  # as the code sent it
                continue
            text, values = positional(sql, params)
            name = next(_names)
            cursor.execute(f"PREPARE {name} AS {text}")
            marks = ", ".join(["%s"] * len(values))
            execute = f"EXECUTE {name}({marks})" if values else f"EXECUTE {name}"
            cursor.execute(f"EXPLAIN (FORMAT JSON) {execute}", values)
            plan = cursor.fetchone()[0]
            plans.append((sql, plan if isinstance(plan, list) else json.loads(plan)))
            cursor.execute(f"DEALLOCATE {name}")
        transaction.set_rollback(True)
    return plans


def first_columns():
    """Each index's first column, by index name."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, a.attname FROM pg_index AS i
            JOIN pg_class AS c ON c.oid = i.indexrelid
            JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
            """
        )
        return dict(cursor.fetchall())


def nodes(plan):
    for node in plan:
        yield node
        yield from nodes(node.get("Plans", []))


def bad_reads(plan, columns):
    """What reads a growing table other than through a condition on an index's first column."""
    for node in nodes([entry["Plan"] for entry in plan]):
        kind, table = node["Node Type"], node.get("Relation Name", "")
        if kind == "Seq Scan" and GROWING.match(table):
            yield f"Seq Scan on {table}"
        if kind in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"):
            index = node["Index Name"]
            column = columns.get(index)
            condition = node.get("Index Cond", "")
            if column is None or not re.search(
                rf"\b{column}\b(\)::[\w ]+)?\s*(=|<|>|<=|>=)", condition
            ):
                yield f"{kind} on {index} without a condition on {column}: {condition!r}"


def assert_by_index(sent, least=1):
    plans = generic_plans(sent)
    assert len(plans) >= least, sent
    assert_plans_read_by_index(plans)
    return plans


def assert_plans_read_by_index(plans):
    """No (sql, plan) of `plans` reads a growing table but through its index (bad_reads)."""
    columns = first_columns()
    bad = {sql: list(bad_reads(plan, columns)) for sql, plan in plans}
    bad = {sql: reads for sql, reads in bad.items() if reads}
    assert not bad, "\n\n".join(f"{sql}\n  -> {reads}" for sql, reads in bad.items())


# --- the hot statements ----------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["slug", "id", "object"])
def test_ingest_plans_by_index(desk, capture, t0, ref):
    """The first delivery to an inbox without work (the try, then the locking statement) and
    the next ones (the try alone)."""
    name = {"slug": desk.slug, "id": desk.pk, "object": desk}[ref]

    def deliveries():
        assert ingest(name, "chat", "m-1", {}, now=t0)
        assert ingest(name, "chat", "m-2", {}, now=t0)

    sent = capture(deliveries)
    assert sum("FOR SHARE OF l SKIP LOCKED" in sql for sql, _, _ in sent) == 2, sent
    assert any("exclusive AS" in sql for sql, _, _ in sent), sent
    assert_by_index(sent, least=3)


def test_the_duplicate_of_a_delivery_plans_by_index(desk, capture, t0):
    ingest(desk.slug, "chat", "m-1", {}, now=t0)
    ingest(desk.slug, "chat", "m-2", {}, now=t0)
    sent = capture(lambda: ingest(desk.slug, "chat", "m-1", {}, now=t0 + timedelta(seconds=1)))
    assert Event.objects.filter(inbox=desk, source_id__in=["m-1", "m-2"]).count() == 2
    assert_by_index(sent)


def test_a_webhook_delivery_plans_by_index(desk, capture):
    client = Client()
    sent = capture(lambda: post(client, "github", desk.slug, BODY, signed("github", BODY)))
    assert Event.objects.filter(inbox=desk, source="github").count() == 1
    assert_by_index(sent)


def test_take_plans_by_index(desk, capture, t0):
    ingest(desk, "chat", "m-1", {}, now=t0)
    claims = []
    sent = capture(lambda: claims.append(take_next("W", now=t0)))
    assert claims[0].inbox == desk and len(claims[0].events) == 1
    assert_by_index(sent)


def test_a_runs_join_plans_by_index(desk, capture, t0):
    ingest(desk, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ingest(desk, "chat", "m-2", {}, now=t0)
    joined = []
    sent = capture(lambda: joined.append(claim_more(desk, "W", claim.generation, ["chat"], now=t0)))
    assert [event.source_id for event in joined[0]] == ["m-2"]
    # The join's own statement (claim_more.sql); the fence before it is fence.sql, which
    # claim_batch and every finish but a done one send too.
    [at] = [n for n, statement in enumerate(sent) if "e.attempts = 0" in statement[0]]
    assert sent[at - 1][0].startswith("SELECT set_config(")  # how the code plans it
    assert_by_index(sent[at - 1 : at + 1])


def test_finish_plans_by_index(desk, capture, t0):
    ingest(desk, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [event.pk for event in claim.events]
    sent = capture(lambda: finish(Held(desk, "W", claim.generation, ids), now=t0, release=True))
    assert Event.objects.get(pk=ids[0]).status == Event.Status.DONE
    assert_by_index(sent, least=2)


def test_an_answer_plans_by_index(desk, capture, t0):
    outcome = []
    sent = capture(
        lambda: outcome.append(
            answer_approval(desk.slug, "r1", "yes", now=t0, by=desk.approver).stands
        )
    )
    assert outcome == ["yes"]
    assert_by_index(sent, least=4)


def inner_plans(work):
    """(statement, plan) of each statement run inside the database's functions while `work()`
    runs, as auto_explain sees them (sent to this session as notices), each under its generic
    plan: the plan PL/pgSQL keeps for the session."""
    found = []
    settings = {
        "plan_cache_mode": "force_generic_plan",
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_format": "json",
        "auto_explain.log_level": "notice",
        "client_min_messages": "notice",
    }
    connection.ensure_connection()
    raw = connection.connection

    def heard(diagnostic):
        message = diagnostic.message_primary or ""
        if "plan:" in message:
            explained = json.loads(message.split("plan:", 1)[1])
            found.append((explained["Query Text"], [explained]))

    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in settings.items():
            cursor.execute("SELECT set_config(%s, %s, false)", [name, value])
    raw.add_notice_handler(heard)
    try:
        work()
    finally:
        raw.remove_notice_handler(heard)
        with connection.cursor() as cursor:
            for name in settings:
                cursor.execute(f"RESET {name}")
    return [(sql, plan) for sql, plan in found if not sql.lstrip().startswith("SELECT * FROM")]


def test_the_page_s_answer_in_one_statement_plans_every_statement_inside_it_by_index(desk, t0):
    """approvals/sql/answer.sql (answer_at_once, the page's plain answer): the statements of
    its function, the settled row's UPDATE among them (which read every waiting approval
    through approval_waiting_idx to find its own while it also named the unanswered
    condition)."""
    answered = []
    plans = inner_plans(
        lambda: answered.append(answer_at_once(desk.approver, desk.slug, "r1", "yes", now=t0))
    )

    assert answered[0].stands == "yes"
    assert any(sql.lstrip().startswith("UPDATE approvals_approval") for sql, _ in plans), plans
    assert_plans_read_by_index(plans)
