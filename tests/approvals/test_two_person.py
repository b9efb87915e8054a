"""Two people above a threshold: a request that needs two distinct approvers.

The first "yes" records a pending first approval; the request resolves "yes" only when a
second, different approver says yes before the deadline; one "no" denies it; the deadline
expires it. One answer event per request, as for every approval; every answer is audited.
(The same rules under real parallel connections: tests/contracts/test_concurrency_pg.py.)
"""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.test import Client

from alwayson.runtime.api import answer_approval, finish, request_approval, run_scheduler
from alwayson.runtime.run import Run
from approvals.models import Approval, AuditEntry
from approvals.services import WAITING, Ask
from inbox.models import Event, Membership, Role
from inbox.services import Held, acquire, claim_batch, ingest
from tests.support.pages import detail_url, text_of
from timers.models import Timer

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
WINDOW = 4 * HOUR
ACTION = "refund order 881 for 750"


@pytest.fixture
def people(make_inbox, owner, django_user_model):
    desk = make_inbox("desk", owner=owner)
    team = {"desk": desk, "owner": owner}
    for name in ("dana", "lee", "sam", "vic"):
        team[name] = django_user_model.objects.create_user(
            username=name, first_name=name.capitalize(), email=f"{name}@example.com"
        )
        role = Role.VIEWER if name == "vic" else Role.APPROVER
        Membership.objects.create(inbox=desk, user=team[name], role=role)
    return SimpleNamespace(**team)


def ask_two(inbox, t0, request_id="refund-881"):
    return request_approval(inbox, request_id, ACTION, WINDOW, now=t0, approvers=2)


def answer(people, user, reply, at, request_id="refund-881", via="api"):
    return answer_approval(people.desk, request_id, reply, now=at, by=user, via=via).stands


def approval_events():
    return list(Event.objects.filter(source="approval"))


def audit():
    return list(AuditEntry.objects.order_by("id").values_list("username", "answer", "result"))


# --- the flow ----------------------------------------------------------------------------------


def test_the_first_yes_waits_for_a_second_different_approver(people, t0):
    ask_two(people.desk, t0)

    assert answer(people, people.dana, "yes", t0 + HOUR) == WAITING

    approval = Approval.objects.get()
    assert (approval.answer, approval.first_approved_by, approval.first_approved_at) == (
        "",
        people.dana,
        t0 + HOUR,
    )
    assert approval_events() == []
    assert approval.standing_answer(t0 + HOUR) == ""
    assert approval.waits_for_second(t0 + HOUR)

    assert answer(people, people.lee, "yes", t0 + 2 * HOUR) == "yes"

    approval.refresh_from_db()
    assert (approval.answer, approval.answered_at, approval.answered_by) == (
        "yes",
        t0 + 2 * HOUR,
        people.lee,
    )
    [event] = approval_events()
    assert event.payload == {
        "approval": "refund-881",
        "answer": "yes",
        "action": ACTION,
        "approvers_needed": 2,
        "answered_by": "lee",
        "approved_by": ["dana", "lee"],
        "names": {"dana": "Dana", "lee": "Lee"},
    }
    assert audit() == [
        ("dana", "yes", "first_approval"),
        ("lee", "yes", "approved"),
    ]


def test_the_same_approver_twice_is_not_a_second_approval(people, t0):
    ask_two(people.desk, t0)
    answer(people, people.dana, "yes", t0 + HOUR)

    assert answer(people, people.dana, "yes", t0 + 2 * HOUR) == WAITING

    approval = Approval.objects.get()
    assert (approval.answer, approval.first_approved_at) == ("", t0 + HOUR)
    assert approval_events() == []
    assert audit() == [("dana", "yes", "first_approval"), ("dana", "yes", "not_counted")]


@pytest.mark.parametrize("denier", ["lee", "dana"], ids=["another-approver", "the-first-one"])
def test_one_no_denies_it(people, t0, denier):
    ask_two(people.desk, t0)
    answer(people, people.dana, "yes", t0 + HOUR)

    assert answer(people, getattr(people, denier), "no", t0 + 2 * HOUR) == "no"

    [event] = approval_events()
    assert (event.payload["answer"], event.payload["answered_by"]) == ("no", denier)
    assert event.payload["approved_by"] == []
    assert Approval.objects.get().answered_by == getattr(people, denier)
    # Settled: a later yes changes nothing, and says what stands.
    assert answer(people, people.sam, "yes", t0 + 3 * HOUR) == "no"
    assert len(approval_events()) == 1
    assert audit()[-2:] == [(denier, "no", "denied"), ("sam", "yes", "already_settled")]


def test_a_no_before_any_yes_denies_it(people, t0):
    ask_two(people.desk, t0)
    assert answer(people, people.sam, "no", t0 + HOUR) == "no"
    assert answer(people, people.dana, "yes", t0 + 2 * HOUR) == "no"
    assert Approval.objects.get().first_approved_at is None


def test_the_deadline_expires_a_request_with_one_approval(people, t0):
    ask_two(people.desk, t0)
    answer(people, people.dana, "yes", t0 + HOUR)

    assert run_scheduler(now=t0 + WINDOW) == 1

    [event] = approval_events()
    assert event.payload["answer"] == "expired"
    assert (event.payload["answered_by"], event.payload["approvers_needed"]) == (None, 2)
    approval = Approval.objects.get()
    assert (approval.answer, approval.answered_by) == ("expired", None)
    assert approval.first_approved_by == people.dana  # kept, for the record
    # The second approver, too late.
    assert answer(people, people.lee, "yes", t0 + WINDOW + HOUR) == "expired"
    assert audit() == [
        ("dana", "yes", "first_approval"),
        ("", "expired", "expired"),
        ("lee", "yes", "already_settled"),
    ]


def test_a_second_yes_after_the_deadline_before_the_timer_is_expired(people, t0):
    ask_two(people.desk, t0)
    answer(people, people.dana, "yes", t0 + HOUR)

    assert answer(people, people.lee, "yes", t0 + WINDOW) == "expired"

    [event] = approval_events()
    assert event.payload["answer"] == "expired"
    assert audit() == [
        ("dana", "yes", "first_approval"),
        ("", "expired", "expired"),
        ("lee", "yes", "too_late"),
    ]
    run_scheduler(now=t0 + WINDOW + HOUR)  # the expiry timer finds its key taken
    assert len(approval_events()) == 1
    assert Timer.objects.get().done


def test_a_yes_through_the_api_needs_to_say_who(people, t0):
    ask_two(people.desk, t0)
    with pytest.raises(ValueError, match="by: a request that needs two approvers"):
        answer_approval(people.desk, "refund-881", "yes", now=t0 + HOUR)
    assert Approval.objects.get().first_approved_at is None
    assert not AuditEntry.objects.exists()
    # A "no" needs nobody's name: it only stops the action.
    assert answer_approval(people.desk, "refund-881", "no", now=t0 + HOUR).stands == "no"


def test_a_viewer_cannot_be_either_approver(people, t0):
    from approvals.services import MayNotAnswer

    ask_two(people.desk, t0)
    answer(people, people.dana, "yes", t0 + HOUR)
    with pytest.raises(MayNotAnswer):
        answer(people, people.vic, "yes", t0 + 2 * HOUR)
    assert approval_events() == []


# --- asking ------------------------------------------------------------------------------------


@pytest.mark.parametrize("approvers", [0, 3, -1, True, "2", 1.5, None])
def test_approvers_must_be_one_or_two(people, t0, approvers):
    with pytest.raises(ValueError, match="approvers must be 1 or 2"):
        request_approval(people.desk, "refund-1", "refund order 1", WINDOW, approvers=approvers)
    with pytest.raises(ValueError, match="approvers must be 1 or 2"):
        Ask(people.desk.pk, "refund-1", "refund order 1", WINDOW, approvers=approvers)
    assert not Approval.objects.exists()


def test_asking_again_with_another_number_of_approvers_is_refused(people, t0):
    ask_two(people.desk, t0)
    with pytest.raises(ValueError, match="already asked of 2 approver"):
        request_approval(people.desk, "refund-881", ACTION, WINDOW, now=t0 + HOUR)
    again = request_approval(people.desk, "refund-881", ACTION, WINDOW, approvers=2, now=t0 + HOUR)
    assert again.pk
    assert Approval.objects.get().approvers_needed == 2


def test_run_ask_with_two_approvers_commits_with_the_finish(people, t0):
    ingest(people.desk, "chat", "m1", {"text": "refund order 881 for 750"}, now=t0)
    gen = acquire(people.desk, "W", now=t0)
    events = claim_batch(people.desk, "W", gen, now=t0)
    run = Run(people.desk, "W", gen, events, {})
    run.ask("refund-881", ACTION, WINDOW, approvers=2)
    assert not Approval.objects.exists()

    assert finish(Held(people.desk, "W", gen, [e.pk for e in events]), run.effects(), now=t0)

    approval = Approval.objects.get()
    assert (approval.approvers_needed, approval.expires_at) == (2, t0 + WINDOW)
    assert Timer.objects.get().payload["approvers_needed"] == 2


def test_a_single_approvers_answer_names_them_and_an_expiry_names_nobody(people, t0):
    request_approval(people.desk, "refund-1", "refund order 1", WINDOW, now=t0)
    request_approval(people.desk, "refund-2", "refund order 2", WINDOW, now=t0)

    assert answer(people, people.dana, "yes", t0 + HOUR, "refund-1") == "yes"
    run_scheduler(now=t0 + WINDOW)

    yes = Event.objects.get(source_id="refund-1").payload
    assert (yes["answered_by"], yes["approved_by"], yes["names"]) == (
        "dana",
        ["dana"],
        {"dana": "Dana"},
    )
    expired = Event.objects.get(source_id="refund-2").payload
    assert (expired["answer"], expired["answered_by"], expired["approved_by"]) == (
        "expired",
        None,
        [],
    )
    assert Approval.objects.get(request_id="refund-2").answered_by is None


# --- the pages ---------------------------------------------------------------------------------


def browse_as(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_pages_show_the_second_approver_what_is_waiting(people):
    request_approval(people.desk, "refund-881", ACTION, WINDOW, approvers=2)
    dana, lee = browse_as(people.dana), browse_as(people.lee)
    page = text_of(dana.get(detail_url("desk", "refund-881")))
    assert "<dt>Approvers</dt><dd>Two different people must approve</dd>" in page

    first = dana.post(detail_url("desk", "refund-881"), {"answer": "yes"}, follow=True)

    html = text_of(first)
    assert "Your approval is recorded. A second, different approver must also approve" in html
    assert "You approved. It needs a second, different approver" in html
    assert 'value="yes"' not in html and 'value="no"' in html  # may still deny
    again = text_of(dana.post(detail_url("desk", "refund-881"), {"answer": "yes"}, follow=True))
    assert "You already approved this request" in again

    for path in (detail_url("desk", "refund-881"), "/approvals/", "/inbox/desk/"):
        html = text_of(lee.get(path))
        assert "Dana approved" in html, path
    lee_page = text_of(lee.get(detail_url("desk", "refund-881")))
    assert '<dd class="first-approval">Dana at' in lee_page
    assert 'value="yes"' in lee_page
    card = text_of(dana.get("/inbox/desk/"))
    assert "You approved; waiting for a second, different approver." in card

    second = lee.post(
        detail_url("desk", "refund-881"),
        {"answer": "yes", "via": "conversation", "next": "/inbox/desk/"},
        follow=True,
    )

    assert "Your answer was recorded." in text_of(second)
    assert "Answered by Dana and Lee" in text_of(second)
    settled = text_of(lee.get(detail_url("desk", "refund-881")))
    assert '<p class="outcome" role="status">Approved.</p>' in settled
    assert '<dd class="answered-by">Dana and Lee</dd>' in settled
    assert list(AuditEntry.objects.order_by("id").values_list("username", "via", "result")) == [
        ("dana", "page", "first_approval"),
        ("dana", "page", "not_counted"),
        ("lee", "conversation", "approved"),
    ]
    assert set(AuditEntry.objects.values_list("action_shown", flat=True)) == {
        "Refund order 881 for 750"
    }


def test_a_first_approval_on_the_conversation_card_leaves_the_saying_to_the_card(people):
    # The conversation updates itself: a message over it would still say the request waits
    # for a second approver after Lee approved it.
    request_approval(people.desk, "refund-881", ACTION, WINDOW, approvers=2)
    dana = browse_as(people.dana)
    answer = {"answer": "yes", "via": "conversation", "next": "/inbox/desk/"}

    first = dana.post(detail_url("desk", "refund-881"), answer, follow=True)
    again = dana.post(detail_url("desk", "refund-881"), answer, follow=True)

    for page in (first, again):
        assert page.redirect_chain == [("/inbox/desk/", 302)]
        html = text_of(page)
        assert 'class="messages"' not in html
        assert "You approved; waiting for a second, different approver." in html
    lee = browse_as(people.lee)
    lee.post(detail_url("desk", "refund-881"), answer)
    settled = text_of(dana.get("/inbox/desk/"))
    assert "Approved." in settled and "second, different approver" not in settled
