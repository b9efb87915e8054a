"""alwayson inside a stranger's project: its own user model and URLs, alwayson's under
/agents/, the smoke path ingest → run → reply → approval → the run resumed, written with
alwayson.testing as that project's team would write it."""

from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from approvals.models import Approval
from inbox.models import Event, Inbox

AGENT = "tests.embedded.agent.agent"


def test_the_project_runs_on_its_own_user_model():
    from tests.embedded.accounts.models import User

    assert get_user_model() is User
    assert Inbox._meta.get_field("owner").related_model is User
    assert User._meta.db_table == "acme_people"
    assert User.USERNAME_FIELD == "email" and not hasattr(User, "username")


def test_a_chat_message_is_run_and_answered_by_email(harness):
    desk = harness.inbox("desk")  # no AgentConfig: the project's ALWAYSON_AGENT

    assert desk.chat("hello")
    harness.run_until_idle()

    assert desk.said() == ["Hello desk-owner@example.com."]
    [delivery] = desk.sent()
    assert (delivery.channel, delivery.to) == ("email", "desk-owner@example.com")


def test_a_refund_is_asked_answered_on_the_page_under_the_prefix_and_the_run_resumes(harness):
    desk = harness.inbox("desk", agent=AGENT)
    dana = desk.member("dana", role="approver", team="refunds")

    desk.chat("refund 881")
    harness.run_until_idle()
    [approval] = desk.waiting_for_approval()
    assert approval.action == "refund order 881"
    assert desk.said() == ["Refund order 881? I have asked for approval."]

    page = approval.get_absolute_url()
    assert page == "/agents/approvals/desk/refund-881/"
    browser = Client()
    browser.force_login(dana)
    assert browser.get(page).status_code == 200
    assert browser.post(page, {"answer": "yes"}).status_code == 302
    harness.run_until_idle()

    assert desk.said()[-1] == "Order 881: yes, by dana@example.com."
    assert desk.state == {"answers": ["yes"]}
    assert Approval.objects.get(pk=approval.pk).answered_by == dana
    assert [e.source for e in desk.events()] == ["chat", "approval"]


def test_an_unanswered_approval_expires_on_the_harness_clock(harness):
    desk = harness.inbox("desk", agent=AGENT)
    desk.chat("refund 882")
    harness.run_until_idle()

    harness.advance(hours=4)

    assert desk.waiting_for_approval() == []
    assert desk.said()[-1] == "Order 882: nobody answered in time."
    assert harness.answer(desk.approvals()[0], "yes") == "expired"


def test_a_signed_webhook_reaches_the_inbox_under_the_prefix(harness):
    desk = harness.inbox("desk", agent=AGENT)

    response = desk.webhook("standard", {"type": "order.late", "order": 881}, delivery_id="w-1")

    assert response.request["PATH_INFO"] == "/agents/hooks/standard/desk/"
    assert Event.objects.get(inbox__slug="desk").source_id == "w-1"


def test_the_pages_answer_under_the_prefix_beside_the_project_s_own(harness):
    desk = harness.inbox("desk", agent=AGENT)
    browser = Client()

    assert browser.get("/").content == b"Acme's own home page"
    assert reverse("inbox", kwargs={"slug": "desk"}) == "/agents/inbox/desk/"
    anonymous = browser.get("/agents/inbox/desk/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")

    browser.force_login(desk.owner)
    page = browser.get("/agents/inbox/desk/")
    assert page.status_code == 200 and b"desk" in page.content
    assert browser.get("/agents/approvals/").status_code == 200
    assert Client().get("/agents/", headers={"host": "elsewhere.example.com"}).status_code == 400


def test_the_project_s_admin_finds_inboxes_by_their_owner_on_its_user_model(harness):
    harness.inbox("desk")
    harness.inbox("returns")
    boss = get_user_model().objects.create_superuser("boss@acme.example.com", "pw-boss-1")
    browser = Client()
    browser.force_login(boss)

    found = browser.get("/admin/inbox/inbox/", {"q": "returns-owner"})
    assert found.status_code == 200
    assert [inbox.slug for inbox in found.context["cl"].result_list] == ["returns"]
    owners = browser.get(
        "/admin/autocomplete/",
        {"app_label": "inbox", "model_name": "inbox", "field_name": "owner", "term": "desk"},
    )
    assert owners.status_code == 200
    assert [person["text"] for person in owners.json()["results"]] == ["desk-owner@example.com"]


def test_a_person_logs_in_by_the_field_the_user_model_names(harness):
    dana = harness.person("dana", password="pw-dana-1")
    browser = Client()

    form = browser.get("/accounts/login/")
    assert b'<label for="id_username">Email address</label>' in form.content
    wrong = browser.post("/accounts/login/", {"username": "dana", "password": "pw-dana-1"})
    assert b"Your email address and password didn't match." in wrong.content
    done = browser.post(
        "/accounts/login/", {"username": "dana@example.com", "password": "pw-dana-1"}
    )
    assert done.status_code == 302
    assert browser.get("/agents/inbox/").wsgi_request.user == dana
