"""The Slack and Telegram channels against loopback servers that speak their APIs
(chat.postMessage, sendMessage): the outbox's gap, merge, urgent, delivery-mode, retry and
idempotency rules hold as for email and webhooks, links render as links, and the bot token
is added by the egress gateway at send time and found nowhere else."""

import json
import logging

import pytest
from django.apps import apps

from alwayson.egress.channels import send_slack, send_telegram, slack_text, telegram_html
from alwayson.runtime.api import dispatch
from outbox.channels import senders
from outbox.models import Channel, OutboxMessage
from tests.support.clock import HOUR, MINUTE, SECOND
from tests.support.loopback import Loopback
from tests.support.outbox import channel_for, hold, statuses

pytestmark = pytest.mark.django_db

SLACK_TOKEN = "xoxb-PLANTED-31337"
TELEGRAM_TOKEN = "123456:PLANTED-telegram"
HELD, SENT, FAILED = "held", "sent", "failed"


class ChatApi:
    """Answers like Slack's chat.postMessage and Telegram's sendMessage: 200 with
    {"ok": true}, or the API's own refusal."""

    def __init__(self):
        self.refuse = None  # (status, body) while the API refuses

    def __call__(self, request):
        if self.refuse:
            status, body = self.refuse
            return status, {"Content-Type": "application/json"}, json.dumps(body).encode()
        result = {"ok": True, "ts": "1700000000.000100", "result": {"message_id": 7}}
        return 200, {"Content-Type": "application/json"}, json.dumps(result).encode()


@pytest.fixture
def api(settings, monkeypatch):
    monkeypatch.setenv("ALWAYSON_SLACK_BOT_TOKEN", SLACK_TOKEN)
    monkeypatch.setenv("ALWAYSON_TELEGRAM_BOT_TOKEN", TELEGRAM_TOKEN)
    answers = ChatApi()
    with Loopback(answers) as server:
        settings.ALWAYSON_SLACK_API_URL = server.url("/api")
        settings.ALWAYSON_TELEGRAM_API_URL = server.url()
        server.answers = answers
        yield server


def sent(server):
    return [json.loads(request["body"]) for request in server.requests]


@pytest.fixture
def slack(make_inbox, api):
    inbox = make_inbox("desk")
    channel_for(inbox, kind=Channel.Kind.SLACK, target="C0123ABC")
    return inbox


@pytest.fixture
def telegram(make_inbox, api):
    inbox = make_inbox("desk")
    channel_for(inbox, kind=Channel.Kind.TELEGRAM, target="-100200300")
    return inbox


def test_slack_posts_merged_messages_with_the_bot_token_and_the_send_key(slack, api, t0):
    hold(slack, "Refund order 881? https://desk.example/approvals/desk/refund-881/", t0)
    hold(slack, "Also <b>this</b> & that", t0 + SECOND, urgent=True)

    assert dispatch(now=t0 + SECOND) == 2

    [request] = api.requests
    assert request["path"] == "/api/chat.postMessage"
    assert request["headers"]["Authorization"] == f"Bearer {SLACK_TOKEN}"
    [body] = sent(api)
    assert body["channel"] == "C0123ABC"
    assert body["text"] == (
        "Refund order 881? <https://desk.example/approvals/desk/refund-881/>\n\n"
        "Also &lt;b&gt;this&lt;/b&gt; &amp; that"
    )
    assert body["metadata"]["event_payload"]["inbox"] == "desk"
    assert len(body["metadata"]["event_payload"]["idempotency_key"]) == 32
    assert statuses(slack) == [SENT, SENT]


def test_telegram_sends_html_with_links_and_the_token_in_the_path_only(telegram, api, t0):
    hold(telegram, "See https://desk.example/x?a=1&b=2 now <please>", t0, urgent=True)

    assert dispatch(now=t0) == 1

    [request] = api.requests
    assert request["path"] == f"/bot{TELEGRAM_TOKEN}/sendMessage"
    [body] = sent(api)
    assert body["chat_id"] == "-100200300"
    assert body["parse_mode"] == "HTML"
    assert body["text"] == (
        'See <a href="https://desk.example/x?a=1&amp;b=2">https://desk.example/x?a=1&amp;b=2</a>'
        " now &lt;please&gt;"
    )


@pytest.mark.parametrize("kind, target", [("slack", "C1"), ("telegram", "42")])
def test_chat_channels_keep_the_gap_and_let_urgent_messages_through(
    make_inbox, api, t0, kind, target
):
    inbox = make_inbox("desk")
    channel_for(inbox, kind=kind, target=target, gap=3600)
    hold(inbox, "first", t0)
    assert dispatch(now=t0) == 1
    hold(inbox, "held within the gap", t0 + MINUTE)
    assert dispatch(now=t0 + 2 * MINUTE) == 0  # the gap holds it
    hold(inbox, "urgent", t0 + 3 * MINUTE, urgent=True)
    assert dispatch(now=t0 + 3 * MINUTE) == 2  # urgent takes the held one along, in order
    assert len(api.requests) == 2
    last = sent(api)[-1]["text"]
    assert last.index("held within the gap") < last.index("urgent")


@pytest.mark.parametrize(
    "kind, refusal",
    [
        ("slack", (200, {"ok": False, "error": "channel_not_found"})),
        ("slack", (429, {"ok": False, "error": "ratelimited"})),
        ("telegram", (400, {"ok": False, "error_code": 400, "description": "chat not found"})),
    ],
)
def test_a_refusing_api_is_a_failed_send_retried_with_backoff(make_inbox, api, t0, kind, refusal):
    inbox = make_inbox("desk")
    channel = channel_for(inbox, kind=kind, target="C1")
    hold(inbox, "hello", t0, urgent=True)
    api.answers.refuse = refusal

    assert dispatch(now=t0) == 0

    channel.refresh_from_db()
    assert statuses(inbox) == [HELD]
    assert channel.failures == 1 and channel.retry_at > t0
    reason = refusal[1].get("error") or refusal[1]["description"]
    assert reason in channel.last_error
    assert TELEGRAM_TOKEN not in channel.last_error
    api.answers.refuse = None
    assert dispatch(now=channel.retry_at + SECOND) == 1
    assert statuses(inbox) == [SENT]


def test_at_most_once_chat_send_is_not_repeated_after_a_failure(slack, api, t0):
    Channel.objects.filter(inbox=slack).update(mode=Channel.Mode.AT_MOST_ONCE)
    hold(slack, "once at most", t0, urgent=True)
    api.answers.refuse = (500, {"ok": False, "error": "fatal_error"})

    assert dispatch(now=t0) == 0
    api.answers.refuse = None
    assert dispatch(now=t0 + HOUR) == 0

    assert statuses(slack) == [FAILED]
    assert len(api.requests) == 1


def test_a_missing_bot_token_fails_the_send_without_calling_the_api(slack, api, t0, monkeypatch):
    monkeypatch.delenv("ALWAYSON_SLACK_BOT_TOKEN")
    hold(slack, "hello", t0, urgent=True)

    assert dispatch(now=t0) == 0

    assert api.requests == []
    assert "no credential" in Channel.objects.get(inbox=slack).last_error


def test_bot_tokens_are_stored_and_logged_nowhere(make_inbox, api, t0, caplog):
    caplog.set_level(logging.DEBUG)
    for slug, kind in (("s", "slack"), ("t", "telegram")):
        inbox = make_inbox(slug)
        channel_for(inbox, kind=kind, target="C1")
        hold(inbox, "hello", t0, urgent=True)
    api.answers.refuse = (400, {"ok": False, "description": "bad"})
    dispatch(now=t0)
    api.answers.refuse = None
    dispatch(now=t0 + HOUR)

    texts = [record.getMessage() for record in caplog.records]
    for model in apps.get_models():
        texts += [repr(row) for row in model.objects.all().values()]
    for token in (SLACK_TOKEN, TELEGRAM_TOKEN):
        assert not [text for text in texts if token in text]


def test_chat_channels_need_a_target(make_inbox):
    from django.db import IntegrityError, transaction

    inbox = make_inbox("desk")
    with pytest.raises(IntegrityError), transaction.atomic():
        Channel.objects.create(inbox=inbox, kind=Channel.Kind.SLACK)


@pytest.mark.parametrize(
    "body, slack, telegram",
    [
        ("plain words", "plain words", "plain words"),
        (
            "link: https://a.example/p.",
            "link: <https://a.example/p>.",
            'link: <a href="https://a.example/p">https://a.example/p</a>.',
        ),
    ],
)
def test_links_render_as_links_and_the_rest_stays_plain_text(body, slack, telegram):
    assert slack_text(body) == slack
    assert telegram_html(body) == telegram


def test_the_egress_app_registers_the_chat_senders_into_the_outbox():
    assert senders["slack"] is send_slack
    assert senders["telegram"] is send_telegram


@pytest.mark.django_db
def test_a_channel_whose_sender_is_not_installed_is_a_failed_send_and_nothing_is_lost(
    make_inbox, t0, monkeypatch
):
    """Without the egress app nothing sends to Slack: the message stays held, its attempt
    counted, with the reason on the message and the channel."""
    inbox = make_inbox("desk")
    channel_for(inbox, kind=Channel.Kind.SLACK, target="C0123ABC")
    monkeypatch.delitem(senders, "slack")
    hold(inbox, "to a channel nobody sends to", t0)

    assert dispatch(now=t0) == 0

    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts) == (OutboxMessage.Status.HELD, 1)
    assert "no sender for slack channels is installed" in message.error
    assert Channel.objects.get(inbox=inbox).last_error == message.error
