"""Cron timers in a time zone, the missed-occurrence policies, bad input and runscheduler.

Every occurrence is an instant in UTC, and the event key is the timer key plus that instant,
so no occurrence can become two events: not through a second pass, a replay, a deploy that
re-registers the schedule, or two schedulers at once. Time is always passed as `now=`
(runscheduler uses the database clock, so its timers are due in the real past).
"""

import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from alwayson.runtime.api import add_timer, run_scheduler
from inbox.models import Event
from inbox.signals import event_stored
from timers.models import Timer

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
EVERY_DAY = int(DAY.total_seconds())
# The same daily schedule as every-N-seconds and as cron; t0 is noon UTC.
DAILY_AT_NOON = [
    pytest.param({"every": EVERY_DAY}, id="every"),
    pytest.param({"cron": "0 12 * * *", "timezone": "UTC"}, id="cron"),
]
BERLIN = "Europe/Berlin"
NINE_IN_BERLIN = "0 9 * * *"


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def keys(key):
    return list(
        Event.objects.filter(source="timer", source_id__startswith=f"{key}@")
        .order_by("id")
        .values_list("source_id", flat=True)
    )


def events(key):
    return list(
        Event.objects.filter(source="timer", source_id__startswith=f"{key}@").order_by("id")
    )


def timer(inbox, key):
    return Timer.objects.get(inbox=inbox, key=key)


def run_each_due(inbox, key, until):
    """Run the scheduler exactly at each due instant of `key` up to `until`; the instants."""
    fired = []
    while (due := timer(inbox, key).due) <= until:
        assert run_scheduler(now=due) == 1
        assert run_scheduler(now=due) == 0  # a second pass at the same moment finds nothing
        fired.append(due)
    return fired


# --- cron in a time zone across DST -----------------------------------------------------------


@pytest.mark.django_db
def test_cron_fires_at_nine_berlin_time_across_the_march_dst_change(inbox):
    # Summer time starts on Sunday 29 March 2026 at 02:00 local (01:00 UTC).
    add_timer(
        inbox,
        "standup",
        None,
        {"task": "standup"},
        cron=NINE_IN_BERLIN,
        timezone=BERLIN,
        now=utc(2026, 3, 26, 12),
    )
    assert timer(inbox, "standup").due == utc(2026, 3, 27, 8)

    fired = run_each_due(inbox, "standup", until=utc(2026, 3, 31, 12))

    assert fired == [
        utc(2026, 3, 27, 8),  # 09:00 CET (UTC+1)
        utc(2026, 3, 28, 8),
        utc(2026, 3, 29, 7),  # 09:00 CEST (UTC+2), the day the clocks change
        utc(2026, 3, 30, 7),
        utc(2026, 3, 31, 7),
    ]
    berlin = ZoneInfo(BERLIN)
    assert {moment.astimezone(berlin).strftime("%H:%M") for moment in fired} == {"09:00"}
    assert keys("standup") == [
        "standup@2026-03-27T08:00:00Z",
        "standup@2026-03-28T08:00:00Z",
        "standup@2026-03-29T07:00:00Z",
        "standup@2026-03-30T07:00:00Z",
        "standup@2026-03-31T07:00:00Z",
    ]
    for event in events("standup"):
        assert event.payload == {
            "task": "standup",
            "scheduled_for": event.source_id.split("@", 1)[1],
            "late_by": 0,
            "skipped": 0,
        }
    assert timer(inbox, "standup").due == utc(2026, 4, 1, 7)


@pytest.mark.django_db
def test_cron_fires_at_nine_berlin_time_across_the_october_dst_change(inbox):
    # Summer time ends on Sunday 25 October 2026 at 03:00 local (01:00 UTC).
    add_timer(
        inbox,
        "standup",
        None,
        {},
        cron=NINE_IN_BERLIN,
        timezone=BERLIN,
        now=utc(2026, 10, 23, 12),
    )

    fired = run_each_due(inbox, "standup", until=utc(2026, 10, 27, 12))

    assert fired == [
        utc(2026, 10, 24, 7),  # 09:00 CEST (UTC+2)
        utc(2026, 10, 25, 8),  # 09:00 CET (UTC+1), the day the clocks change
        utc(2026, 10, 26, 8),
        utc(2026, 10, 27, 8),
    ]
    assert keys("standup") == [
        "standup@2026-10-24T07:00:00Z",
        "standup@2026-10-25T08:00:00Z",
        "standup@2026-10-26T08:00:00Z",
        "standup@2026-10-27T08:00:00Z",
    ]


@pytest.mark.django_db
def test_cron_does_not_fire_before_nine_local_even_when_it_is_nine_utc(inbox):
    add_timer(
        inbox,
        "standup",
        None,
        {},
        cron=NINE_IN_BERLIN,
        timezone=BERLIN,
        now=utc(2026, 6, 1, 12),
    )
    assert timer(inbox, "standup").due == utc(2026, 6, 2, 7)

    assert run_scheduler(now=utc(2026, 6, 2, 7) - SECOND) == 0
    assert run_scheduler(now=utc(2026, 6, 2, 7)) == 1
    assert keys("standup") == ["standup@2026-06-02T07:00:00Z"]


@pytest.mark.django_db
def test_the_repeated_hour_of_the_october_change_gives_distinct_utc_keys(inbox):
    """02:00 and 02:30 happen twice on 25 October in Berlin; each real instant is its own
    occurrence, and none of them is fired twice."""
    add_timer(
        inbox,
        "half-hourly",
        None,
        {},
        cron="*/30 * * * *",
        timezone=BERLIN,
        now=utc(2026, 10, 24, 23, 10),
    )

    run_each_due(inbox, "half-hourly", until=utc(2026, 10, 25, 2))

    assert keys("half-hourly") == [
        "half-hourly@2026-10-24T23:30:00Z",  # 01:30 CEST
        "half-hourly@2026-10-25T00:00:00Z",  # 02:00 CEST
        "half-hourly@2026-10-25T00:30:00Z",  # 02:30 CEST
        "half-hourly@2026-10-25T01:00:00Z",  # 02:00 CET
        "half-hourly@2026-10-25T01:30:00Z",  # 02:30 CET
        "half-hourly@2026-10-25T02:00:00Z",  # 03:00 CET
    ]


# --- missed occurrences: coalesce and catch_up -------------------------------------------------


@pytest.mark.django_db
def test_digest_coalesces_an_outage_into_one_event(inbox):
    """The article's digest: four daily occurrences missed, one event, ten minutes late,
    skipped 3, next due 23.8 hours out. The outage spans the March DST change."""
    add_timer(
        inbox,
        "digest",
        None,
        {"task": "daily digest"},
        cron=NINE_IN_BERLIN,
        timezone=BERLIN,
        now=utc(2026, 3, 26, 12),
    )
    assert run_scheduler(now=utc(2026, 3, 27, 8)) == 1
    # Missed: 28 Mar 08:00Z, 29 Mar 07:00Z, 30 Mar 07:00Z, 31 Mar 07:00Z.
    later = utc(2026, 3, 31, 7, 10)

    assert run_scheduler(now=later) == 1
    assert run_scheduler(now=later) == 0

    assert keys("digest") == ["digest@2026-03-27T08:00:00Z", "digest@2026-03-31T07:00:00Z"]
    latest = events("digest")[-1]
    assert latest.payload == {
        "task": "daily digest",
        "scheduled_for": "2026-03-31T07:00:00Z",
        "late_by": 600,
        "skipped": 3,
    }
    assert latest.created == later
    next_due = timer(inbox, "digest").due
    assert next_due == utc(2026, 4, 1, 7)
    assert round((next_due - later).total_seconds() / 3600, 1) == 23.8


@pytest.mark.django_db
@pytest.mark.parametrize("schedule", DAILY_AT_NOON)
def test_billing_catches_up_one_event_per_missed_day_oldest_first(inbox, t0, schedule):
    """The article's billing reconciliation needs every day it missed, each under its own key."""
    due = t0 if "every" in schedule else None
    add_timer(
        inbox,
        "billing",
        due,
        {"task": "reconcile"},
        policy="catch_up",
        now=t0 - SECOND,
        **schedule,
    )
    assert timer(inbox, "billing").due == t0
    assert run_scheduler(now=t0) == 1
    later = t0 + 4 * DAY + 10 * MINUTE  # 2, 3, 4 and 5 March missed

    assert run_scheduler(now=later) == 1  # one timer handled, four events
    assert run_scheduler(now=later) == 0

    assert keys("billing") == [
        "billing@2026-03-01T12:00:00Z",
        "billing@2026-03-02T12:00:00Z",
        "billing@2026-03-03T12:00:00Z",
        "billing@2026-03-04T12:00:00Z",
        "billing@2026-03-05T12:00:00Z",
    ]
    caught_up = events("billing")[1:]
    assert [event.payload for event in caught_up] == [
        {
            "task": "reconcile",
            "scheduled_for": f"2026-03-0{day}T12:00:00Z",
            "late_by": int((later - (t0 + (day - 1) * DAY)).total_seconds()),
            "skipped": 0,
        }
        for day in (2, 3, 4, 5)
    ]
    assert {event.created for event in caught_up} == {later}
    assert timer(inbox, "billing").due == t0 + 5 * DAY


@pytest.mark.django_db
@pytest.mark.parametrize("schedule", DAILY_AT_NOON)
def test_catch_up_is_capped_and_counts_the_rest_as_skipped(inbox, t0, schedule):
    due = t0 if "every" in schedule else None
    add_timer(
        inbox,
        "billing",
        due,
        {},
        policy="catch_up",
        catch_up_max=3,
        now=t0 - SECOND,
        **schedule,
    )
    run_scheduler(now=t0)
    later = t0 + 6 * DAY + 10 * MINUTE  # six days missed: 2 to 7 March

    assert run_scheduler(now=later) == 1

    assert keys("billing") == [
        "billing@2026-03-01T12:00:00Z",
        "billing@2026-03-05T12:00:00Z",  # the latest three, oldest first
        "billing@2026-03-06T12:00:00Z",
        "billing@2026-03-07T12:00:00Z",
    ]
    emitted = events("billing")[1:]
    # Counted once, on the oldest emitted event, so a sum over the events is right.
    assert [event.payload["skipped"] for event in emitted] == [3, 0, 0]
    assert sum(event.payload["skipped"] for event in events("billing")) == 3
    assert timer(inbox, "billing").due == t0 + 7 * DAY


@pytest.mark.django_db
def test_catch_up_across_the_dst_change_keys_each_local_day(inbox):
    add_timer(
        inbox,
        "billing",
        None,
        {},
        cron="0 1 * * *",
        timezone=BERLIN,
        policy="catch_up",
        now=utc(2026, 3, 27, 12),
    )

    assert run_scheduler(now=utc(2026, 3, 31, 12)) == 1

    assert keys("billing") == [
        "billing@2026-03-28T00:00:00Z",  # 01:00 CET
        "billing@2026-03-29T00:00:00Z",  # 01:00 CET, an hour before the change
        "billing@2026-03-29T23:00:00Z",  # 01:00 CEST on 30 March
        "billing@2026-03-30T23:00:00Z",
    ]


# --- re-registering ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_reregistering_the_same_cron_keeps_the_pending_occurrence(inbox):
    registered = utc(2026, 6, 1, 12)
    add_timer(inbox, "digest", None, {"v": 1}, cron=NINE_IN_BERLIN, timezone=BERLIN, now=registered)
    pending = utc(2026, 6, 2, 7)
    assert timer(inbox, "digest").due == pending
    deploy = pending + 5 * MINUTE  # the scheduler has not run since the occurrence came due

    add_timer(inbox, "digest", None, {"v": 2}, cron=NINE_IN_BERLIN, timezone=BERLIN, now=deploy)

    assert timer(inbox, "digest").due == pending  # not moved past the unfired occurrence
    assert run_scheduler(now=deploy) == 1
    assert keys("digest") == ["digest@2026-06-02T07:00:00Z"]
    assert events("digest")[0].payload == {
        "v": 2,
        "scheduled_for": "2026-06-02T07:00:00Z",
        "late_by": 300,
        "skipped": 0,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("cron", "zone", "next_due"),
    [
        pytest.param("0 10 * * *", BERLIN, utc(2026, 6, 2, 8), id="changed-cron"),
        pytest.param(NINE_IN_BERLIN, "Europe/London", utc(2026, 6, 2, 8), id="changed-zone"),
    ],
)
def test_reregistering_a_changed_schedule_recomputes_the_due_time(inbox, cron, zone, next_due):
    add_timer(
        inbox,
        "digest",
        None,
        {},
        cron=NINE_IN_BERLIN,
        timezone=BERLIN,
        now=utc(2026, 6, 1, 12),
    )
    deploy = utc(2026, 6, 2, 7, 5)  # 09:05 in Berlin, the 09:00 occurrence not yet fired

    add_timer(inbox, "digest", None, {}, cron=cron, timezone=zone, now=deploy)

    changed = timer(inbox, "digest")
    assert (changed.cron, changed.timezone, changed.due) == (cron, zone, next_due)
    assert run_scheduler(now=deploy) == 0
    assert run_scheduler(now=next_due) == 1
    assert keys("digest") == [f"digest@{next_due:%Y-%m-%dT%H:%M:%SZ}"]


@pytest.mark.django_db
def test_cron_timer_from_an_every_timer_and_back(inbox, t0):
    add_timer(inbox, "tick", t0, {}, every=60, now=t0)
    add_timer(inbox, "tick", None, {}, cron="0 13 * * *", now=t0)
    assert (timer(inbox, "tick").every, timer(inbox, "tick").due) == (None, t0 + HOUR)

    add_timer(inbox, "tick", t0 + MINUTE, {}, every=60, now=t0)
    assert (timer(inbox, "tick").cron, timer(inbox, "tick").due) == ("", t0 + MINUTE)


# --- no occurrence becomes two events ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["coalesce", "catch_up"])
def test_second_pass_and_replayed_registration_make_no_second_event(inbox, t0, policy):
    add_timer(inbox, "digest", None, {}, cron="0 12 * * *", policy=policy, now=t0 - SECOND)
    assert run_scheduler(now=t0) == 1
    later = t0 + 3 * DAY
    assert run_scheduler(now=later) == 1
    assert run_scheduler(now=later) == 0  # second pass: nothing due
    before = keys("digest")

    # A deploy replays the registration with the old due time: the timer is due again, but
    # each of its occurrences is already stored under its key.
    add_timer(inbox, "digest", t0, {}, cron="0 12 * * *", policy=policy, now=later)
    assert timer(inbox, "digest").due == t0
    assert run_scheduler(now=later) == 1

    assert keys("digest") == before
    assert len(set(before)) == len(before)
    assert timer(inbox, "digest").due == t0 + 4 * DAY


# --- bad input --------------------------------------------------------------------------------


BAD = [
    pytest.param({"cron": "61 9 * * *"}, "cron", id="invalid-cron-minute"),
    pytest.param({"cron": "0 9 * *"}, "cron", id="invalid-cron-fields"),
    pytest.param({"cron": "0 0 30 2 *"}, "cron", id="cron-never-fires"),
    pytest.param({"cron": "every day"}, "cron", id="cron-gibberish"),
    pytest.param({"cron": NINE_IN_BERLIN, "timezone": "Mars/Olympus"}, "timezone", id="zone"),
    pytest.param({"cron": NINE_IN_BERLIN, "timezone": "../etc/passwd"}, "timezone", id="path"),
    pytest.param({"cron": NINE_IN_BERLIN, "timezone": ""}, "timezone", id="empty-zone"),
    pytest.param({"cron": NINE_IN_BERLIN, "every": 60}, "cron", id="every-and-cron"),
    pytest.param({"cron": NINE_IN_BERLIN, "catch_up_max": 0}, "catch_up_max", id="cap-0"),
    pytest.param({"every": 60, "catch_up_max": -1}, "catch_up_max", id="cap-negative"),
    pytest.param({"every": 60, "catch_up_max": True}, "catch_up_max", id="cap-bool"),
    pytest.param({"every": 60, "catch_up_max": 2.5}, "catch_up_max", id="cap-float"),
    pytest.param({"cron": NINE_IN_BERLIN, "policy": "sometimes"}, "policy", id="policy"),
    pytest.param({"cron": NINE_IN_BERLIN, "policy": "catch up"}, "policy", id="policy-label"),
    pytest.param(
        {"cron": NINE_IN_BERLIN, "event_key": ("followup", "x")}, "event_key", id="cron-event-key"
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "field"), BAD)
def test_bad_schedule_is_refused_naming_the_field_and_stores_nothing(inbox, t0, kwargs, field):
    due = t0 if "every" in kwargs else None
    with pytest.raises(ValueError, match=rf"^{field}\b") as caught:
        add_timer(inbox, "digest", due, {}, now=t0, **kwargs)
    assert field in str(caught.value)
    assert not Timer.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "field"), BAD)
def test_bad_reregistration_leaves_the_timer_as_it_was(inbox, t0, kwargs, field):
    add_timer(inbox, "digest", None, {"v": 1}, cron=NINE_IN_BERLIN, timezone=BERLIN, now=t0)
    before = Timer.objects.values().get()
    due = t0 if "every" in kwargs else None

    with pytest.raises(ValueError, match=rf"^{field}\b"):
        add_timer(inbox, "digest", due, {"v": 2}, now=t0, **kwargs)

    assert Timer.objects.values().get() == before


# --- runscheduler ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_runscheduler_once_fires_due_timers(make_inbox, loop_command):
    a, b = make_inbox(), make_inbox()
    # The command reads the database clock: these are due in the real past.
    past = timezone.now().replace(microsecond=0) - 10 * MINUTE
    add_timer(a, "follow-up", past, {"task": "check"}, now=past)
    add_timer(b, "tick", past, {}, every=3600, now=past)
    add_timer(b, "later", past + DAY, {}, now=past)
    add_timer(b, "nine", None, {}, cron="0 9 * * *", now=past - DAY)

    call_command("runscheduler", "--once", "--verbosity", "0")

    label = f"{past:%Y-%m-%dT%H:%M:%SZ}"
    assert keys("follow-up") == [f"follow-up@{label}"]
    assert keys("tick") == [f"tick@{label}"]
    assert keys("later") == []
    assert len(keys("nine")) == 1  # a 09:00 UTC occurrence in the last day, coalesced
    assert Timer.objects.get(key="follow-up").done is True
    assert Timer.objects.get(key="tick").due == past + HOUR
    assert Timer.objects.get(key="later").done is False

    call_command("runscheduler", "--once", "--verbosity", "0")  # nothing more is due
    assert Event.objects.count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize("interval", ["0", "-1"])
def test_runscheduler_refuses_a_non_positive_interval(interval, loop_command):
    with pytest.raises(CommandError, match="--interval must be positive"):
        call_command("runscheduler", "--once", f"--interval={interval}")


# --- two schedulers at once (PostgreSQL) --------------------------------------------------------

TIMEOUT = 30


def _bounded_session():
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute("SET statement_timeout = '20s'")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("schedulers", [2, 4])
def test_schedulers_at_once_fire_each_occurrence_once(make_inbox, t0, schedulers):
    inboxes = [make_inbox() for _ in range(5)]
    expected = {}
    for n in range(30):
        inbox = inboxes[n % len(inboxes)]
        key = f"t{n}"
        kind = n % 3
        if kind == 0:
            add_timer(inbox, key, t0 - 3 * DAY, {}, every=EVERY_DAY, now=t0)  # coalesces
            expected[key] = [f"{key}@2026-03-01T12:00:00Z"]
        elif kind == 1:
            add_timer(
                inbox,
                key,
                None,
                {},
                cron="0 12 * * *",
                policy="catch_up",
                catch_up_max=3,
                now=t0 - 4 * DAY - SECOND,
            )
            expected[key] = [f"{key}@2026-02-{d}T12:00:00Z" for d in (27, 28)] + [
                f"{key}@2026-03-01T12:00:00Z"
            ]
        else:
            add_timer(inbox, key, t0 - MINUTE, {}, now=t0)  # one-off
            expected[key] = [f"{key}@2026-03-01T11:59:00Z"]

    stored_by = []  # (thread name, source_id), from every event insert
    lock = threading.Lock()

    def record(sender, event, now, **kwargs):
        with lock:
            stored_by.append((threading.current_thread().name, event.source_id))

    barrier = threading.Barrier(schedulers, timeout=TIMEOUT)
    handled = [None] * schedulers
    errors = []

    def scheduler(index):
        try:
            _bounded_session()
            barrier.wait()
            handled[index] = run_scheduler(now=t0, batch_size=1000)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    event_stored.connect(record)
    try:
        threads = [
            threading.Thread(target=scheduler, args=(i,), name=f"scheduler-{i}", daemon=True)
            for i in range(schedulers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        assert not any(thread.is_alive() for thread in threads), "a scheduler hung"
    finally:
        event_stored.disconnect(record)
    assert errors == []

    assert sum(handled) == len(expected)  # each timer handled by exactly one scheduler
    stored = sorted(Event.objects.values_list("source_id", flat=True))
    assert stored == sorted(k for ks in expected.values() for k in ks)
    # Every event of one timer was stored by one thread: no timer was handled twice.
    threads_per_timer = {}
    for name, source_id in stored_by:
        threads_per_timer.setdefault(source_id.split("@")[0], set()).add(name)
    assert set(threads_per_timer) == set(expected)
    assert all(len(names) == 1 for names in threads_per_timer.values())
    assert len(stored_by) == len(stored)  # no insert was attempted and rolled back
    assert run_scheduler(now=t0) == 0
