"""Reserved keys stay reserved on every path: only the approval machinery writes the
"approval" source and the approvals' expiry timers ("expire:<request id>"), and nobody fixes
a "timer" event key. add_timer, run.schedule(), the admin's timer form and a Schedule made by
hand all refuse them with a ValueError (a form error in the admin), writing nothing; the
expiry still fires "expired" at the deadline."""

from datetime import timedelta

import pytest
from django.urls import reverse

from alwayson.runtime.api import add_timer, answer_approval, ingest, request_approval, run_scheduler
from alwayson.runtime.worker import Worker
from inbox import clock
from inbox.models import Event
from tests.support.admin import timer_form
from tests.support.runs import finish_run, start_run
from tests.support.tables import snapshot
from timers.models import Timer
from timers.services import Schedule

pytestmark = pytest.mark.django_db

WINDOW = timedelta(hours=4)
SECOND = timedelta(seconds=1)
REQUEST = "refund-881"
EXPIRY_KEY = f"expire:{REQUEST}"

FORGERIES = {
    # A "yes" under the approval's key, due in the same scheduler pass as the expiry.
    "approval-answer": {"key": "forged", "event_key": ("approval", REQUEST)},
    # An occurrence's key, taken before the real timer fires it.
    "timer-occurrence": {"key": "forged", "event_key": ("timer", "digest@2026-03-01T16:00:00Z")},
    # A timer replacing the approval's expiry timer.
    "expiry-timer": {"key": EXPIRY_KEY},
}
ERRORS = {
    "approval-answer": "event_key source 'approval' is reserved",
    "timer-occurrence": "event_key source 'timer' is reserved",
    "expiry-timer": f"key '{EXPIRY_KEY}': keys starting 'expire:' are reserved",
}


@pytest.fixture
def asked(inbox, t0):
    """An inbox with an approval waiting for its answer, and the approval's expiry timer."""
    request_approval(inbox, REQUEST, "refund order 881", WINDOW, now=t0)
    return inbox


def assert_the_expiry_stands(inbox, t0):
    """The expiry timer is still the approval's, and at the deadline it answers "expired"."""
    timer = Timer.objects.get(inbox=inbox, key=EXPIRY_KEY)
    assert (timer.due, timer.event_source, timer.event_id) == (t0 + WINDOW, "approval", REQUEST)
    assert not Timer.objects.filter(inbox=inbox, key="forged").exists()
    run_scheduler(now=t0 + WINDOW)
    answer = Event.objects.get(inbox=inbox, source="approval", source_id=REQUEST)
    assert answer.payload["answer"] == "expired"
    assert answer_approval(inbox, REQUEST, "yes", now=t0 + WINDOW).stands == "expired"


# --- add_timer, and a Schedule made by hand --------------------------------------------------


@pytest.mark.parametrize("forgery", FORGERIES, ids=FORGERIES.keys())
def test_add_timer_refuses_reserved_keys(asked, t0, forgery):
    before = snapshot()
    fields = FORGERIES[forgery]

    with pytest.raises(ValueError, match=ERRORS[forgery]):
        add_timer(
            asked,
            fields["key"],
            t0 + WINDOW,
            {"approval": REQUEST, "answer": "yes"},
            event_key=fields.get("event_key"),
            now=t0,
        )

    assert snapshot() == before
    assert_the_expiry_stands(asked, t0)


@pytest.mark.parametrize("forgery", FORGERIES, ids=FORGERIES.keys())
def test_a_schedule_made_by_hand_refuses_reserved_keys(inbox, t0, forgery):
    fields = FORGERIES[forgery]
    with pytest.raises(ValueError, match=ERRORS[forgery]):
        Schedule(inbox.pk, fields["key"], due=t0, event_key=fields.get("event_key"))


def test_only_the_approval_machinery_makes_reserved_schedules(inbox, t0):
    """Schedule.reserved() is what the approvals app uses; even it can't fix a timer key."""
    expiry = Schedule.reserved(inbox.pk, EXPIRY_KEY, due=t0, event_key=("approval", REQUEST))
    assert (expiry.key, expiry.event_key) == (EXPIRY_KEY, ("approval", REQUEST))
    with pytest.raises(ValueError, match="event_key source 'timer' is reserved"):
        Schedule.reserved(inbox.pk, "tick", due=t0, event_key=("timer", "tick@x"))


def test_keys_that_only_look_reserved_are_anyones(inbox, t0):
    add_timer(inbox, "expire", t0, now=t0)
    add_timer(inbox, "re-expire:881", t0, now=t0)
    add_timer(inbox, "alarm", t0, event_key=("approvals", REQUEST), now=t0)
    assert Timer.objects.filter(inbox=inbox).count() == 3


# --- run.schedule() --------------------------------------------------------------------------


def test_run_schedule_refuses_an_approval_expiry_key(asked, t0):
    ingest(asked, "chat", "m1", {}, now=t0)
    run = start_run(asked, "A", now=t0)

    with pytest.raises(ValueError, match=ERRORS["expiry-timer"]):
        run.schedule(EXPIRY_KEY, delay=60)

    assert finish_run(run, now=t0 + SECOND) is True
    assert_the_expiry_stands(asked, t0)


def test_an_agent_that_schedules_an_expiry_key_fails_its_run(inbox):
    now = clock.database_now()
    request_approval(inbox, REQUEST, "refund order 881", WINDOW, now=now)
    ingest(inbox, "chat", "m1", {})

    def agent(run):
        run.schedule(EXPIRY_KEY, delay=60, payload={"answer": "never"})

    result = Worker("A", agent).step()

    assert result.outcome.startswith("error: ValueError: key 'expire:refund-881'")
    event = Event.objects.get(source_id="m1")
    assert (event.status, event.attempts) == ("pending", 1)
    assert "reserved for approval expiry timers" in event.error
    assert_the_expiry_stands(inbox, clock.whole_seconds(now))


# --- the admin ---------------------------------------------------------------------------------


def admin_url(view, *args):
    return reverse(f"admin:timers_timer_{view}", args=args)


def test_admin_refuses_to_add_a_timer_under_an_expiry_key(admin_client, asked, t0):
    before = snapshot()

    response = admin_client.post(
        admin_url("add"), timer_form(asked, key=EXPIRY_KEY, due="2026-03-01 12:00:01")
    )

    assert response.status_code == 200
    assert "keys starting &#x27;expire:&#x27; are reserved" in response.content.decode()
    assert snapshot() == before
    assert_the_expiry_stands(asked, t0)


def test_admin_cannot_delete_an_expiry_timer(admin_client, asked, t0):
    timer = Timer.objects.get(key=EXPIRY_KEY)
    mine = add_timer(asked, "digest", t0, every=3600, now=t0)

    assert admin_client.post(admin_url("delete", timer.pk), {"post": "yes"}).status_code == 403
    bulk = admin_client.post(
        admin_url("changelist"),
        {"action": "delete_selected", "_selected_action": [timer.pk, mine.pk], "post": "yes"},
    )
    assert bulk.status_code == 403
    assert Timer.objects.filter(pk__in=[timer.pk, mine.pk]).count() == 2
    # A timer of the agent's own may still go.
    assert admin_client.post(admin_url("delete", mine.pk), {"post": "yes"}).status_code == 302
    assert_the_expiry_stands(asked, t0)
