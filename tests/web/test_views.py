"""The people's pages: the approval list and detail, the inbox page, login.

The views decide on the database's clock (`clock.database_now()`), so these tests request
approvals with `now=None` and move a deadline by updating `expires_at`, never by sleeping.
"""

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.test import Client

from alwayson.demo import refund_desk
from alwayson.runtime.worker import Worker
from approvals.models import Approval
from approvals.services import request_approval
from inbox import clock
from inbox.models import Event
from inbox.services import ingest
from outbox.models import OutboxMessage
from outbox.services import dispatch
from tests.support.pages import WINDOW, ask, detail_url, message_id_of, snapshot, text_of

BUTTONS = ('value="yes"', 'value="no"', ">Approve<", ">Deny<")
EXPIRED_WORDS = re.compile(r"This request expired at (\d\d:\d\d) UTC; nothing was done\.")


# --- helpers ---------------------------------------------------------------------------------


def expire(approval, ago=timedelta(minutes=5)):
    """Move the deadline into the past on the database's clock; the expiry timer has not run."""
    past = clock.whole_seconds(clock.database_now() - ago)
    Approval.objects.filter(pk=approval.pk).update(expires_at=past)
    approval.refresh_from_db()
    return approval


def section(html, heading):
    """The part of a page from one <h2> to the next (or the end)."""
    start = html.index(heading)
    end = html.find("<h2", start + len(heading))
    return html[start : end if end != -1 else len(html)]


# --- login -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    ["/", "/approvals/", "/approvals/desk/refund-881/", "/inbox/desk/"],
)
def test_every_page_requires_login(client, desk, path):
    ask(desk)
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


@pytest.mark.django_db
def test_an_anonymous_post_answers_nothing(client, desk):
    approval = ask(desk)
    before = snapshot()

    response = client.post(detail_url("desk", "refund-881"), {"answer": "yes"})

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert snapshot() == before
    approval.refresh_from_db()
    assert approval.answer == ""


@pytest.mark.django_db
def test_login_page_logs_in_and_returns_to_the_page_asked_for(client, owner, desk):
    page = client.get("/accounts/login/?next=/approvals/")
    assert page.status_code == 200
    html = text_of(page)
    assert '<label for="id_username">Username</label>' in html
    assert '<label for="id_password">Password</label>' in html

    wrong = client.post(
        "/accounts/login/", {"username": "owner", "password": "nope", "next": "/approvals/"}
    )
    assert wrong.status_code == 200
    assert "Your username and password didn't match." in text_of(wrong)

    right = client.post(
        "/accounts/login/",
        {"username": "owner", "password": "pw-owner-123", "next": "/approvals/"},
    )
    assert right.status_code == 302
    assert right["Location"] == "/approvals/"
    assert client.get("/approvals/").status_code == 200


# --- who sees what ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_owner_sees_only_their_inboxes_approvals(owner_client, desk, stranger_desk):
    ask(desk, "refund-881", "refund order 881")
    ask(stranger_desk, "refund-999", "refund order 999")

    html = text_of(owner_client.get("/approvals/"))

    assert "Refund order 881" in html
    assert "refund order 999" not in html.lower()
    assert detail_url("other-desk", "refund-999") not in html
    assert owner_client.get(detail_url("desk", "refund-881")).status_code == 200
    assert owner_client.get(detail_url("other-desk", "refund-999")).status_code == 404


@pytest.mark.django_db
def test_staff_with_the_answer_permission_see_and_answer_all(
    django_user_model, desk, stranger_desk
):
    ask(desk, "refund-881", "refund order 881")
    ask(stranger_desk, "refund-999", "refund order 999")
    operator = django_user_model.objects.create_user(username="operator", is_staff=True)
    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="approvals", codename="answer_any_approval")
    )
    client = Client()
    client.force_login(operator)

    html = text_of(client.get("/approvals/"))
    assert "Refund order 881" in html
    assert "Refund order 999" in html

    answered = client.post(detail_url("other-desk", "refund-999"), {"answer": "no"}, follow=True)
    assert answered.status_code == 200
    assert "Denied." in text_of(answered)
    assert Approval.objects.get(request_id="refund-999").answer == "no"


@pytest.mark.django_db
@pytest.mark.parametrize("is_staff", [True, False], ids=["staff", "not-staff"])
def test_without_both_staff_and_the_permission_only_ones_own(
    django_user_model, desk, stranger_desk, is_staff
):
    ask(stranger_desk, "refund-999", "refund order 999")
    user = django_user_model.objects.create_user(username="half", is_staff=is_staff)
    if not is_staff:
        user.user_permissions.add(
            Permission.objects.get(
                content_type__app_label="approvals", codename="answer_any_approval"
            )
        )
    client = Client()
    client.force_login(user)

    assert "Refund order 999" not in text_of(client.get("/approvals/"))
    assert client.get(detail_url("other-desk", "refund-999")).status_code == 404


@pytest.mark.django_db
def test_somebody_elses_unknown_and_forged_ids_get_the_same_404(owner_client, desk, stranger_desk):
    ask(desk, "refund-881", "refund order 881")
    ask(stranger_desk, "refund-999", "refund order 999")
    before = snapshot()

    paths = {
        "somebody else's": detail_url("other-desk", "refund-999"),
        "unknown request": detail_url("desk", "refund-404"),
        "unknown inbox": detail_url("no-such-desk", "refund-881"),
        # Forged: the owner's inbox with another inbox's request id, and the other way round.
        "forged, own inbox": detail_url("desk", "refund-999"),
        "forged, other inbox": detail_url("other-desk", "refund-881"),
        "forged, junk": detail_url("desk", "refund-881%27%20OR%201=1--"),
        "forged, long": detail_url("desk", "x" * 500),
    }
    responses = {name: owner_client.get(path) for name, path in paths.items()}
    posted = {name: owner_client.post(path, {"answer": "yes"}) for name, path in paths.items()}

    reference = responses["somebody else's"]
    assert reference.status_code == 404
    for name, response in [*responses.items(), *posted.items()]:
        assert (name, response.status_code) == (name, 404)
        assert (name, response.content) == (name, reference.content)
        assert response.get("Content-Type") == reference.get("Content-Type")
    assert snapshot() == before


# --- GET is safe, CSRF ---------------------------------------------------------------------


@pytest.mark.django_db
def test_get_never_changes_anything(owner_client, desk, stranger_desk):
    ask(desk, "refund-881", "refund order 881")
    expire(ask(desk, "refund-882", "refund order 882"))  # expired, its timer not yet run
    ask(stranger_desk, "refund-999", "refund order 999")
    before = snapshot()

    for path in [
        "/",
        "/approvals/",
        detail_url("desk", "refund-881"),
        detail_url("desk", "refund-882"),
        detail_url("desk", "refund-881") + "?answer=yes",
        detail_url("other-desk", "refund-999"),
        "/inbox/desk/",
        "/inbox/desk/?text=refund+order+881&message_id=5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11",
    ]:
        response = owner_client.get(path)
        assert response.status_code in (200, 404), path
        response = owner_client.head(path)
        assert response.status_code in (200, 404), path

    assert snapshot() == before
    assert Event.objects.count() == 0
    assert set(Approval.objects.values_list("answer", flat=True)) == {""}


@pytest.mark.django_db
def test_a_post_without_the_csrf_token_is_refused(owner, desk):
    ask(desk)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    before = snapshot()

    answer = client.post(detail_url("desk", "refund-881"), {"answer": "yes"})
    chat = client.post(
        "/inbox/desk/",
        {"message_id": "5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11", "text": "refund order 881"},
    )

    assert answer.status_code == 403
    assert chat.status_code == 403
    assert snapshot() == before


@pytest.mark.django_db
def test_a_post_with_the_pages_csrf_token_is_accepted(owner, desk):
    ask(desk)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    page = client.get(detail_url("desk", "refund-881"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', text_of(page)).group(1)

    response = client.post(
        detail_url("desk", "refund-881"),
        {"answer": "yes", "csrfmiddlewaretoken": token},
        follow=True,
    )

    assert response.status_code == 200
    assert "Approved." in text_of(response)


@pytest.mark.django_db
def test_other_methods_are_not_allowed(owner_client, desk):
    ask(desk)
    assert owner_client.put(detail_url("desk", "refund-881")).status_code == 405
    assert owner_client.delete("/inbox/desk/").status_code == 405


# --- answering -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_waiting_page_has_both_buttons_and_the_time_left(owner_client, desk):
    ask(desk)

    response = owner_client.get(detail_url("desk", "refund-881"))

    html = text_of(response)
    assert response.status_code == 200
    assert "Refund order 881?" in html
    for button in BUTTONS:
        assert button in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert "3 h 59 min</strong> left to answer" in html
    assert "The agent of" in html and "refund-881" in html  # who asks, which request
    assert not EXPIRED_WORDS.search(html)


@pytest.mark.django_db
@pytest.mark.parametrize(("answer", "words"), [("yes", "Approved."), ("no", "Denied.")])
def test_an_answer_is_stored_and_the_page_says_the_outcome(owner_client, desk, answer, words):
    approval = ask(desk)

    response = owner_client.post(detail_url("desk", "refund-881"), {"answer": answer})
    assert response.status_code == 302
    assert response["Location"] == detail_url("desk", "refund-881")
    page = owner_client.get(response["Location"])

    html = text_of(page)
    assert f'<p class="outcome" role="status">{words}</p>' in html
    assert '<li class="success">Your answer was recorded.</li>' in html  # the one-time message
    for button in BUTTONS:
        assert button not in html
    approval.refresh_from_db()
    assert approval.answer == answer
    event = Event.objects.get(inbox=desk, source="approval", source_id="refund-881")
    assert event.payload["answer"] == answer
    # The message is shown once; the outcome stays.
    again = text_of(owner_client.get(detail_url("desk", "refund-881")))
    assert "Your answer was recorded." not in again
    assert words in again


@pytest.mark.django_db
def test_a_second_answer_shows_the_first(owner_client, desk):
    approval = ask(desk)
    owner_client.post(detail_url("desk", "refund-881"), {"answer": "yes"})

    response = owner_client.post(detail_url("desk", "refund-881"), {"answer": "no"}, follow=True)

    html = text_of(response)
    assert "Approved." in html
    assert "Denied." not in html
    assert "already settled; the first outcome stands" in html
    approval.refresh_from_db()
    assert approval.answer == "yes"
    assert Event.objects.filter(source="approval").count() == 1


@pytest.mark.django_db
def test_after_the_deadline_the_page_says_expired_and_has_no_buttons(owner_client, desk):
    approval = expire(ask(desk))
    hhmm = f"{approval.expires_at:%H:%M}"

    page = owner_client.get(detail_url("desk", "refund-881"))

    html = text_of(page)
    assert page.status_code == 200
    assert f"This request expired at {hhmm} UTC; nothing was done." in html
    for button in BUTTONS:
        assert button not in html
    assert '<form method="post" class="answer"' not in html
    assert not Event.objects.exists()  # the GET stored nothing; the expiry is the timer's

    answered = owner_client.post(detail_url("desk", "refund-881"), {"answer": "yes"}, follow=True)

    assert answered.status_code == 200
    assert f"This request expired at {hhmm} UTC; nothing was done." in text_of(answered)
    approval.refresh_from_db()
    assert approval.answer == "expired"
    assert Event.objects.get(source="approval").payload["answer"] == "expired"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [{"answer": "maybe"}, {"answer": "expired"}, {"answer": ""}, {}, {"answer": "YES"}],
    ids=["maybe", "expired", "empty", "missing", "upper-case"],
)
def test_a_bad_answer_is_400_and_stores_nothing(owner_client, desk, data):
    ask(desk)
    before = snapshot()

    response = owner_client.post(detail_url("desk", "refund-881"), data)

    assert response.status_code == 400
    assert snapshot() == before


# --- the list page ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_list_shows_waiting_with_time_left_and_answered_with_their_outcome(owner_client, desk):
    now = clock.database_now()
    ask(desk, "refund-881", "refund order 881")
    soon = ask(desk, "refund-882", "refund order 882")
    Approval.objects.filter(pk=soon.pk).update(
        expires_at=clock.whole_seconds(now + timedelta(hours=2, minutes=30, seconds=30))
    )
    ask(desk, "refund-883", "refund order 883")
    owner_client.post(detail_url("desk", "refund-883"), {"answer": "yes"})
    ask(desk, "refund-884", "refund order 884")
    owner_client.post(detail_url("desk", "refund-884"), {"answer": "no"})
    expired = expire(ask(desk, "refund-885", "refund order 885"))

    html = text_of(owner_client.get("/approvals/"))
    waiting = section(html, "Waiting for an answer")
    settled = section(html, "Recently answered")

    assert "Refund order 881" in waiting
    assert "Refund order 882" in waiting
    assert "3 h 59 min left" in waiting
    assert "2 h 30 min left" in waiting
    # Soonest deadline first.
    assert waiting.index("Refund order 882") < waiting.index("Refund order 881")
    assert f'href="{detail_url("desk", "refund-881")}"' in waiting
    for answered in ("883", "884", "885"):
        assert f"Refund order {answered}" not in waiting
        assert f"Refund order {answered}" in settled
    assert "Refund order 881" not in settled
    items = {
        order: re.search(rf"Refund order {order}</a>\s*<p class=\"meta\">([^<]*)</p>", settled)
        .group(1)
        .split("·")[-1]
        .strip()
        for order in ("883", "884", "885")
    }
    assert items == {
        "883": "Approved.",
        "884": "Denied.",
        "885": f"This request expired at {expired.expires_at:%H:%M} UTC; nothing was done.",
    }


@pytest.mark.django_db
def test_the_list_with_nothing_to_show(owner_client, desk):
    html = text_of(owner_client.get("/approvals/"))
    assert "Nothing is waiting for you." in html
    assert "No answers yet." in html


# --- the inbox page --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_chat_message_is_one_event_under_the_forms_message_id(owner_client, owner, desk):
    page = owner_client.get("/inbox/desk/")
    assert page.status_code == 200
    message_id = message_id_of(page)
    assert 'aria-label="Message your agent"' in text_of(page)
    assert '<label for="id_text">Message to your agent</label>' in text_of(page)

    sent = owner_client.post(
        "/inbox/desk/", {"message_id": message_id, "text": "refund order 881"}, follow=True
    )

    assert sent.status_code == 200
    assert sent.redirect_chain == [("/inbox/desk/", 302)]
    assert "Sent." in text_of(sent)
    event = Event.objects.get()
    assert (event.inbox_id, event.source, event.source_id) == (desk.pk, "chat", message_id)
    assert event.payload == {"text": "refund order 881", "from": "owner"}
    assert event.status == "pending"
    # A fresh form: the next message gets a new id.
    assert message_id_of(sent) != message_id


@pytest.mark.django_db
def test_a_resend_of_the_same_form_is_still_one_event(owner_client, desk):
    message_id = message_id_of(owner_client.get("/inbox/desk/"))
    data = {"message_id": message_id, "text": "refund order 881"}
    assert "Sent." in text_of(owner_client.post("/inbox/desk/", data, follow=True))

    resent = owner_client.post("/inbox/desk/", data, follow=True)

    assert resent.status_code == 200
    assert "Already received." in text_of(resent)
    assert "Sent." not in text_of(resent)
    assert Event.objects.filter(source="chat").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [
        {"text": ""},
        {"text": "   \n "},
        {},
        {"text": "x" * 2001},
        {"text": "refund order 881", "message_id": "not-a-uuid"},
        {"text": "refund order 881", "message_id": ""},
    ],
    ids=["empty", "blank", "missing", "too-long", "forged-id", "no-id"],
)
def test_a_bad_chat_message_is_400_and_stores_nothing(owner_client, desk, data):
    data = {"message_id": "5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11", **data}
    before = snapshot()

    response = owner_client.post("/inbox/desk/", data)

    assert response.status_code == 400
    assert 'role="alert"' in text_of(response)
    assert snapshot() == before


@pytest.mark.django_db
def test_another_users_inbox_page_is_404_like_an_unknown_one(owner_client, desk, stranger_desk):
    before = snapshot()
    data = {"message_id": "5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11", "text": "refund order 1"}

    theirs = owner_client.get("/inbox/other-desk/")
    unknown = owner_client.get("/inbox/no-such-desk/")
    posted = owner_client.post("/inbox/other-desk/", data)

    assert theirs.status_code == unknown.status_code == posted.status_code == 404
    assert theirs.content == unknown.content == posted.content
    assert snapshot() == before


@pytest.mark.django_db
def test_home_lists_only_ones_own_inboxes(owner_client, desk, stranger_desk):
    html = text_of(owner_client.get("/"))
    assert 'href="/inbox/desk/"' in html
    assert "other-desk" not in html


@pytest.mark.django_db
def test_the_conversation_shows_both_sides_in_order_in_the_persons_words(
    owner_client, desk, stranger_desk
):
    now = clock.database_now()
    ingest(desk, "chat", "m-1", {"text": "refund order 881"}, now=now)
    OutboxMessage.objects.create(
        inbox=desk, body="first answer", created=now + timedelta(minutes=1)
    )
    ingest(desk, "chat", "m-2", {"text": "thanks"}, now=now + timedelta(minutes=2))
    OutboxMessage.objects.create(
        inbox=desk,
        body="second answer",
        created=now + timedelta(minutes=3),
        status=OutboxMessage.Status.SENT,
    )
    OutboxMessage.objects.create(inbox=stranger_desk, body="not yours", created=now)
    Event.objects.filter(source_id="m-1").update(status=Event.Status.DONE)

    html = text_of(owner_client.get("/inbox/desk/"))

    shown = ("refund order 881", "first answer", "thanks", "second answer")
    positions = [html.index(text) for text in shown]
    assert positions == sorted(positions)
    assert "not yours" not in html
    for words in ("answered", "received", "waiting to be sent", "sent"):
        assert f'<span class="state">{words}</span>' in html
    assert "Held" not in html and "urgent" not in html


@pytest.mark.django_db
def test_the_refund_desks_approval_message_carries_the_absolute_link(owner_client, desk, settings):
    settings.ALWAYSON_SITE_URL = "https://desk.example.com/"
    message_id = message_id_of(owner_client.get("/inbox/desk/"))
    owner_client.post("/inbox/desk/", {"message_id": message_id, "text": "refund order 881"})

    result = Worker(worker_id="views-test", agent=refund_desk.agent).step()

    assert result is not None and result.outcome != "fenced"
    link = "https://desk.example.com" + detail_url("desk", "refund-881")
    message = OutboxMessage.objects.get(inbox=desk)
    assert link in message.body
    assert message.body == f"Refund order 881? Approve or deny within 4 hours: {link}"
    page = text_of(owner_client.get("/inbox/desk/"))
    assert f'href="{link}"' in page  # urlized, so it can be tapped
    # The link's path is the approval page, and it works for the owner.
    approval = owner_client.get(detail_url("desk", "refund-881"))
    assert approval.status_code == 200
    assert "Refund order 881?" in text_of(approval)


@pytest.mark.django_db
def test_the_default_site_url_makes_the_link(desk):
    from approvals.models import approval_url

    assert approval_url("desk", "refund-881") == (
        settings.ALWAYSON_SITE_URL.rstrip("/") + "/approvals/desk/refund-881/"
    )


@pytest.mark.django_db
def test_the_approval_card_comes_after_the_message_that_announces_it(owner_client, desk):
    message_id = message_id_of(owner_client.get("/inbox/desk/"))
    owner_client.post("/inbox/desk/", {"message_id": message_id, "text": "refund order 881"})
    Worker(worker_id="views-test", agent=refund_desk.agent).step()
    message = OutboxMessage.objects.get(inbox=desk)
    assert message.created == Approval.objects.get(inbox=desk).requested_at  # one finish

    html = text_of(owner_client.get("/inbox/desk/"))

    sent = html.index("refund order 881")
    announced = html.index("Approve or deny within 4 hours")
    card = html.index('aria-label="Approval request"')
    assert sent < announced < card


@pytest.mark.django_db
def test_the_approval_email_subject_ends_before_the_link(owner_client, desk, mailoutbox):
    desk.owner.email = "owner@example.com"
    desk.owner.save()
    message_id = message_id_of(owner_client.get("/inbox/desk/"))
    owner_client.post("/inbox/desk/", {"message_id": message_id, "text": "refund order 881"})
    Worker(worker_id="views-test", agent=refund_desk.agent).step()

    assert dispatch() == 1

    [email] = mailoutbox
    assert email.subject == "[desk] Refund order 881? Approve or deny within 4 hours"
    assert detail_url("desk", "refund-881") in email.body


@pytest.mark.django_db
def test_an_expired_request_reads_expired_unanswered_on_every_page(owner_client, desk):
    approval = expire(ask(desk))
    owner_client.post(detail_url("desk", "refund-881"), {"answer": "yes"})  # too late
    approval.refresh_from_db()
    assert (approval.answer, approval.answered_at is not None) == ("expired", True)
    words = f"Expired at {approval.expires_at:%H:%M} UTC, unanswered"

    conversation = text_of(owner_client.get("/inbox/desk/"))
    listed = section(text_of(owner_client.get("/approvals/")), "Recently answered")
    detail = text_of(owner_client.get(detail_url("desk", "refund-881")))

    for page in (conversation, listed, detail):
        assert "Nobody" not in page
        assert "Answered by" not in page
    assert f'<p class="meta answered-by">{words}</p>' in conversation
    assert f'<p class="meta answered-by">{words}</p>' in listed
    assert f"This request expired at {approval.expires_at:%H:%M} UTC; nothing was done." in detail


@pytest.mark.django_db
def test_an_answered_request_still_names_who_answered(owner_client, owner, desk):
    ask(desk)
    owner_client.post(detail_url("desk", "refund-881"), {"answer": "no"})
    name = owner.get_username()

    conversation = text_of(owner_client.get("/inbox/desk/"))
    detail = text_of(owner_client.get(detail_url("desk", "refund-881")))

    assert f'<p class="meta answered-by">Answered by {name}</p>' in conversation
    assert f'<dt>Answered by</dt><dd class="answered-by">{name}</dd>' in detail


@pytest.mark.django_db
def test_what_one_run_says_and_asks_shows_in_the_order_it_was_said(owner_client, desk):
    now = clock.database_now()
    for body in ("first, the news", "then the question"):
        OutboxMessage.objects.create(inbox=desk, body=body, created=now)
    for request_id in ("refund-881", "refund-882"):
        request_approval(desk, request_id, f"refund order {request_id[-3:]}", WINDOW, now=now)

    html = text_of(owner_client.get("/inbox/desk/"))

    shown = ("first, the news", "then the question", "Refund order 881", "Refund order 882")
    positions = [html.index(text) for text in shown]
    assert positions == sorted(positions)


# --- the icon --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_favicon_ico_is_the_pages_icon_not_a_404(client):
    # A browser asks /favicon.ico of a response that names no icon (/healthz's JSON).
    answer = client.get("/favicon.ico")

    assert answer.status_code == 302  # not permanent: the icon's collected name may change
    assert answer["Location"] == f"{settings.STATIC_URL}alwayson/favicon.svg"
    assert finders.find("alwayson/favicon.svg")
    assert client.get("/accounts/login/").content.count(b'rel="icon"') == 1
