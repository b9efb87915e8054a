"""Statements built once (inbox/prebuilt.py): the rows the ORM's queryset would give, each
call's values adapted as the ORM adapts them, compiled once per database; and the writes a
locked_write holds to its commit (on PostgreSQL) still all or nothing."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection
from django.db.models import Max, OuterRef, Subquery
from django.db.models.sql import UpdateQuery

from inbox.models import Event, Lease
from inbox.prebuilt import Given, Prebuilt
from inbox.services import ingest, locked_write, store_event

pytestmark = pytest.mark.django_db


def _field(model, name):
    return model._meta.get_field(name)


def _events_of():
    """An inbox's events of one source with their inbox (select_related) and a datetime
    annotation, as the statement's queryset states them."""
    latest = Event.objects.filter(inbox_id=OuterRef("inbox_id")).values("inbox_id")
    latest = latest.annotate(at=Max("available_at")).values("at")
    return (
        Event.objects.filter(
            inbox_id=Given("inbox_id", _field(Event, "inbox")),
            source=Given("source", _field(Event, "source")),
        )
        .select_related("inbox")
        .annotate(latest=Subquery(latest))
        .order_by("id")
    )


EVENTS = Prebuilt(_events_of)


def test_a_built_statement_gives_the_instances_its_queryset_gives(
    inbox, t0, django_assert_num_queries
):
    for n in range(3):
        at = t0 + timedelta(seconds=n)
        ingest(inbox, "chat", f"m-{n}", {"text": f"hello {n}", "n": n}, now=at)
    ingest(inbox, "other", "x", {}, now=t0)

    found = EVENTS.all(inbox_id=inbox.pk, source="chat")

    expected = list(Event.objects.filter(inbox=inbox, source="chat").order_by("id"))
    assert [(e.pk, e.payload, e.available_at) for e in found] == [
        (e.pk, e.payload, e.available_at) for e in expected
    ]
    assert {e.latest for e in found} == {t0 + timedelta(seconds=2)}
    with django_assert_num_queries(0):
        assert {e.inbox.slug for e in found} == {inbox.slug}


def test_a_built_statement_is_compiled_once_and_takes_each_calls_values(make_inbox, t0):
    built = []

    def build():
        built.append(connection.vendor)
        return _events_of()

    events = Prebuilt(build)
    desk, shop = make_inbox("desk"), make_inbox("shop")
    ingest(desk, "chat", "m-1", {}, now=t0)
    ingest(shop, "chat", "m-2", {}, now=t0)

    assert [e.source_id for e in events.all(inbox_id=desk.pk, source="chat")] == ["m-1"]
    assert [e.source_id for e in events.all(inbox_id=shop.pk, source="chat")] == ["m-2"]
    assert events.get(inbox_id=shop.pk, source="none") is None
    assert built == [connection.vendor]


def _work_at():
    query = Lease.objects.filter(inbox_id=Given("inbox_id", _field(Lease, "inbox"))).query
    query = query.chain(UpdateQuery)
    query.add_update_values({"work_at": Given("work_at", _field(Lease, "work_at"))})
    return query


WORK_AT = Prebuilt(_work_at)
LEASE = Prebuilt(lambda: Lease.objects.filter(inbox_id=Given("inbox_id", _field(Lease, "inbox"))))


def test_a_built_write_adapts_its_values_as_the_orm_does(inbox, t0):
    """A datetime goes in as the database takes one (SQLite: text in UTC)."""
    with locked_write(inbox.pk, None, t0):
        WORK_AT.write(inbox_id=inbox.pk, work_at=t0 + timedelta(hours=1))

    assert Lease.objects.get(inbox=inbox).work_at == t0 + timedelta(hours=1)


def test_a_write_held_to_the_commit_is_read_back_by_a_later_read(inbox, t0):
    with locked_write(inbox.pk, None, t0):
        WORK_AT.write(inbox_id=inbox.pk, work_at=t0 + timedelta(hours=2))
        seen = LEASE.get(inbox_id=inbox.pk)

    assert seen.work_at == t0 + timedelta(hours=2)


def _approvers_needed():
    from approvals.models import Approval

    query = Approval.objects.filter(pk=Given("pk", _field(Approval, "id"))).query
    query = query.chain(UpdateQuery)
    query.add_update_values({"approvers_needed": Given("n", _field(Approval, "approvers_needed"))})
    return query


APPROVERS_NEEDED = Prebuilt(_approvers_needed)


def test_a_write_held_to_the_commit_that_fails_leaves_nothing_written(inbox, t0):
    """The event stored before it is gone with it: the transaction is all or nothing."""
    from approvals.models import Approval
    from approvals.services import request_approval

    approval = request_approval(inbox, "r1", "refund", timedelta(hours=1), now=t0)

    with pytest.raises(IntegrityError), locked_write(inbox.pk, None, t0) as (_, now, _):
        assert store_event(inbox.pk, "chat", "m-1", {"text": "hi"}, now)
        APPROVERS_NEEDED.write(pk=approval.pk, n=3)  # approval_one_or_two_approvers

    assert not Event.objects.filter(inbox=inbox, source="chat").exists()
    assert Approval.objects.get().approvers_needed == 1


@pytest.mark.django_db(transaction=True)
def test_a_held_write_that_fails_at_the_commit_leaves_nothing_written(inbox, t0):
    """The same, the locked_write being the transaction itself (its COMMIT carries the
    held writes on PostgreSQL)."""
    from approvals.models import Approval
    from approvals.services import request_approval

    approval = request_approval(inbox, "r1", "refund", timedelta(hours=1), now=t0)

    with pytest.raises(IntegrityError), locked_write(inbox.pk, None, t0) as (_, now, _):
        assert store_event(inbox.pk, "chat", "m-1", {"text": "hi"}, now)
        APPROVERS_NEEDED.write(pk=approval.pk, n=3)

    assert not Event.objects.filter(inbox=inbox, source="chat").exists()
    assert Approval.objects.get().approvers_needed == 1
    # The connection is usable again.
    assert ingest(inbox, "chat", "m-2", {"text": "again"}, now=t0)
