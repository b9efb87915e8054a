"""A pinned clock (inbox/clock.py `pin`) is what every operation reads when it is given no
`now`: on PostgreSQL the statements' own clock gives way to it, on SQLite the host's."""

from datetime import UTC, datetime, timedelta

import pytest

from inbox import clock
from inbox.models import Event, Lease, Session
from inbox.services import Held, SaveState, finish, ingest, renew, take_next

pytestmark = pytest.mark.django_db

PINNED = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


@pytest.fixture
def pinned():
    clock.pin(PINNED)
    yield PINNED
    clock.pin(None)


def test_operations_without_now_read_the_pinned_instant(inbox, pinned, ttl):
    assert clock.database_now() == pinned
    assert ingest(inbox, "chat", "m1", {"text": "hi"})
    event = Event.objects.get(inbox=inbox)
    assert event.created == event.available_at == pinned

    claim = take_next("W")
    assert Lease.objects.get(inbox=inbox).until == pinned + ttl

    later = pinned + timedelta(seconds=30)
    clock.pin(later)
    assert renew(inbox, "W", claim.generation)
    assert Lease.objects.get(inbox=inbox).until == later + ttl
    assert finish(Held(inbox, "W", claim.generation, [event.pk]), [SaveState(inbox.pk, {"n": 1})])
    event.refresh_from_db()
    assert (event.status, event.updated) == ("done", later)
    assert Session.objects.get(inbox=inbox).updated == later


def test_a_given_now_still_wins_over_the_pin(inbox, pinned):
    given = pinned + timedelta(days=1)
    ingest(inbox, "chat", "m1", {}, now=given)
    assert Event.objects.get(inbox=inbox).created == given


def test_unpinned_the_database_clock_decides(inbox):
    assert clock.pinned() is None
    ingest(inbox, "chat", "m1", {})
    created = Event.objects.get(inbox=inbox).created
    assert abs(created - clock.database_now()) < timedelta(minutes=1)
    assert created.year != PINNED.year


def test_a_pin_must_be_an_aware_datetime():
    with pytest.raises(ValueError, match="aware datetime"):
        clock.pin(datetime(2031, 1, 1))
    assert clock.pinned() is None
