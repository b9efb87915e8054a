"""What an answer posted on the approval's page costs the database, counted (structural, not
timing: bench/web.py measures the time), with the guarantees the fewer queries keep: the
message says what the answer did as decided under the lock, who answered is on the row.
"""

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval, AuditEntry
from approvals.services import answer_approval, request_approval
from inbox.models import Event, Membership, Role
from tests.support.pages import WINDOW, ask, detail_url, text_of

pytestmark = pytest.mark.django_db

# Any logged-in post reads the session and the user (the reference view too). Then:
# - on PostgreSQL, one statement (approvals/sql/answer.sql, answer_at_once), its own
#   transaction (in a test, a savepoint in the test's: its SAVEPOINT and RELEASE count): the
#   request with its inbox and the user's role (the 404, the 403), the inbox's lock and the
#   clock, the request locked with its answer event, the answer event (its UNIQUE key
#   refuses a second one) and the work marker, the row settled, the audit entry;
# - on SQLite, answer_approval's path: the request with its inbox and the user's role
#   (get_visible), before any lock; the transaction (IMMEDIATE: the lock), the lease row read
#   to refuse an unknown inbox, the request again with its answer event, the answer event
#   (the inbox read first, then its insert and the work marker, in a savepoint of their
#   own), the row settled with who answered (record_answer), the audit entry.
# (PostgreSQL's plan setting goes first on psycopg's own cursor, in the same round trip: how
# the statement is planned, not a query.)
ANSWER_POST = {"postgresql": 5, "sqlite": 14}


@pytest.fixture
def people(django_user_model, make_inbox, owner):
    desk = make_inbox("desk", owner=owner)
    finance = Group.objects.create(name="finance")
    Membership.objects.create(inbox=desk, group=finance, role=Role.APPROVER)
    clients = {}
    for name in ("dana", "lee"):
        user = django_user_model.objects.create_user(username=name)
        user.groups.add(finance)
        clients[name] = Client()
        clients[name].force_login(user)
    return desk, clients


def test_an_answer_post_costs_these_queries(people, django_assert_num_queries):
    desk, clients = people
    approval = ask(desk)

    with django_assert_num_queries(ANSWER_POST[connection.vendor]):
        response = clients["dana"].post(detail_url("desk", "refund-881"), {"answer": "yes"})

    assert (response.status_code, response["Location"]) == (302, approval.get_absolute_url())
    approval.refresh_from_db()
    assert (approval.answer, approval.answered_by.username) == ("yes", "dana")
    event = Event.objects.get(inbox=desk, source="approval", source_id="refund-881")
    assert (event.payload["answer"], event.payload["answered_by"]) == ("yes", "dana")
    assert "Your answer was recorded." in text_of(clients["dana"].get(response["Location"]))


@pytest.mark.parametrize("request_id", ["über-7", "toolu_01:call.9"])
def test_an_answer_goes_back_to_its_own_page_whatever_its_id_holds(people, request_id):
    """The answer redirects to the page it was posted from, as its link names it (a letter
    beyond ASCII escaped)."""
    desk, clients = people
    approval = ask(desk, request_id=request_id)

    response = clients["dana"].post(approval.get_absolute_url(), {"answer": "yes"})

    assert (response.status_code, response["Location"]) == (302, approval.get_absolute_url())
    assert "Your answer was recorded." in text_of(clients["dana"].get(response["Location"]))
    assert Approval.objects.get(request_id=request_id).answer == "yes"


def test_a_late_second_answer_is_told_the_first_stands(people):
    desk, clients = people
    ask(desk)
    url = detail_url("desk", "refund-881")
    clients["dana"].post(url, {"answer": "no"})

    page = clients["lee"].post(url, {"answer": "yes"}, follow=True)

    assert "already settled; the first outcome stands" in text_of(page)
    approval = Approval.objects.get()
    assert (approval.answer, approval.answered_by.username) == ("no", "dana")
    results = list(AuditEntry.objects.order_by("id").values_list("username", "result"))
    assert results == [("dana", "denied"), ("lee", "already_settled")]


def test_an_answer_event_the_row_does_not_know_is_what_stands(people):
    """An answer event stored while the row says nothing (a request id asked again after the
    first request's row was pruned, its event not yet): read with the row, it stands."""
    desk, clients = people
    ask(desk)
    Event.objects.create(
        inbox=desk,
        source="approval",
        source_id="refund-881",
        payload={"answer": "no"},
        available_at=Approval.objects.get().requested_at,
        created=Approval.objects.get().requested_at,
        updated=Approval.objects.get().requested_at,
    )

    page = clients["dana"].post(detail_url("desk", "refund-881"), {"answer": "yes"}, follow=True)

    assert "already settled; the first outcome stands" in text_of(page)
    assert Event.objects.filter(source="approval").count() == 1
    assert AuditEntry.objects.get().result == "already_settled"
    assert Approval.objects.get().answer == ""


def test_an_edited_yes_is_settled_and_recorded_by_the_one_update_of_a_plain_yes(
    people, django_user_model
):
    """The edit goes in the answer event's payload, and the row is settled with it in one
    UPDATE (record_answer): one new version of the row, the queries of a plain yes."""
    desk, _ = people
    dana = django_user_model.objects.get(username="dana")
    asked = {"order": "881", "amount": 120}
    schema = {"type": "object", "properties": {"order": {}, "amount": {"type": "number"}}}
    details = {"tool": "refund", "arguments": asked, "schema": schema}
    for request_id in ("plain", "edited"):
        request_approval(desk, request_id, "refund order 881", WINDOW, details=details)
    sent = {}
    for request_id, arguments in (("plain", None), ("edited", {**asked, "amount": 80})):
        with CaptureQueriesContext(connection) as queries:
            answer_approval(desk, request_id, "yes", by=dana, arguments=arguments)
        sent[request_id] = [q["sql"] for q in queries.captured_queries]

    assert len(sent["edited"]) == len(sent["plain"])
    updates = [sql for sql in sent["edited"] if sql.startswith('UPDATE "approvals_approval"')]
    assert len(updates) == 1, updates
    edited = Approval.objects.get(request_id="edited")
    plain = Approval.objects.get(request_id="plain")
    assert (edited.answer, edited.answered_by, edited.edited_by) == ("yes", dana, dana)
    assert edited.current_arguments == {"order": "881", "amount": 80}
    assert (plain.answer, plain.answered_by, plain.edited_by) == ("yes", dana, None)
    assert plain.edited_arguments is None
    assert Event.objects.get(source_id="edited").payload["edit"] == {
        "arguments": {"order": "881", "amount": 80},
        "by": "dana",
    }


def test_a_no_with_its_reason_costs_the_queries_of_a_yes(people, django_assert_num_queries):
    """The reason is read from the approval's own form field, cleaned as its DenyForm cleans
    it, and goes to the agent (the event), the row and the audit entry."""
    desk, clients = people
    approval = ask(desk)
    form = {"answer": "no", f"a{approval.pk}-reason": "  not this order  ", "a999999-reason": "x"}

    with django_assert_num_queries(ANSWER_POST[connection.vendor]):
        response = clients["dana"].post(detail_url("desk", "refund-881"), form)

    assert response.status_code == 302
    approval.refresh_from_db()
    assert (approval.answer, approval.reason, approval.answered_by.username) == (
        "no",
        "not this order",
        "dana",
    )
    event = Event.objects.get(inbox=desk, source="approval", source_id="refund-881")
    assert (event.payload["reason"], event.payload["approved_by"]) == ("not this order", [])
    assert event.payload["names"] == {"dana": "dana"}
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.result, entry.reason, entry.action_shown) == (
        "dana",
        "denied",
        "not this order",
        "Refund order 881",
    )


def test_a_reason_its_form_refuses_is_told_and_nothing_is_stored(people):
    desk, clients = people
    approval = ask(desk)
    form = {"answer": "no", f"a{approval.pk}-reason": "x" * 1001}

    response = clients["dana"].post(detail_url("desk", "refund-881"), form)

    assert response.status_code == 400
    assert "Ensure this value has at most 1000 characters" in text_of(response)
    assert (Approval.objects.get().answer, AuditEntry.objects.count()) == ("", 0)
    assert not Event.objects.filter(source="approval").exists()


def test_an_answer_the_statement_hands_back_is_decided_as_before(people):
    """A request of two approvers (like a question, an edit, a deadline passed) is decided
    by answer_approval: the first approval waits for a second approver."""
    desk, clients = people
    request_approval(desk, "big-1", "refund order 900", WINDOW, approvers=2)
    url = detail_url("desk", "big-1")

    first = clients["dana"].post(url, {"answer": "yes"}, follow=True)
    second = clients["lee"].post(url, {"answer": "yes"}, follow=True)

    assert "A second, different approver must also approve" in text_of(first)
    assert "Your answer was recorded." in text_of(second)
    approval = Approval.objects.get()
    assert (approval.answer, approval.first_approved_by.username) == ("yes", "dana")
    assert approval.answered_by.username == "lee"
    results = list(AuditEntry.objects.order_by("id").values_list("username", "result"))
    assert results == [("dana", "first_approval"), ("lee", "approved")]


def test_a_viewer_is_refused_and_a_stranger_gets_a_404(people, django_user_model):
    desk, _ = people
    ask(desk)
    viewer = django_user_model.objects.create_user(username="vic")
    Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)
    stranger = django_user_model.objects.create_user(username="sam")
    url = detail_url("desk", "refund-881")
    pages = {}
    for user in (viewer, stranger):
        client = Client()
        client.force_login(user)
        pages[user.username] = client.post(url, {"answer": "yes"})

    assert pages["vic"].status_code == 403
    assert "you are a viewer of" in text_of(pages["vic"])
    assert pages["sam"].status_code == 404
    assert (Approval.objects.get().answer, AuditEntry.objects.count()) == ("", 0)
