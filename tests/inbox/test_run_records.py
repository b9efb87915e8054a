"""Every run is a RunRecord: written by its finish in the finish's own transaction when it
commits, and apart when it was refused or lost (nothing else of it committed)."""

from datetime import timedelta

import pytest

from alwayson.runtime.api import acquire, finish, ingest
from inbox.models import Event, RunRecord
from inbox.services import Defer, Failed, Held, finish_and_take, record_refused, take_next
from outbox.services import Say

pytestmark = pytest.mark.django_db(transaction=True)

SECOND = timedelta(seconds=1)


def records(inbox):
    return list(
        RunRecord.objects.filter(inbox=inbox)
        .order_by("generation")
        .values_list("generation", "worker", "outcome", "events")
    )


def test_a_done_run_is_recorded_with_what_it_produced_in_its_finish(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)
    claim = take_next("W", now=t0 + 2 * SECOND)
    ids = [e.pk for e in claim.events]
    said = Say(inbox.pk, "hello", generation=claim.generation)

    assert finish(
        Held(inbox, "W", claim.generation, ids),
        [said],
        now=t0 + 5 * SECOND,
        release=True,
        produced={"said": 1},
        trace="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )

    record = RunRecord.objects.get(inbox=inbox)
    assert (record.generation, record.worker, record.outcome) == (claim.generation, "W", "done")
    assert record.events == ids
    assert (record.started, record.ended) == (t0 + 2 * SECOND, t0 + 5 * SECOND)
    assert record.duration == 3 * SECOND
    assert record.waiting_since == t0
    assert record.produced == {"said": 1}
    assert record.trace.startswith("00-aaaa")
    assert inbox.outbox.get().generation == claim.generation


def test_a_run_that_failed_is_recorded_with_its_error(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)

    assert finish(
        Held(inbox, "W", claim.generation, [claim.events[0].pk]), outcome=Failed("boom"), now=t0
    )

    assert records(inbox) == [(claim.generation, "W", "error", [claim.events[0].pk])]
    assert RunRecord.objects.get().error == "boom"


def test_a_deferred_run_is_recorded_with_its_reason(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    defer = Defer("budget spent", delay=timedelta(hours=1))

    assert finish(Held(inbox, "W", claim.generation, [claim.events[0].pk]), outcome=defer, now=t0)

    record = RunRecord.objects.get()
    assert (record.outcome, record.error) == ("deferred", "budget spent")


def test_a_second_finish_of_one_claim_writes_no_second_record(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [claim.events[0].pk]

    assert finish(Held(inbox, "W", claim.generation, ids), now=t0) is True
    assert finish(Held(inbox, "W", claim.generation, ids), now=t0 + SECOND) is False

    assert records(inbox) == [(claim.generation, "W", "done", ids)]


def test_a_refused_finish_commits_no_record_and_is_recorded_apart(inbox, t0, ttl):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    acquire(inbox, "B", now=later)
    ids = [e.pk for e in old.events]
    said = Say(inbox.pk, "late", generation=old.generation)

    assert finish(Held(inbox, "A", old.generation, ids), [said], now=later, release=True) is False
    assert records(inbox) == []
    record_refused(old.held_by("A"), produced={"said": 1}, now=later)

    record = RunRecord.objects.get()
    assert (record.outcome, record.worker, record.events) == ("refused", "A", ids)
    assert record.started == t0 and record.ended == later
    assert not inbox.outbox.exists()


def test_a_crashed_run_is_found_lost_by_the_next_take_and_its_late_finish_says_refused(
    inbox, t0, ttl
):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    crashed = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    taken = take_next("B", now=later)  # its backoff has passed: claimed again by B

    assert [e.pk for e in taken.events] == [crashed.events[0].pk]
    lost = RunRecord.objects.get(generation=crashed.generation)
    assert (lost.outcome, lost.events, lost.started) == ("lost", [crashed.events[0].pk], t0)
    assert lost.ended == later

    record_refused(crashed.held_by("A"), "too late", now=later)
    refused = RunRecord.objects.get(generation=crashed.generation)
    assert (refused.outcome, refused.worker, refused.error) == ("refused", "A", "too late")
    assert RunRecord.objects.count() == 1


def test_a_refusal_never_overwrites_a_record_that_says_the_run_ended(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    assert finish(Held(inbox, "W", claim.generation, [claim.events[0].pk]), now=t0, release=True)

    record_refused(claim.held_by("W"), now=t0 + SECOND)

    assert records(inbox) == [(claim.generation, "W", "done", [claim.events[0].pk])]


def test_finish_and_take_records_the_finished_run(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)

    finished, _ = finish_and_take(
        Held(inbox, "W", claim.generation, [claim.events[0].pk]), now=t0, produced={"said": 0}
    )

    assert finished
    assert records(inbox) == [(claim.generation, "W", "done", [claim.events[0].pk])]


def test_with_records_off_nothing_is_recorded(inbox, t0, ttl, settings):
    settings.ALWAYSON_RUN_RECORDS = False
    ingest(inbox, "chat", "m-1", {}, now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0)
    claim = take_next("W", now=t0)
    assert finish(
        Held(inbox, "W", claim.generation, [e.pk for e in claim.events]), now=t0, release=True
    )
    ingest(inbox, "chat", "m-3", {}, now=t0)
    crashed = take_next("A", now=t0)
    take_next("B", now=t0 + ttl + SECOND)
    record_refused(crashed.held_by("A"), now=t0 + ttl)

    assert not RunRecord.objects.exists()
    assert Event.objects.filter(status="done").count() == 2


@pytest.mark.parametrize(
    "produced, trace, message",
    [
        ([1], "", "produced must be a dict"),
        ({"x": float("nan")}, "", "produced"),
        ({}, "x" * 56, "trace must be at most 55"),
    ],
)
def test_a_bad_record_value_is_refused_before_anything_is_written(
    inbox, t0, produced, trace, message
):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)

    with pytest.raises(ValueError, match=message):
        finish(
            Held(inbox, "W", claim.generation, [claim.events[0].pk]),
            now=t0,
            produced=produced,
            trace=trace,
        )

    assert not RunRecord.objects.exists()
    assert Event.objects.get().status == "running"
