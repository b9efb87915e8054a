"""What did my agent do? (issue 26 §2): the run list with its filters, one run's timeline,
and the links to it from the conversation and from a dead event's admin page.

Records are built directly where a test is about the list; the timeline of a Claude run is
the real agent's, against the scripted model, on a pinned clock.
"""

import re
import types
from datetime import date, timedelta
from html import unescape
from urllib.parse import parse_qsl

import pytest
from django import forms
from django.contrib.auth.models import Permission
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from alwayson.claude.models import ModelCall
from alwayson.egress.models import EgressCall
from alwayson.runtime.worker import Worker
from alwayson.testing.clock import Clock
from alwayson.testing.model import message, tool_use, usage
from alwayson.web.templatetags.runs import took
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import clock
from inbox.models import Event, Inbox, Membership, Role, RunRecord
from inbox.services import ingest
from outbox.models import OutboxMessage
from tests.support.runs import finish_run, start_run
from tests.support.wording import field_error, in_html, limit_error

pytestmark = pytest.mark.django_db

POLICY = {
    "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}],
    "lookup_order": "allow",
    "delete_account": "deny",
}


# --- helpers ---------------------------------------------------------------------------------


def client_of(user):
    client = Client()
    client.force_login(user)
    return client


def html_of(response):
    return response.content.decode()


def record(inbox, generation, started, took=timedelta(seconds=2), **fields):
    fields.setdefault("outcome", RunRecord.Outcome.DONE)
    fields.setdefault("worker", "w1")
    return RunRecord.objects.create(
        inbox=inbox, generation=generation, started=started, ended=started + took, **fields
    )


def model_call(inbox, generation, at, tokens=100, **fields):
    fields.setdefault("response", {"content": [{"type": "text", "text": "Hi."}]})
    return ModelCall.objects.create(
        inbox=inbox,
        generation=generation,
        request_key=f"{generation}-{at.timestamp()}-{ModelCall.objects.count()}",
        model="claude-test",
        input_tokens=tokens,
        created=at,
        **fields,
    )


def listed(response):
    """(inbox slug, generation) of each row of the run list, in order."""
    return [
        (slug, int(gen))
        for slug, gen in re.findall(r'href="/runs/([\w-]+)/(\d+)/"', html_of(response))
    ]


@pytest.fixture
def now():
    return clock.whole_seconds(clock.database_now())


# --- who sees what ---------------------------------------------------------------------------


def test_both_pages_need_a_login(client, desk, now):
    record(desk, 1, now)
    for path in ("/runs/", "/runs/desk/1/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"] == f"/accounts/login/?next={path}"


def test_a_run_of_an_inbox_without_a_role_is_the_same_404_as_a_missing_inbox(
    owner, desk, stranger_desk, now
):
    record(stranger_desk, 1, now)
    client = client_of(owner)

    theirs = client.get("/runs/other-desk/1/")
    missing = client.get("/runs/no-such-desk/1/")
    inbox_page = client.get("/inbox/other-desk/")

    assert theirs.status_code == missing.status_code == inbox_page.status_code == 404
    assert theirs.content == missing.content == inbox_page.content


def test_an_unrecorded_run_of_ones_own_inbox_is_404(owner, desk, now):
    record(desk, 1, now)
    assert client_of(owner).get("/runs/desk/2/").status_code == 404


def test_a_viewer_sees_the_runs_and_the_timeline_of_their_inbox_only(
    desk, stranger_desk, django_user_model, now
):
    viewer = django_user_model.objects.create_user(username="vera")
    Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)
    record(desk, 1, now)
    record(stranger_desk, 1, now + timedelta(seconds=1))
    client = client_of(viewer)

    assert listed(client.get("/runs/")) == [("desk", 1)]
    assert client.get("/runs/desk/1/").status_code == 200
    assert client.get("/runs/other-desk/1/").status_code == 404


def test_an_operator_follows_an_admin_link_to_any_inbox_s_run(
    stranger_desk, django_user_model, now
):
    operator = django_user_model.objects.create_user(username="op", is_staff=True)
    record(stranger_desk, 1, now)
    client = client_of(operator)
    assert client.get("/runs/other-desk/1/").status_code == 404

    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_runrecord", "view_event"])
    )
    assert client.get("/runs/other-desk/1/").status_code == 200


# --- the list and its filters ----------------------------------------------------------------


def test_the_list_shows_each_run_newest_first_with_what_it_did(owner, desk, now):
    record(desk, 1, now, events=[1, 2], produced={"said": 2, "asked": 1, "scheduled": 0})
    record(desk, 2, now + timedelta(minutes=1), took=timedelta(seconds=75), outcome="error")
    model_call(desk, 1, now, tokens=300, output_tokens=20, cache_read_tokens=5)

    response = client_of(owner).get("/runs/")

    assert response.status_code == 200
    assert listed(response) == [("desk", 2), ("desk", 1)]
    html = html_of(response)
    second, first = html.split('<tr class="outcome-')[1:]
    assert '<td data-label="Took">1 min 15 s</td>' in second
    assert '<span class="badge error">Error</span>' in second
    assert '<td data-label="Events">2</td>' in first
    assert "2 · 1 · 0" in first
    assert '<td data-label="Tokens">325</td>' in first


def test_filters_by_inbox_outcome_and_day(owner, desk, make_inbox, now):
    other = make_inbox("other", owner=owner)
    yesterday = now - timedelta(days=1)
    record(desk, 1, yesterday, outcome="error")
    record(desk, 2, now, outcome="done")
    record(other, 1, now, outcome="error")
    client = client_of(owner)

    assert listed(client.get("/runs/", {"inbox": "other"})) == [("other", 1)]
    assert set(listed(client.get("/runs/", {"outcome": "error"}))) == {("desk", 1), ("other", 1)}
    day = yesterday.date().isoformat()
    assert listed(client.get("/runs/", {"day": day})) == [("desk", 1)]
    assert listed(client.get("/runs/", {"inbox": "desk", "since": now.date().isoformat()})) == [
        ("desk", 2)
    ]
    assert listed(client.get("/runs/", {"until": day})) == [("desk", 1)]


def test_filters_by_how_long_a_run_took_and_how_many_tokens_it_cost(owner, desk, now):
    record(desk, 1, now, took=timedelta(seconds=3))
    record(desk, 2, now + timedelta(seconds=1), took=timedelta(seconds=30))
    record(desk, 3, now + timedelta(seconds=2), took=timedelta(seconds=1))
    model_call(desk, 1, now, tokens=400)
    model_call(desk, 1, now, tokens=700)
    model_call(desk, 3, now, tokens=900)
    client = client_of(owner)

    assert listed(client.get("/runs/", {"longer_than": "2.5"})) == [("desk", 2), ("desk", 1)]
    assert listed(client.get("/runs/", {"longer_than": "3"})) == [("desk", 2)]
    # Run 1 cost 1100 tokens over two calls; run 2 none.
    assert listed(client.get("/runs/", {"tokens_over": "1000"})) == [("desk", 1)]
    assert listed(client.get("/runs/", {"tokens_over": "0"})) == [("desk", 3), ("desk", 1)]


@pytest.mark.parametrize(
    "query, reason",
    [
        # Django's reasons, with the limits alwayson set.
        (
            {"inbox": "other-desk"},
            field_error(forms.ModelChoiceField(Inbox.objects.none()), "invalid_choice"),
        ),
        (
            {"outcome": "exploded"},
            field_error(forms.ChoiceField(), "invalid_choice", value="exploded"),
        ),
        ({"day": "2026-13-45"}, field_error(forms.DateField(), "invalid")),
        ({"until": "9999-12-31"}, limit_error(MaxValueValidator(date(9998, 12, 31)))),
        ({"longer_than": "-1"}, limit_error(MinValueValidator(0))),
        ({"longer_than": "soon"}, field_error(forms.DecimalField(), "invalid")),
        ({"tokens_over": "1e999"}, field_error(forms.IntegerField(), "invalid")),
        # alwayson's own.
        ({"since": "2026-12-02", "until": "2026-12-01"}, "is after"),
        ({"before": "yesterday~x"}, "Not a page of this list."),
        ({"before": "2026-12-02T10:00:00~5"}, "Not a page of this list."),
    ],
)
def test_a_filter_that_cannot_be_read_is_a_400_that_says_why(
    owner, desk, stranger_desk, now, query, reason
):
    record(desk, 1, now)
    response = client_of(owner).get("/runs/", query)
    assert response.status_code == 400
    assert in_html(reason) in html_of(response)
    assert listed(response) == []


def test_older_runs_are_on_the_next_page_with_the_filters_kept(owner, desk, now, monkeypatch):
    monkeypatch.setattr("alwayson.web.runs.PAGE", 2)
    for generation in range(1, 6):
        record(desk, generation, now + timedelta(seconds=generation // 2), outcome="done")
    client = client_of(owner)

    seen, query = [], {"outcome": "done"}
    while True:
        response = client.get("/runs/", query)
        seen += listed(response)
        more = re.search(r'href="\?([^"]+)" rel="next"', html_of(response))
        if not more:
            break
        query = dict(parse_qsl(unescape(more.group(1))))
        assert query["outcome"] == "done"

    # Two records share a start: the id breaks the tie, nothing is shown twice or skipped.
    assert seen == [("desk", g) for g in (5, 4, 3, 2, 1)]


def test_the_list_costs_the_same_queries_for_one_run_or_many(owner, desk, make_inbox, now):
    other = make_inbox("other", owner=owner)
    client = client_of(owner)

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/runs/").status_code == 200
        return len(captured)

    record(desk, 1, now)
    model_call(desk, 1, now)
    one = queries()
    for generation in range(2, 30):
        inbox = desk if generation % 2 else other
        record(inbox, generation, now + timedelta(seconds=generation))
        model_call(inbox, generation, now)
    assert queries() == one


# --- the timeline ----------------------------------------------------------------------------


@pytest.fixture
def pinned():
    moment = Clock().start()
    yield moment
    moment.stop()


@pytest.fixture
def support(messages_api, claude_inbox, owner, django_user_model, pinned):
    inbox = claude_inbox(policy=POLICY)
    inbox.owner = owner
    inbox.save()
    dana = django_user_model.objects.create_user(username="dana", first_name="Dana")
    Membership.objects.create(inbox=inbox, user=dana, role=Role.APPROVER)
    return types.SimpleNamespace(inbox=inbox, api=messages_api, dana=dana, clock=pinned)


def step_worker():
    return Worker("w1").step()


def steps_of(html):
    """The timeline's steps: (kind, text) in the page's order."""
    found = re.findall(r'<li class="step (\w+)">(.*?)</li>', html, re.S)
    return [
        (kind, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)).strip()) for kind, body in found
    ]


def test_a_claude_runs_timeline_shows_its_model_and_tool_calls_in_order_with_decisions(
    owner, support
):
    assert ingest(
        support.inbox, "chat", "m1", {"text": "refund 20 on 7, delete 42", "from": "owner"}
    )
    support.api.reply(
        message(
            "Refunding, and not deleting.",
            tool_use("refund", {"order": "7", "amount": 20}),
            tool_use("delete_account", {"account": "42"}),
            tokens=usage(120, 30, cache_read=40),
        ),
        message(tool_use("send_message", {"text": "Refunded 20 on order 7."})),
        message("Done."),
    )
    assert step_worker().outcome == "said 1"

    response = client_of(owner).get("/runs/support/1/")

    assert response.status_code == 200
    steps = steps_of(html_of(response))
    assert [kind for kind, _ in steps] == [
        "event",
        "start",
        "model",
        "tool",
        "tool",
        "model",
        "model",
        "message",
        "end",
    ]
    event, _, first, refund, delete, _, _, said, end = (text for _, text in steps)
    assert "chat" in event and "refund 20 on 7, delete 42" in event
    assert "120 in · 30 out · 40 cache read" in first
    assert "asked for refund, delete_account" in first
    assert "Refunding, and not deleting." in first
    assert "refund allow" in refund
    assert "Why: policy for refund, rule 1: allow" in refund
    assert "&quot;amount&quot;: 20" in refund
    assert "delete_account deny" in delete
    assert "Why: policy for delete_account: deny" in delete
    assert "The model was told it failed" in delete
    assert "Refunded 20 on order 7." in said and "held" in said
    assert "Done" in end


def test_an_asked_call_shows_who_approved_it_in_the_run_that_resumed_it(owner, support):
    assert ingest(support.inbox, "chat", "m1", {"text": "refund 120 on 881", "from": "owner"})
    support.api.reply(message(tool_use("refund", {"order": "881", "amount": 120})))
    assert step_worker().outcome.startswith("asked")
    [approval] = Approval.objects.all()
    support.clock.jump(minutes=5)
    answer_approval(support.inbox, approval.request_id, "yes", by=support.dana)
    support.api.reply(message("Refunded."))
    step_worker()
    client = client_of(owner)

    asking = steps_of(html_of(client.get("/runs/support/1/")))
    assert [kind for kind, _ in asking] == ["event", "start", "model", "approval", "message", "end"]
    assert "Asked for approval: Refund" in asking[3][1]

    resumed = steps_of(html_of(client.get("/runs/support/2/")))
    assert [kind for kind, _ in resumed] == ["event", "start", "tool", "model", "end"]
    assert "approval" in resumed[0][1]
    tool = resumed[2][1]
    assert "refund ask" in tool and "Why: policy for refund, rule 2: ask" in tool
    assert "Answered by Dana" in tool


def test_a_long_body_is_cut_with_the_whole_in_details_and_every_text_escaped(owner, desk, now):
    body = "<script>alert(1)</script> " + "word " * 100
    gen = 1
    ingest(desk, "crm", "t-1", {"note": "<b>bold</b>"})
    record(desk, gen, now, events=list(Event.objects.values_list("pk", flat=True)))
    OutboxMessage.objects.create(inbox=desk, body=body, created=now, generation=gen)

    html = html_of(client_of(owner).get("/runs/desk/1/"))

    assert "<script>alert(1)</script>" not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    [details] = re.findall(r'<details class="long">(.*?)</details>', html, re.S)
    summary, whole = re.fullmatch(
        r"\s*<summary>(.*)</summary>\s*<pre>(.*)</pre>\s*", details, re.S
    ).groups()
    assert whole.count("word") == 100
    assert 0 < summary.count("word") < 40 and "(show all)" in summary


def test_a_failed_runs_timeline_says_how_it_ended_with_its_error_worker_and_trace(owner, desk, now):
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    error = "Traceback (most recent call last):\n  File agent.py\nKeyError: 'order'"
    record(desk, 3, now, outcome="error", error=error, worker="host-a:412", trace=trace)

    html = html_of(client_of(owner).get("/runs/desk/3/"))

    assert "<dt>Worker</dt><dd>host-a:412</dd>" in html
    assert "<code>4bf92f3577b34da6a3ce929d0e0e4736</code>" in html
    assert (
        "<pre>Traceback (most recent call last):\n  File agent.py\n"
        "KeyError: &#x27;order&#x27;</pre>" in html
    )
    [end] = [text for kind, text in steps_of(html) if kind == "end"]
    assert "Run ended: Error" in end


def test_two_records_of_one_generation_are_both_shown(owner, desk, now):
    # claim_batch may claim and finish twice under one held lease.
    record(desk, 4, now, outcome="deferred")
    record(desk, 4, now + timedelta(seconds=10), outcome="done", error="")

    html = html_of(client_of(owner).get("/runs/desk/4/"))

    kinds = [kind for kind, _ in steps_of(html)]
    assert kinds == ["start", "end", "start", "end"]
    assert "ran 2 times" in html


def test_a_staff_viewer_gets_each_events_admin_link_and_others_do_not(
    owner, desk, django_user_model, now
):
    ingest(desk, "crm", "t-1", {"type": "opened"})
    event = Event.objects.get()
    record(desk, 1, now, events=[event.pk])
    link = f'href="/admin/inbox/event/{event.pk}/change/"'
    assert link not in html_of(client_of(owner).get("/runs/desk/1/"))

    operator = django_user_model.objects.create_user(username="op", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_event"))
    Membership.objects.create(inbox=desk, user=operator, role=Role.VIEWER)
    assert link in html_of(client_of(operator).get("/runs/desk/1/"))


def test_calls_out_while_the_run_held_the_lease_are_shown_and_others_are_not(owner, desk, now):
    record(desk, 1, now, took=timedelta(seconds=10))
    for at, path in (
        (now - timedelta(seconds=1), "/before"),
        (now + timedelta(seconds=4), "/v1/refunds"),
    ):
        EgressCall.objects.create(
            inbox=desk,
            service="payments",
            method="POST",
            path=path,
            outcome="sent",
            status=200,
            at=at,
        )

    steps = steps_of(html_of(client_of(owner).get("/runs/desk/1/")))

    assert [kind for kind, _ in steps] == ["start", "egress", "end"]
    assert "payments POST /v1/refunds sent 200" in steps[1][1]


def test_the_timeline_costs_the_same_queries_for_a_short_run_or_a_long_one(owner, desk, now):
    client = client_of(owner)

    def queries(generation):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/runs/desk/{generation}/").status_code == 200
        return len(captured)

    def run(generation, calls):
        ids = []
        for n in range(calls):
            ingest(desk, "crm", f"{generation}-{n}", {"n": n})
            ids.append(Event.objects.latest("id").pk)
            model_call(desk, generation, now)
            OutboxMessage.objects.create(
                inbox=desk, body=f"m{n}", created=now, generation=generation
            )
        record(desk, generation, now, events=ids)

    run(1, 1)
    run(2, 12)
    assert queries(2) == queries(1)


# --- links to a run --------------------------------------------------------------------------


def test_the_conversation_links_each_agent_message_to_the_run_that_said_it(owner, desk, now):
    OutboxMessage.objects.create(inbox=desk, body="Old, before runs.", created=now)
    OutboxMessage.objects.create(inbox=desk, body="Said by run 7.", created=now, generation=7)
    record(desk, 7, now)

    html = html_of(client_of(owner).get("/inbox/desk/"))

    old, new = re.findall(r'<li id="entry-agent-\d+" class="entry agent">(.*?)</li>', html, re.S)
    assert "why did it say this?" not in old
    assert 'href="/runs/desk/7/">why did it say this?</a>' in new


def test_the_dead_events_admin_page_links_to_the_run_it_died_in(admin_client, desk, settings):
    settings.ALWAYSON_MAX_ATTEMPTS = 1
    ingest(desk, "crm", "poison", {"type": "opened"})
    run = start_run(desk, "w1")
    assert finish_run(run, error="agent failed: KeyError 'order'")
    start_run(desk, "w1")  # the next take finds it out of attempts
    event = Event.objects.get()
    assert (event.status, event.claim_gen) == ("dead", run.generation)

    html = html_of(admin_client.get(f"/admin/inbox/event/{event.pk}/change/"))
    assert f'href="/runs/desk/{run.generation}/"' in html
    assert admin_client.get(f"/runs/desk/{run.generation}/").status_code == 200

    record_page = html_of(
        admin_client.get(f"/admin/inbox/runrecord/{RunRecord.objects.get().pk}/change/")
    )
    assert f'href="/runs/desk/{run.generation}/">what the run did' in record_page


def test_an_event_whose_run_left_no_record_has_no_run_link(admin_client, desk, settings):
    settings.ALWAYSON_RUN_RECORDS = False
    ingest(desk, "crm", "t-1", {})
    finish_run(start_run(desk, "w1"))
    event = Event.objects.get()
    assert event.claim_gen == 1
    assert "/runs/desk/" not in html_of(admin_client.get(f"/admin/inbox/event/{event.pk}/change/"))


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0.0004, "0 ms"),
        (0.85, "850 ms"),
        (12.44, "12.4 s"),
        (185, "3 min 05 s"),
        (7440, "2 h 04 min"),
    ],
)
def test_durations_read_as_people_say_them(seconds, shown):
    assert took(timedelta(seconds=seconds)) == shown
