"""The worker's finish on PostgreSQL when the run ended well with nothing else to commit:
the plan setting, the lease row's lock, the fenced finish (and the next take) sent as one
pipeline, one implicit transaction. The rules are finish's own
(tests/inbox/test_take_next.py, tests/inbox/test_inbox_rules.py); these tests run outside a
transaction, where the pipeline is used, and check that a refusal or an error leaves nothing
written and no transaction open.
"""

from contextlib import nullcontext
from datetime import timedelta

import psycopg
import pytest
from django.db import OperationalError, connection

from alwayson.runtime.api import acquire, finish, ingest
from inbox.backends import postgresql
from inbox.backends.postgresql import BY_INDEX, BY_INDEX_LEASE
from inbox.exceptions import UnknownInbox
from inbox.models import Event, Inbox, Lease, RunRecord
from inbox.services import Held, SaveState, finish_and_take, take_next
from tests.support.postgres import other_session

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

SECOND = timedelta(seconds=1)


@pytest.fixture
def pipelines(monkeypatch):
    """The pipelines the connection sends for finishes, each as the statements it sent
    through libpq (_Direct, the path taken while nothing watches the queries); one sent on
    psycopg's cursors counts too, as None (every other hot statement is a pipeline of its
    own too, with its plan setting: postgresql.BY_INDEX)."""
    opened, finishing = [], []
    original = psycopg.Connection.pipeline
    direct = postgresql._Direct._pipeline
    finish_done = postgresql._finish_done

    def counting(self):
        if finishing:
            opened.append(None)
        return original(self)

    def counting_direct(self, calls):
        if finishing:
            opened.append([sql for sql, *_ in calls])
        return direct(self, calls)

    def finish(*args, **kwargs):
        finishing.append(True)
        try:
            return finish_done(*args, **kwargs)
        finally:
            finishing.pop()

    monkeypatch.setattr(psycopg.Connection, "pipeline", counting)
    monkeypatch.setattr(postgresql._Direct, "_pipeline", counting_direct)
    monkeypatch.setattr(postgresql, "_finish_done", finish)
    return opened


def lease_row(inbox):
    return Lease.objects.filter(inbox=inbox).values_list("holder", "generation", "until").get()


def states(inbox):
    return sorted(Event.objects.filter(inbox=inbox).values_list("status", "claim_gen"))


def no_transaction_open():
    return connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_good_finish_commits_in_one_pipeline(inbox, t0, pipelines):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    ingest(inbox, "chat", "m-3", {}, now=t0 + SECOND)  # arrived during the run

    assert finish(Held(inbox, "W", claim.generation, ids), now=t0 + SECOND, release=True) is True
    assert pipelines == [[BY_INDEX, postgresql.LOCK, postgresql.FINISH_DONE]]
    assert no_transaction_open()
    assert lease_row(inbox) == ("W", claim.generation, None)
    assert Lease.objects.get(inbox=inbox).work_at == t0 + SECOND  # m-3, recounted
    assert states(inbox) == [("done", 1), ("done", 1), ("pending", None)]
    # The run's record is a part of the same statement: no round trip of its own.
    record = RunRecord.objects.get(inbox=inbox)
    assert (record.outcome, record.events, record.started) == ("done", ids, t0)


def test_a_finish_after_the_lease_was_taken_over_writes_nothing(inbox, t0, ttl, pipelines):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    new = acquire(inbox, "B", now=later)
    ids = [e.pk for e in old.events]

    assert finish(Held(inbox, "A", old.generation, ids), now=later, release=True) is False
    assert len(pipelines) == 1
    assert no_transaction_open()
    assert lease_row(inbox) == ("B", new, later + ttl)
    assert states(inbox) == [("running", old.generation)]
    assert not RunRecord.objects.exists()


def test_a_second_finish_of_one_claim_is_refused(inbox, t0, pipelines):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    # Without release, so the lease is still held by the same generation the second time.
    assert finish(Held(inbox, "W", claim.generation, ids), now=t0) is True
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)
    held = lease_row(inbox)

    assert finish(Held(inbox, "W", claim.generation, ids), now=t0 + SECOND, release=True) is False
    assert len(pipelines) == 2
    assert no_transaction_open()
    assert lease_row(inbox) == held  # not released by the refusal
    assert Lease.objects.get(inbox=inbox).work_at == t0 + SECOND
    assert states(inbox) == [("done", claim.generation), ("pending", None)]


def test_a_finish_naming_an_event_it_did_not_claim_writes_nothing(inbox, t0, pipelines):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)
    stranger = Event.objects.get(source_id="m-2").pk
    ids = [e.pk for e in claim.events] + [stranger]
    held = lease_row(inbox)

    assert finish(Held(inbox, "W", claim.generation, ids), now=t0 + SECOND, release=True) is False
    assert no_transaction_open()
    assert lease_row(inbox) == held  # still held: a refused finish gives nothing back
    assert states(inbox) == [("pending", None), ("running", claim.generation)]


def test_a_finish_for_an_inbox_that_is_gone_raises_unknown_inbox(inbox, t0, pipelines):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    inbox_id = inbox.pk
    Inbox.objects.filter(pk=inbox_id).delete()

    with pytest.raises(UnknownInbox):
        finish(Held(inbox_id, "W", claim.generation, ids), now=t0, release=True)
    assert no_transaction_open()
    assert not Event.objects.exists()


@pytest.fixture
def warn_unreplicated():
    """warn_unreplicated(model, on): `on` (UPDATE, INSERT) of `model`'s rows answered with the
    WARNING PostgreSQL sends when a commit's wait for the synchronous standby is cancelled,
    until warn_unreplicated(None). A trigger stands in for the commit here;
    tests/ops/test_durability.py has the real one, on a cluster with a standby."""
    table = []

    def warn(model, on=None):
        with connection.cursor() as cursor:
            if table:
                cursor.execute(f"DROP TRIGGER syncrep_warning ON {table.pop()}")
            if model is not None:
                table.append(connection.ops.quote_name(model._meta.db_table))
                cursor.execute(
                    f"CREATE TRIGGER syncrep_warning AFTER {on} ON {table[0]}"
                    " FOR EACH ROW EXECUTE FUNCTION syncrep_warning()"
                )

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION syncrep_warning() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " RAISE WARNING 'canceling wait for synchronous replication due to user request'"
            " USING DETAIL = 'The transaction has already committed locally, but might not"
            " have been replicated to the standby.'; RETURN NEW; END $$"
        )
    yield warn
    warn(None)
    with connection.cursor() as cursor:
        cursor.execute("DROP FUNCTION syncrep_warning()")


@pytest.mark.parametrize("watched", [False, True], ids=["libpq", "psycopg-cursors"])
def test_a_finish_cut_short_of_the_synchronous_standby_is_not_reported_done(
    inbox, t0, warn_unreplicated, caplog, watched, django_assert_max_num_queries
):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    held = Held(inbox, "W", claim.generation, [e.pk for e in claim.events])
    warn_unreplicated(Lease, "UPDATE")

    with (
        caplog.at_level("ERROR", logger="alwayson.durability"),
        django_assert_max_num_queries(10) if watched else nullcontext(),
        pytest.raises(postgresql.Unreplicated, match="a failover to the standby may lose it"),
    ):
        finish(held, now=t0 + SECOND, release=True)
    [record] = caplog.records
    assert "a failover may lose it" in record.getMessage()
    assert "committed locally" in record.getMessage()
    # Committed here all the same: only a failover would lose it.
    assert states(inbox) == [("done", claim.generation)]
    assert no_transaction_open()

    # A warning heard outside a finish (an ingest's commit) is logged, and no later finish
    # on the connection is blamed for it.
    warn_unreplicated(Event, "INSERT")
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)
    assert len(caplog.records) == 2
    warn_unreplicated(None)
    again = take_next("W", now=t0 + 2 * SECOND)
    ids = [e.pk for e in again.events]
    assert finish(Held(inbox, "W", again.generation, ids), now=t0 + 2 * SECOND, release=True)


def test_a_lock_timeout_mid_pipeline_rolls_back_and_leaves_the_connection_usable(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    other = other_session()
    try:
        # Another session holds the lease row (a frozen delivery, say).
        other.execute("SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [inbox.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        with pytest.raises(OperationalError):
            finish(Held(inbox, "W", claim.generation, ids), now=t0, release=True)
        assert no_transaction_open()
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert states(inbox) == [("running", claim.generation)]
    assert finish(Held(inbox, "W", claim.generation, ids), now=t0, release=True) is True
    assert states(inbox) == [("done", claim.generation)]


def test_a_finish_on_a_severed_connection_raises_and_writes_nothing(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    with other_session(autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])

    with pytest.raises(OperationalError):
        finish(Held(inbox, "W", claim.generation, ids), now=t0, release=True)
    connection.close()  # as the worker's slot does after a database error
    assert states(inbox) == [("running", claim.generation)]
    assert finish(Held(inbox, "W", claim.generation, ids), now=t0, release=True) is True


def test_a_finish_and_the_next_take_commit_in_one_pipeline(make_inbox, t0, pipelines):
    first, second = make_inbox(), make_inbox()
    ingest(first, "chat", "a-1", {}, now=t0)
    ingest(second, "chat", "b-1", {}, now=t0 + SECOND)
    claim = take_next("W", now=t0 + SECOND)

    finished, following = finish_and_take(
        Held(first, "W", claim.generation, [e.pk for e in claim.events]), now=t0 + SECOND
    )
    assert finished is True
    [[setting, lock, finished_done, take]] = pipelines
    assert (setting, lock, finished_done) == (BY_INDEX, postgresql.LOCK, postgresql.FINISH_DONE)
    assert "FOR UPDATE OF inbox_lease SKIP LOCKED" in take
    assert no_transaction_open()
    assert following.inbox == second and [e.source_id for e in following.events] == ["b-1"]
    assert states(first) == [("done", claim.generation)]
    assert states(second) == [("running", following.generation)]


def test_a_watched_finish_and_take_go_through_psycopgs_cursors_in_one_pipeline(
    make_inbox, t0, pipelines
):
    """While something watches the queries (an execute wrapper, DEBUG's log) they go through
    Django's cursors, so it sees them: still one pipeline, one transaction."""
    first, second = make_inbox(), make_inbox()
    ingest(first, "chat", "a-1", {}, now=t0)
    ingest(second, "chat", "b-1", {}, now=t0 + SECOND)
    claim = take_next("W", now=t0 + SECOND)
    seen = []

    def watch(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        finished, following = finish_and_take(
            Held(first, "W", claim.generation, [e.pk for e in claim.events]), now=t0 + SECOND
        )
    assert finished is True and pipelines == [None]
    assert seen[:2] == [postgresql.LOCK, postgresql.FINISH_DONE] and len(seen) == 3
    assert no_transaction_open()
    assert following.inbox == second
    assert states(first) == [("done", claim.generation)]
    assert states(second) == [("running", following.generation)]


def test_a_refused_finish_still_hands_over_the_claim_its_take_committed(make_inbox, t0, ttl):
    mine, other = make_inbox(), make_inbox()
    ingest(mine, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    acquire(mine, "B", now=later)
    ingest(other, "chat", "o-1", {}, now=later)

    finished, following = finish_and_take(
        Held(mine, "A", old.generation, [e.pk for e in old.events]), now=later
    )
    assert finished is False
    assert following.inbox == other
    assert states(other) == [("running", following.generation)]
    assert states(mine) == [("running", old.generation)]


def prepared_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


def test_pipelined_runs_prepare_each_statement_once_per_connection(make_inbox, t0):
    connection.close()  # a session of its own: nothing prepared yet
    inboxes = [make_inbox() for _ in range(4)]
    for n, inbox in enumerate(inboxes):
        ingest(inbox, "chat", f"m-{n}", {}, now=t0)
    claim = take_next("W", now=t0)
    while claim is not None:
        ids = [e.pk for e in claim.events]
        finished, claim = finish_and_take(Held(claim.inbox, "W", claim.generation, ids), now=t0)
        assert finished
    prepared = prepared_statements()
    # The take, the finish's lock and the finish; an ingest's first try and, for an inbox
    # with no marker yet, its locking statement.
    for marker in (
        "FOR UPDATE OF inbox_lease SKIP LOCKED",
        "inbox_id = $1::bigint FOR UPDATE",
        "held AS",
        "FOR SHARE OF l SKIP LOCKED",
        "exclusive AS",
    ):
        assert sum(marker in statement for statement in prepared) == 1, (marker, prepared)
    # The plan setting sent before each of them (BY_INDEX): once by libpq's (the try and the
    # finish), once by psycopg's cursors (the first delivery's lock); the take's bounds it as
    # a lease statement too (BY_INDEX_LEASE).
    assert prepared.count(BY_INDEX) == 2, prepared
    lease_setting = BY_INDEX_LEASE.replace("%(statement_timeout)s", "$1")
    assert prepared.count(lease_setting) == 1, prepared
    assert len(prepared) == 8, prepared


def test_with_prepared_statements_off_nothing_is_prepared(inbox, t0, settings):
    settings.ALWAYSON_DB_PREPARE = False
    connection.close()
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    finished, _ = finish_and_take(Held(inbox, "W", claim.generation, [claim.events[0].pk]), now=t0)
    assert finished
    assert prepared_statements() == []


def test_a_claim_read_through_libpq_is_the_claim_psycopgs_cursors_read(make_inbox, t0):
    """_Direct reads rows in binary form with the connection's loaders: the same values, of
    the same types, as the cursors' text form (jsonb as Django decodes it, aware times)."""
    payload = {"text": "héllo ☃", "n": [1, 2.5, None], "nested": {"ok": True}}
    state = {"step": 2, "note": "ünï"}
    inboxes = [make_inbox(), make_inbox()]
    for inbox in inboxes:
        ingest(inbox, "chat", "m-1", payload, now=t0)
        SaveState(inbox.pk, state)(t0)
    direct = take_next("W", now=t0)
    with connection.execute_wrapper(lambda call, *args: call(*args)):  # the cursors' path
        through_cursors = take_next("W", now=t0)

    def seen(claim):
        [event] = claim.events
        times = [event.created, event.updated, event.available_at, claim.inbox.created]
        return (
            claim.inbox.owner_id == claim.inbox.owner.pk,
            claim.generation,
            claim.state,
            claim.extras,
            (event.source, event.source_id, event.payload, event.status, event.attempts),
            [(time, time.tzinfo) for time in times[:3]],
            claim.inbox.created.tzinfo,
        )

    assert {direct.inbox, through_cursors.inbox} == set(inboxes)
    assert seen(direct) == seen(through_cursors)
    assert direct.events[0].payload == payload and direct.state == state


def sever(conn):
    """Its backend terminated from another session, as a restart or an operator would."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    with other_session(autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.parametrize(
    "bounds",
    [
        lambda backend: backend.lease_statements(),
        lambda backend: backend.bounded(None),
        lambda backend: backend.bounded(1.0),
    ],
    ids=["lease statements", "bounded", "bounded with a lock wait"],
)
def test_a_connection_severed_before_a_bounded_transaction_is_djangos_error(bounds):
    # The loops' backoff waits out Django's DatabaseError; psycopg's own would end the slot
    # thread (a chaos run's pg_terminate_backend found it).
    sever(connection)

    with pytest.raises(OperationalError), bounds(postgresql.PostgreSQL()):
        pass
    connection.close()
