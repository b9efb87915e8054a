"""ingest_many: many events into one inbox in one statement, validated like ingest."""

from datetime import timedelta

import pytest

from alwayson.runtime.api import acquire, claim_batch, ingest, ingest_many
from inbox.exceptions import UnknownInbox
from inbox.models import Event, Lease
from inbox.signals import event_stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def stored_signals():
    sent = []

    def receiver(sender, event, now, **kwargs):
        sent.append((event.pk, event.source_id, event.payload, now))

    event_stored.connect(receiver, weak=False, dispatch_uid="test-ingest-many")
    yield sent
    event_stored.disconnect(dispatch_uid="test-ingest-many")


def keys(inbox):
    return list(Event.objects.filter(inbox=inbox).values_list("source_id", "payload"))


def test_a_batch_stores_every_new_event_in_order_and_marks_the_work(inbox, t0):
    result = ingest_many(inbox, [("chat", f"m{n}", {"n": n}) for n in range(5)], now=t0)
    assert result == [True] * 5
    assert keys(inbox) == [(f"m{n}", {"n": n}) for n in range(5)]
    assert Lease.objects.get(inbox=inbox).work_at == t0
    generation = acquire(inbox, "w", now=t0)
    assert [e.source_id for e in claim_batch(inbox, "w", generation, now=t0)] == [
        f"m{n}" for n in range(5)
    ]


def test_keys_repeated_in_the_batch_store_the_first_copy_once(inbox, t0, stored_signals):
    result = ingest_many(
        inbox, [("chat", "a", {"v": 1}), ("chat", "b", {}), ("chat", "a", {"v": 2})], now=t0
    )
    assert result == [True, True, False]
    assert keys(inbox) == [("a", {"v": 1}), ("b", {})]
    assert [(source_id, payload) for _, source_id, payload, _ in stored_signals] == [
        ("a", {"v": 1}),
        ("b", {}),
    ]


def test_keys_already_stored_are_duplicates_and_the_rest_are_stored(inbox, t0, stored_signals):
    assert ingest(inbox, "chat", "old", {"v": "first"}, now=t0)
    stored_signals.clear()
    later = t0 + timedelta(seconds=5)
    result = ingest_many(inbox, [("chat", "old", {"v": "again"}), ("chat", "new")], now=later)
    assert result == [False, True]
    assert keys(inbox) == [("old", {"v": "first"}), ("new", {})]
    assert [(s, p, now) for _, s, p, now in stored_signals] == [("new", {}, later)]
    # The earlier work stays the marker.
    assert Lease.objects.get(inbox=inbox).work_at == t0


def test_a_batch_of_only_duplicates_stores_nothing_and_sends_nothing(inbox, t0, stored_signals):
    ingest_many(inbox, [("chat", "a"), ("chat", "b")], now=t0)
    stored_signals.clear()
    assert ingest_many(inbox, [("chat", "b"), ("chat", "a")], now=t0) == [False, False]
    assert stored_signals == []
    assert Event.objects.count() == 2


def test_the_same_key_in_another_source_or_inbox_is_new(make_inbox, t0):
    desk, other = make_inbox(), make_inbox()
    assert ingest_many(desk, [("chat", "k"), ("github", "k")], now=t0) == [True, True]
    assert ingest_many(other.slug, [("chat", "k")], now=t0) == [True]


@pytest.mark.parametrize(
    "bad, reason",
    [
        (("chat", ""), r"events\[1\]\.source_id must be a non-empty string"),
        (("", "k"), r"events\[1\]\.source must be a non-empty string"),
        (("timer", "k"), r"events\[1\]\.source 'timer' is reserved"),
        (("approval", "k"), r"events\[1\]\.source 'approval' is reserved"),
        (("chat", "k", {"x": float("nan")}), r"events\[1\]\.payload is not JSON-serialisable"),
        (("chat", "k", {"x": "a\x00b"}), r"events\[1\]\.payload contains a NUL"),
        (("chat", "k" * 256), r"events\[1\]\.source_id is longer than 255"),
        (("chat",), r"events\[1\] must be a \(source, source_id, payload\) tuple"),
        ("chat:k", r"events\[1\] must be a \(source, source_id, payload\) tuple"),
    ],
)
def test_one_bad_event_refuses_the_whole_batch_before_anything_is_stored(inbox, t0, bad, reason):
    with pytest.raises(ValueError, match=reason):
        ingest_many(inbox, [("chat", "fine"), bad, ("chat", "also-fine")], now=t0)
    assert Event.objects.count() == 0
    assert Lease.objects.get(inbox=inbox).work_at is None


@pytest.mark.parametrize("events", ["chat", {"chat": "k"}])
def test_events_must_be_a_list_of_tuples(inbox, events):
    with pytest.raises(ValueError, match="events must be a list"):
        ingest_many(inbox, events)


def test_a_naive_now_is_refused(inbox, t0):
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        ingest_many(inbox, [("chat", "k")], now=t0.replace(tzinfo=None))
    assert Event.objects.count() == 0


def test_an_unknown_inbox_is_refused(db):
    with pytest.raises(UnknownInbox):
        ingest_many("nobody", [("chat", "k")])
    with pytest.raises(UnknownInbox):
        ingest_many("nobody", [])
    assert Event.objects.count() == 0


def test_an_empty_batch_stores_nothing(inbox):
    assert ingest_many(inbox, []) == []


def test_without_now_the_databases_clock_stamps_the_batch(inbox):
    assert ingest_many(inbox, [("chat", "a"), ("chat", "b")]) == [True, True]
    stamps = set(Event.objects.values_list("available_at", "created", "updated"))
    assert len(stamps) == 1
    [(available_at, created, updated)] = stamps
    assert available_at == created == updated
    assert Lease.objects.get(inbox=inbox).work_at == available_at


def test_with_no_receiver_a_delivery_builds_no_event(inbox, t0, monkeypatch):
    """The approvals' and metrics' receivers listen to reserved sources only, which a
    delivery never has: with nothing connected to event_stored, no Event is made for it."""
    from inbox import store

    assert not event_stored.receivers
    built = []
    monkeypatch.setattr(store, "as_event", lambda *args: built.append(args))
    assert ingest(inbox, "chat", "m1", {"text": "hi"}, now=t0)
    assert ingest_many(inbox, [("chat", "m2"), ("chat", "m3")], now=t0) == [True, True]
    assert built == []
    assert keys(inbox) == [("m1", {"text": "hi"}), ("m2", {}), ("m3", {})]


def test_reserved_sources_reach_their_own_signal_and_event_stored(inbox, t0, stored_signals):
    from inbox.services import store_event
    from inbox.signals import reserved_event_stored

    reserved = []

    def receiver(sender, event, now, **kwargs):
        reserved.append((event.source, event.source_id, now))

    reserved_event_stored.connect(receiver, weak=False, dispatch_uid="test-reserved")
    try:
        assert ingest(inbox, "chat", "m1", now=t0)
        assert store_event(inbox.pk, "timer", "tick-1", {"n": 1}, t0)
        assert not store_event(inbox.pk, "timer", "tick-1", {"n": 1}, t0)
    finally:
        reserved_event_stored.disconnect(dispatch_uid="test-reserved")
    assert reserved == [("timer", "tick-1", t0)]
    assert [source_id for _, source_id, _, _ in stored_signals] == ["m1", "tick-1"]
