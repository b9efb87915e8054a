"""Timers feed the inbox: a second pass, a replay and an outage each leave the right events."""

from datetime import timedelta

import pytest

from alwayson.runtime.api import add_timer, run_scheduler
from inbox.models import Event
from timers.models import Timer

SECOND = timedelta(seconds=1)
DAY = timedelta(days=1)
EVERY_DAY = int(DAY.total_seconds())


def timer_events(key):
    return Event.objects.filter(source="timer", source_id__startswith=f"{key}@").order_by("id")


@pytest.mark.django_db
def test_second_scheduler_pass_at_the_same_moment_finds_nothing(inbox, t0):
    add_timer(inbox, "digest", t0, {"task": "daily digest"}, every=EVERY_DAY)

    assert run_scheduler(now=t0) == 1
    assert run_scheduler(now=t0) == 0

    assert list(timer_events("digest").values_list("source_id", flat=True)) == [
        "digest@2026-03-01T12:00:00Z"
    ]
    assert Timer.objects.get(inbox=inbox, key="digest").due == t0 + DAY


@pytest.mark.django_db
def test_replayed_registration_of_a_fired_occurrence_is_still_one_event(inbox, t0):
    add_timer(inbox, "digest", t0, {"task": "daily digest"}, every=EVERY_DAY)
    run_scheduler(now=t0)

    add_timer(inbox, "digest", t0, {"task": "daily digest"}, every=EVERY_DAY)  # a deploy replays
    assert run_scheduler(now=t0) == 1  # due again, but its event key is already stored

    assert timer_events("digest").count() == 1
    assert Timer.objects.get(inbox=inbox, key="digest").due == t0 + DAY


@pytest.mark.django_db
def test_outage_coalesces_missed_occurrences_into_one_event(inbox, t0):
    add_timer(inbox, "digest", t0, {"task": "daily digest"}, every=EVERY_DAY)
    run_scheduler(now=t0)
    later = t0 + DAY + 3 * DAY + timedelta(minutes=10)  # next due + 3 days + 10 min

    assert run_scheduler(now=later) == 1

    events = timer_events("digest")
    assert events.count() == 2
    latest = events.last()
    assert latest.source_id == "digest@2026-03-05T12:00:00Z"
    assert latest.payload == {
        "task": "daily digest",
        "scheduled_for": "2026-03-05T12:00:00Z",
        "late_by": 600,
        "skipped": 3,
    }
    assert latest.created == later
    next_due = Timer.objects.get(inbox=inbox, key="digest").due
    assert next_due == t0 + 5 * DAY
    assert round((next_due - later).total_seconds() / 3600, 1) == 23.8


@pytest.mark.django_db
def test_one_off_timer_fires_once_and_is_done(inbox, t0):
    due = t0 + timedelta(hours=1)
    add_timer(inbox, "follow-up", due, {"task": "check the deploy"})

    assert run_scheduler(now=due + 5 * SECOND) == 1
    assert run_scheduler(now=due + 2 * DAY) == 0

    timer = Timer.objects.get(inbox=inbox, key="follow-up")
    assert (timer.done, timer.due) == (True, due)
    fired = timer_events("follow-up").get()
    assert fired.source_id == "follow-up@2026-03-01T13:00:00Z"
    assert fired.payload == {
        "task": "check the deploy",
        "scheduled_for": "2026-03-01T13:00:00Z",
        "late_by": 5,
        "skipped": 0,
    }


@pytest.mark.django_db
def test_timer_due_is_truncated_to_whole_seconds(inbox, t0):
    add_timer(inbox, "tick", t0 + timedelta(microseconds=999_999), {}, every=60)

    timer = Timer.objects.get(inbox=inbox, key="tick")
    assert timer.due == t0
    run_scheduler(now=t0 + timedelta(microseconds=500))
    assert list(timer_events("tick").values_list("source_id", flat=True)) == [
        "tick@2026-03-01T12:00:00Z"
    ]
    assert timer_events("tick").get().payload["late_by"] == 0


@pytest.mark.django_db
def test_one_off_with_a_fixed_event_key_fires_under_that_key(inbox, t0):
    add_timer(inbox, "remind", t0, {"n": 1}, event_key=("followup", "order-7"))

    assert run_scheduler(now=t0) == 1

    fired = Event.objects.get(inbox=inbox)
    assert (fired.source, fired.source_id) == ("followup", "order-7")
    assert fired.payload == {
        "n": 1,
        "scheduled_for": "2026-03-01T12:00:00Z",
        "late_by": 0,
        "skipped": 0,
    }
    assert Timer.objects.get(inbox=inbox, key="remind").done is True


@pytest.mark.django_db
def test_scheduler_serves_every_inbox_and_inbox_limits_it(make_inbox, t0):
    a, b = make_inbox(), make_inbox()
    add_timer(a, "digest", t0, {}, every=EVERY_DAY)
    add_timer(b, "digest", t0, {}, every=EVERY_DAY)
    add_timer(b, "nudge", t0 + SECOND, {})

    assert run_scheduler(now=t0 + SECOND, inbox=b.slug) == 2
    assert not Event.objects.filter(inbox=a).exists()
    assert Event.objects.filter(inbox=b).count() == 2
    assert Timer.objects.get(inbox=a, key="digest").due == t0

    assert run_scheduler(now=t0 + SECOND) == 1  # only a's timer is still due
    assert Event.objects.filter(inbox=a, source_id="digest@2026-03-01T12:00:00Z").exists()
    assert Event.objects.filter(inbox=b).count() == 2


@pytest.mark.django_db
def test_timers_do_not_fire_early(inbox, t0):
    due = t0 + timedelta(hours=1)
    add_timer(inbox, "digest", due, {}, every=EVERY_DAY)
    add_timer(inbox, "follow-up", due, {})

    assert run_scheduler(now=due - SECOND) == 0
    assert not Event.objects.exists()
    assert set(Timer.objects.values_list("due", "done")) == {(due, False)}

    assert run_scheduler(now=due) == 2  # due at exactly `due`
    assert Event.objects.count() == 2
