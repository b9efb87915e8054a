"""Deferred approvals: one answer per request is stored, and the Approval row records it."""

from datetime import timedelta

import pytest

from alwayson.runtime.api import answer_approval, request_approval, run_scheduler
from approvals.models import Approval
from inbox.models import Event
from timers.models import Timer

HOUR = timedelta(hours=1)
WINDOW = 4 * HOUR


def stored_answer(request_id):
    """The payload answer of the one approval event, and the Approval row's record of it."""
    event = Event.objects.get(source="approval", source_id=request_id)
    approval = Approval.objects.get(request_id=request_id)
    return event.payload["answer"], approval.answer, approval.answered_at


@pytest.mark.django_db
def test_yes_after_the_expiry_timer_fired_is_expired(inbox, t0):
    request_approval(inbox, "refund-881", "refund order 881", WINDOW, now=t0)
    assert run_scheduler(now=t0 + 5 * HOUR) == 1

    assert stored_answer("refund-881") == ("expired", "expired", t0 + 5 * HOUR)
    assert answer_approval(inbox, "refund-881", "yes", now=t0 + 6 * HOUR).stands == "expired"
    assert stored_answer("refund-881") == ("expired", "expired", t0 + 5 * HOUR)


@pytest.mark.django_db
def test_yes_after_the_deadline_before_the_scheduler_ran_is_expired(inbox, t0):
    request_approval(inbox, "refund-882", "refund order 882", WINDOW, now=t0)

    assert answer_approval(inbox, "refund-882", "yes", now=t0 + 5 * HOUR).stands == "expired"
    assert stored_answer("refund-882") == ("expired", "expired", t0 + 5 * HOUR)

    run_scheduler(now=t0 + 6 * HOUR)  # the expiry timer, late, finds the key taken
    assert stored_answer("refund-882") == ("expired", "expired", t0 + 5 * HOUR)
    assert Timer.objects.get(key="expire:refund-882").done is True


@pytest.mark.django_db
def test_yes_at_the_deadline_itself_is_expired(inbox, t0):
    request_approval(inbox, "refund-884", "refund order 884", WINDOW, now=t0)

    assert answer_approval(inbox, "refund-884", "yes", now=t0 + WINDOW).stands == "expired"
    assert stored_answer("refund-884") == ("expired", "expired", t0 + WINDOW)


@pytest.mark.django_db
def test_first_answer_in_time_stands_against_a_second_tap_and_the_expiry(inbox, t0):
    request_approval(inbox, "refund-883", "refund order 883", WINDOW, now=t0)

    assert answer_approval(inbox, "refund-883", "yes", now=t0 + HOUR).stands == "yes"
    assert stored_answer("refund-883") == ("yes", "yes", t0 + HOUR)

    assert answer_approval(inbox, "refund-883", "no", now=t0 + 2 * HOUR).stands == "yes"
    assert stored_answer("refund-883") == ("yes", "yes", t0 + HOUR)

    assert run_scheduler(now=t0 + 5 * HOUR) == 1
    assert stored_answer("refund-883") == ("yes", "yes", t0 + HOUR)
    assert Event.objects.filter(source="approval").count() == 1


@pytest.mark.django_db
def test_answer_to_a_request_never_made_is_unknown(inbox, t0):
    assert answer_approval(inbox, "refund-999", "yes", now=t0).stands == "unknown"

    assert not Event.objects.exists()
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_request_records_the_deadline_and_an_expiry_timer(inbox, t0):
    approval = request_approval(inbox, "refund-1", "refund order 1", WINDOW, now=t0)

    approval.refresh_from_db()
    assert (approval.action, approval.requested_at, approval.expires_at) == (
        "refund order 1",
        t0,
        t0 + WINDOW,
    )
    assert (approval.answer, approval.answered_at) == ("", None)
    timer = Timer.objects.get(inbox=inbox, key="expire:refund-1")
    assert (timer.due, timer.every, timer.done) == (t0 + WINDOW, None, False)
    assert (timer.event_source, timer.event_id) == ("approval", "refund-1")
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_requesting_twice_with_the_same_action_is_idempotent(inbox, t0):
    first = request_approval(inbox, "refund-1", "refund order 1", WINDOW, now=t0)
    again = request_approval(inbox, "refund-1", "refund order 1", 2 * WINDOW, now=t0 + HOUR)

    assert again.pk == first.pk
    approval = Approval.objects.get(inbox=inbox)
    assert (approval.requested_at, approval.expires_at) == (t0, t0 + WINDOW)
    assert list(Timer.objects.values_list("key", "due")) == [("expire:refund-1", t0 + WINDOW)]


@pytest.mark.django_db
def test_reusing_a_request_id_for_another_action_is_refused(inbox, t0):
    request_approval(inbox, "refund-1", "refund order 1", WINDOW, now=t0)

    with pytest.raises(ValueError, match="refund-1"):
        request_approval(inbox, "refund-1", "delete the repo", WINDOW, now=t0 + HOUR)

    assert list(Approval.objects.values_list("action", "expires_at")) == [
        ("refund order 1", t0 + WINDOW)
    ]
    assert Timer.objects.get().payload["action"] == "refund order 1"


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["maybe", "expired", "YES", ""])
def test_answer_must_be_yes_or_no(inbox, t0, answer):
    request_approval(inbox, "refund-1", "refund order 1", WINDOW, now=t0)

    with pytest.raises(ValueError, match="answer"):
        answer_approval(inbox, "refund-1", answer, now=t0 + HOUR)

    assert not Event.objects.exists()
    assert Approval.objects.get().answer == ""


@pytest.mark.django_db
@pytest.mark.parametrize("request_id", ["refund/881", "refund 881", "réfund?"])
def test_request_id_must_fit_in_one_url_segment(inbox, t0, request_id):
    with pytest.raises(ValueError, match="request_id may use letters"):
        request_approval(inbox, request_id, "refund order 881", timedelta(hours=4), now=t0)
    assert not Approval.objects.exists()
