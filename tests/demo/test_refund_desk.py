"""The example agent end to end: Worker.step with the refund desk and the real services.

The worker uses the database's clock, so events are stored with `now=None`. Where a test
needs time to have passed (an approval window running out, a lease lapsing), it moves the
rows into the past instead of sleeping.
"""

from datetime import timedelta

import pytest

from alwayson.demo import refund_desk
from alwayson.demo.models import Refund
from alwayson.runtime.api import answer_approval, finish, ingest, run_scheduler
from alwayson.runtime.run import Run
from alwayson.runtime.worker import Worker
from approvals.models import Approval
from inbox.clock import database_now, whole_seconds
from inbox.models import Event, Lease, Session
from inbox.services import Held, acquire_next, claim_batch, mark_dead
from outbox.models import OutboxMessage
from timers.models import Timer

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def step(worker_id="desk-worker"):
    result = Worker(worker_id, refund_desk.agent).step()
    assert result is not None
    return result


def messages(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("body", "urgent")
    )


def session_state(inbox):
    return Session.objects.get(inbox=inbox).state


def ask_for_refund(inbox, order="881"):
    """The owner asks in chat; the desk asks back for approval. The step's result."""
    ingest(inbox, "chat", f"msg-{order}", {"text": f"Please refund order {order}, thanks"})
    return step()


def approval_event(inbox, request_id="refund-881"):
    return Event.objects.get(inbox=inbox, source="approval", source_id=request_id)


def move_approval_into_the_past(inbox, request_id="refund-881", by=5 * HOUR):
    """The request was made `by` ago: its window has run out."""
    approval = Approval.objects.get(inbox=inbox, request_id=request_id)
    Approval.objects.filter(pk=approval.pk).update(
        requested_at=approval.requested_at - by, expires_at=approval.expires_at - by
    )
    timer = Timer.objects.get(inbox=inbox, key=f"expire:{request_id}")
    Timer.objects.filter(pk=timer.pk).update(due=timer.due - by)


# --- asking ----------------------------------------------------------------------------------


def test_refund_request_asks_for_approval_with_a_four_hour_window(inbox):
    result = ask_for_refund(inbox)

    assert (result.events, result.outcome) == (1, "asked 1, said 1")
    approval = Approval.objects.get(inbox=inbox)
    assert (approval.request_id, approval.action, approval.answer) == (
        "refund-881",
        "refund order 881",
        "",
    )
    assert approval.expires_at == whole_seconds(approval.requested_at + 4 * HOUR)
    timer = Timer.objects.get(inbox=inbox)
    assert (timer.key, timer.due, timer.done) == ("expire:refund-881", approval.expires_at, False)
    assert (timer.event_source, timer.event_id) == ("approval", "refund-881")
    [(body, urgent)] = messages(inbox)
    assert urgent is True
    assert "order 881" in body
    assert session_state(inbox) == {"awaiting": {"refund-881": "881"}}
    assert Event.objects.get(source_id="msg-881").status == "done"
    assert not Refund.objects.exists()


def test_chat_that_is_not_a_refund_request_gets_one_help_message(inbox):
    Session.objects.filter(inbox=inbox).update(state={"awaiting": {}})
    ingest(inbox, "chat", "msg-1", {"text": "hello, how are you?"})
    ingest(inbox, "chat", "msg-2", {"text": "refund my order please"})  # no order number

    result = step()

    assert (result.events, result.outcome) == (2, "said 1")
    assert list(Event.objects.values_list("source_id", "status")) == [
        ("msg-1", "done"),
        ("msg-2", "done"),
    ]
    assert messages(inbox) == [(refund_desk.HELP, True)]
    assert "refund order 881" in refund_desk.HELP
    assert not Approval.objects.exists()
    assert not Timer.objects.exists()
    assert session_state(inbox) == {"awaiting": {}}


# --- answers ---------------------------------------------------------------------------------


def test_yes_refunds_the_order_and_says_so(inbox):
    ask_for_refund(inbox)
    assert answer_approval(inbox, "refund-881", "yes").stands == "yes"

    result = step()

    assert result.outcome == "said 1"
    refund = Refund.objects.get()
    assert refund.order == "881"
    assert refund.idempotency_key.startswith("refund-")
    assert messages(inbox)[-1] == ("Refunded order 881", True)
    assert Approval.objects.get(request_id="refund-881").answer == "yes"
    assert approval_event(inbox).status == "done"
    assert session_state(inbox) == {"awaiting": {}}


def test_no_says_nothing_was_refunded_and_why(inbox):
    ask_for_refund(inbox)
    assert answer_approval(inbox, "refund-881", "no").stands == "no"

    step()

    assert not Refund.objects.exists()
    assert messages(inbox)[-1] == ("Did not refund order 881: the request was denied.", True)
    assert Approval.objects.get(request_id="refund-881").answer == "no"
    assert session_state(inbox) == {"awaiting": {}}


def test_expiry_says_nothing_was_refunded_and_why(inbox):
    ask_for_refund(inbox)
    move_approval_into_the_past(inbox)

    assert run_scheduler() == 1  # the expiry timer fires on the database's clock
    assert approval_event(inbox).payload["answer"] == "expired"
    step()

    assert not Refund.objects.exists()
    assert messages(inbox)[-1] == ("Did not refund order 881: nobody approved it in time.", True)
    assert Approval.objects.get(request_id="refund-881").answer == "expired"
    assert Timer.objects.get(key="expire:refund-881").done is True
    # A "yes" that comes after the expiry stands as the expiry: still no refund.
    assert answer_approval(inbox, "refund-881", "yes").stands == "expired"
    assert not Refund.objects.exists()


def test_yes_after_the_deadline_counts_as_expired(inbox):
    ask_for_refund(inbox)
    move_approval_into_the_past(inbox)

    # The scheduler has not run yet; the answer's own deadline check decides.
    assert answer_approval(inbox, "refund-881", "yes").stands == "expired"
    step()

    assert not Refund.objects.exists()
    assert messages(inbox)[-1] == ("Did not refund order 881: nobody approved it in time.", True)
    assert run_scheduler() == 1  # the expiry fires, but its event is a duplicate
    assert Event.objects.filter(source="approval").count() == 1


# --- a crash mid-run: the idempotency key ----------------------------------------------------


def test_run_retried_after_a_crash_mid_run_refunds_once(inbox):
    ask_for_refund(inbox)
    answer_approval(inbox, "refund-881", "yes")

    # Worker A claims the answer, calls the payments tool, and dies before its finish.
    inbox_id, gen_a = acquire_next("A")
    events_a = claim_batch(inbox_id, "A", gen_a)
    crashed = Run(inbox, "A", gen_a, events_a, session_state(inbox))
    refund_desk.agent(crashed)
    assert Refund.objects.count() == 1
    ids_a = [e.pk for e in events_a]
    # Time passes: A's lease lapsed an hour ago (and its claim is older still).
    long_ago = database_now() - HOUR
    Lease.objects.filter(inbox=inbox).update(until=long_ago)
    Event.objects.filter(pk__in=ids_a).update(updated=long_ago - timedelta(minutes=2))

    result = step("B")  # B takes over and runs the same event again

    assert result.generation == gen_a + 1
    assert result.outcome == "said 1"
    refund = Refund.objects.get()  # one refund, not two
    assert refund.order == "881"
    assert refund.idempotency_key == crashed.key("refund", events_a[0])
    event = approval_event(inbox)
    assert (event.status, event.attempts, event.claim_gen) == ("done", 2, gen_a + 1)
    # A wakes up and tries to finish: refused, nothing written twice.
    assert finish(Held(inbox, "A", gen_a, ids_a), crashed.effects()) is False
    assert [body for body, _ in messages(inbox)].count("Refunded order 881") == 1
    assert Refund.objects.count() == 1


# --- the daily digest ------------------------------------------------------------------------


def test_digest_sums_up_events_settled_in_the_last_day(inbox):
    """Counted by when an event was handled or died, whenever it arrived."""
    now = database_now()
    ingest(inbox, "webhook", "hello", {"text": "hello"})
    ingest(inbox, "webhook", "last-week", {"text": "old news"}, now=now - 7 * DAY)
    step()  # both done today
    ingest(inbox, "chat", "settled-long-ago", {"text": "x"}, now=now - 3 * DAY)
    Event.objects.filter(source_id="settled-long-ago").update(status="done", updated=now - 2 * DAY)
    ingest(inbox, "webhook", "poison", {"bad": True})
    ingest(inbox, "webhook", "old-poison", {"bad": True}, now=now - 2 * DAY)
    poison = list(Event.objects.filter(source_id="poison").values_list("pk", flat=True))
    assert mark_dead(poison, "operator: bad payload") == poison
    old = list(Event.objects.filter(source_id="old-poison").values_list("pk", flat=True))
    assert mark_dead(old, "died long ago", now=now - 2 * DAY) == old
    refund_desk.install(inbox, whole_seconds(now) - timedelta(minutes=1))

    assert run_scheduler() == 1
    result = step()

    assert result.outcome == "said 1"
    assert messages(inbox) == [
        (
            "Daily digest: 2 event(s) handled, 1 dead.\n"
            "- dead: webhook:poison (operator: bad payload)",
            False,
        )
    ]
    digest = Event.objects.get(source="timer")
    assert digest.status == "done"
    assert digest.payload["task"] == "daily digest"
    timer = Timer.objects.get(key="digest")
    assert (timer.every, timer.done) == (refund_desk.DIGEST_EVERY, False)
    assert timer.due == whole_seconds(now) - timedelta(minutes=1) + DAY


def test_digest_with_nothing_to_report(inbox):
    refund_desk.install(inbox, whole_seconds(database_now()) - timedelta(minutes=1))
    run_scheduler()

    step()

    assert messages(inbox) == [("Daily digest: 0 event(s) handled, 0 dead.", False)]


def test_other_timers_are_ignored(inbox):
    from alwayson.runtime.api import add_timer

    add_timer(inbox, "misc", whole_seconds(database_now()) - timedelta(minutes=1), {"task": "x"})
    run_scheduler()

    assert step().outcome == "quiet"
    assert messages(inbox) == []
    assert Event.objects.get(source="timer").status == "done"


# --- settled edge cases ---------------------------------------------------------------------


def test_digest_reports_an_event_that_died_in_the_last_day_but_arrived_earlier(inbox):
    now = database_now()
    ingest(inbox, "webhook", "slow-poison", {"bad": True}, now=now - 25 * HOUR)
    [poison] = Event.objects.filter(source_id="slow-poison").values_list("pk", flat=True)
    assert mark_dead([poison], "too many attempts (3)", now=now - HOUR) == [poison]
    refund_desk.install(inbox, whole_seconds(now) - timedelta(minutes=1))
    run_scheduler()

    step()

    [(body, _)] = messages(inbox)
    assert "webhook:slow-poison" in body  # the digest a day earlier saw it still pending


def test_second_request_for_a_denied_order_asks_again_under_a_new_id(inbox):
    ask_for_refund(inbox)
    answer_approval(inbox, "refund-881", "no")
    step()
    ingest(inbox, "chat", "msg-881-again", {"text": "refund order 881, I changed my mind"})
    step()
    assert "refund-881-2" in messages(inbox)[-1][0]

    assert answer_approval(inbox, "refund-881-2", "yes").stands == "yes"
    step()

    assert Refund.objects.filter(order="881").count() == 1
    assert session_state(inbox).get("awaiting", {}) == {}


def test_asking_again_while_waiting_points_at_the_open_request(inbox):
    ask_for_refund(inbox)
    ingest(inbox, "chat", "msg-881-again", {"text": "refund order 881 please"})
    step()

    assert "already waiting" in messages(inbox)[-1][0]
    assert list(Approval.objects.filter(inbox=inbox).values_list("request_id", flat=True)) == [
        "refund-881"
    ]


# --- teams: who approved, and two people above the threshold -----------------------------------


@pytest.fixture
def approvers(inbox, django_user_model):
    from inbox.models import Membership, Role

    people = []
    for name in ("dana", "lee"):
        user = django_user_model.objects.create_user(username=name, first_name=name.capitalize())
        Membership.objects.create(inbox=inbox, user=user, role=Role.APPROVER)
        people.append(user)
    return people


def ask_with(inbox, text, source_id="msg-881"):
    ingest(inbox, "chat", source_id, {"text": text})
    return step()


@pytest.mark.parametrize(
    ("text", "action", "needed"),
    [
        ("refund order 881 for 750", "refund order 881 for 750", 2),
        ("Refund order #881 for $500.01 please", "refund order 881 for 500.01", 2),
        ("refund order 881, amount: 1200", "refund order 881 for 1200", 2),
        ("refund order 881 for 500", "refund order 881 for 500", 1),
        ("refund order 881 for €20", "refund order 881 for 20", 1),
        ("refund order 881", "refund order 881", 1),
        ("refund order 881 in 750 days", "refund order 881", 1),
    ],
)
def test_a_refund_above_the_threshold_needs_two_approvers(inbox, text, action, needed):
    ask_with(inbox, text)

    approval = Approval.objects.get(inbox=inbox)
    assert (approval.action, approval.approvers_needed) == (action, needed)
    [(body, urgent)] = messages(inbox)
    assert body.startswith(f"{action[0].upper()}{action[1:]}? ")
    assert ("two different approvers must approve it within 4 hours" in body) == (needed == 2)


def test_the_threshold_is_a_setting(inbox, settings):
    settings.ALWAYSON_REFUND_TWO_APPROVERS_ABOVE = 100
    ask_with(inbox, "refund order 881 for 150")
    assert Approval.objects.get(inbox=inbox).approvers_needed == 2
    assert "It is above 100, so two different approvers" in messages(inbox)[0][0]


def test_the_reply_names_both_approvers(inbox, approvers):
    dana, lee = approvers
    ask_with(inbox, "refund order 881 for 750")
    assert answer_approval(inbox, "refund-881", "yes", by=dana).stands == "waiting"
    assert Worker("desk-worker", refund_desk.agent).step() is None  # nothing to run yet
    assert answer_approval(inbox, "refund-881", "yes", by=lee).stands == "yes"

    step()

    assert messages(inbox)[-1] == ("Refunded order 881, approved by Dana and Lee", True)
    assert Refund.objects.get().order == "881"


def test_the_reply_names_a_single_approver_and_a_denier(inbox, approvers):
    dana, lee = approvers
    ask_with(inbox, "refund order 881")
    answer_approval(inbox, "refund-881", "yes", by=dana)
    step()
    assert messages(inbox)[-1] == ("Refunded order 881, approved by Dana", True)

    ask_with(inbox, "refund order 882 for 900", source_id="msg-882")
    answer_approval(inbox, "refund-882", "yes", by=dana)
    answer_approval(inbox, "refund-882", "no", by=lee)
    step()
    assert messages(inbox)[-1] == ("Did not refund order 882: the request was denied by Lee.", True)
    assert Refund.objects.count() == 1


def test_an_expired_two_person_refund_says_two_did_not_approve(inbox, approvers):
    ask_with(inbox, "refund order 881 for 750")
    answer_approval(inbox, "refund-881", "yes", by=approvers[0])
    move_approval_into_the_past(inbox)
    assert run_scheduler() == 1

    step()

    assert messages(inbox)[-1] == (
        "Did not refund order 881: it needed two approvers, and two did not approve it in time.",
        True,
    )
    assert not Refund.objects.exists()
