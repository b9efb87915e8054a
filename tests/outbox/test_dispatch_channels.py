"""The outbox for real: urgent bypass, merge order, per-inbox gaps, failures with backoff and
parking, both delivery modes, the idempotency key, and the email and webhook channels against
real servers on 127.0.0.1 (aiosmtpd and http.server) started by the tests.

Time is always passed as `now=` (rundispatcher reads the database clock). Every wait on a
server, a thread or an event is bounded, and every server is stopped in teardown.
"""

import email
import email.policy
import json
import re
import socket
import threading
import time
from contextlib import suppress
from datetime import timedelta
from io import StringIO

import pytest
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from alwayson.runtime.api import Say, dispatch, dispatch_inbox
from inbox import clock
from outbox.channels import SendFailed
from outbox.models import Channel, OutboxMessage, send_key_for
from tests.support.clock import HOUR, MINUTE, SECOND
from tests.support.mail import use_email_backend
from tests.support.outbox import WebhookServer, channel_for, hold, statuses
from tests.support.processes import free_port, start_command, wait_for

HELD, SENT, FAILED = (
    OutboxMessage.Status.HELD,
    OutboxMessage.Status.SENT,
    OutboxMessage.Status.FAILED,
)
WAIT = 10  # seconds: the longest any server, thread or event wait in this file may take


class Recorder:
    """A send() that records every delivery: (inbox slug, merged body, key, message ids)."""

    def __init__(self, fail=None):
        self.sent = []
        self.fail = fail or set()  # slugs whose send raises SendFailed

    def __call__(self, delivery):
        self.sent.append(
            (
                delivery.inbox.slug,
                delivery.body,
                delivery.idempotency_key,
                [m.pk for m in delivery.messages],
            )
        )
        if delivery.inbox.slug in self.fail:
            raise SendFailed(f"{delivery.inbox.slug}: channel down")

    @property
    def bodies(self):
        return [(slug, body) for slug, body, _, _ in self.sent]


def rows(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox)
        .order_by("id")
        .values_list("body", "status", "sent_at", "attempts")
    )


def _call(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def expected_key(inbox, messages):
    return send_key_for(inbox.pk, messages)


@pytest.fixture
def owner_with_email(django_user_model):
    return django_user_model.objects.create_user(username="ada", email="ada@example.org")


@pytest.fixture
def locmem(settings):
    use_email_backend(settings, "django.core.mail.backends.locmem.EmailBackend")
    mail.outbox = []
    yield mail.outbox
    mail.outbox = []


@pytest.fixture
def fast_parking(settings):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 3
    return settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS


# --- a real HTTP server -----------------------------------------------------------------------


@pytest.fixture
def webhook(monkeypatch):
    # Straight to 127.0.0.1, whatever proxy the environment names.
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = WebhookServer().start()
    yield server
    server.stop()


@pytest.fixture
def webhook_inbox(make_inbox, webhook):
    inbox = make_inbox("hooked")
    channel_for(inbox, kind=Channel.Kind.WEBHOOK, url=webhook.url())
    return inbox


# --- a real SMTP server -----------------------------------------------------------------------


class SmtpRecorder:
    def __init__(self):
        self.envelopes = []
        self.arrived = threading.Event()

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(
            {
                "mail_from": envelope.mail_from,
                "rcpt_tos": list(envelope.rcpt_tos),
                "message": email.message_from_bytes(envelope.content, policy=email.policy.default),
            }
        )
        self.arrived.set()
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_server(settings):
    from aiosmtpd.controller import Controller

    handler = SmtpRecorder()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port(), ready_timeout=WAIT)
    controller.start()
    use_email_backend(
        settings,
        "django.core.mail.backends.smtp.EmailBackend",
        host="127.0.0.1",
        port=controller.port,
        username="",
        password="",
        use_tls=False,
        use_ssl=False,
        timeout=WAIT,
    )
    yield handler
    controller.stop()


# --- urgent, merge order, gap -----------------------------------------------------------------


@pytest.mark.django_db
def test_urgent_bypasses_the_gap_and_takes_held_messages_along_in_order(inbox, t0):
    send = Recorder()
    hold(inbox, "morning report", t0)
    assert dispatch(send, now=t0) == 1  # the gap starts
    hold(inbox, "minor 1", t0 + MINUTE)
    hold(inbox, "minor 2", t0 + 2 * MINUTE)
    assert dispatch(send, now=t0 + 2 * MINUTE) == 0  # inside the gap, held

    urgent = hold(inbox, "deploy failed", t0 + 3 * MINUTE, urgent=True)
    hold(inbox, "minor 3", t0 + 3 * MINUTE)

    assert dispatch(send, now=t0 + 3 * MINUTE) == 4
    assert send.bodies == [
        ("desk", "morning report"),
        ("desk", "minor 1\n\nminor 2\n\ndeploy failed\n\nminor 3"),
    ]
    assert statuses(inbox) == [SENT] * 5
    urgent.refresh_from_db()
    assert urgent.sent_at == t0 + 3 * MINUTE

    # An urgent send restarts the gap like any other: the next plain message waits.
    hold(inbox, "minor 4", t0 + 4 * MINUTE)
    assert dispatch(send, now=t0 + 4 * MINUTE) == 0
    assert dispatch(send, now=t0 + 3 * MINUTE + HOUR) == 1


@pytest.mark.django_db
def test_urgent_message_alone_goes_out_at_once(inbox, t0):
    send = Recorder()
    hold(inbox, "first", t0)
    dispatch(send, now=t0)
    hold(inbox, "on fire", t0 + SECOND, urgent=True)

    assert dispatch(send, now=t0 + SECOND) == 1

    assert send.bodies == [("desk", "first"), ("desk", "on fire")]


@pytest.mark.django_db
def test_held_messages_merge_in_the_order_they_were_queued(inbox, t0):
    # Queued by runs (Say effects); the created times even run backwards.
    for n in range(5):
        Say(inbox.pk, f"update {n}")(t0 - n * MINUTE)
    send = Recorder()

    assert dispatch(send, now=t0) == 5

    [(_, body, key, ids)] = send.sent
    assert body == "\n\n".join(f"update {n}" for n in range(5))
    assert ids == sorted(ids)
    assert ids == list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("pk", flat=True)
    )
    assert key == expected_key(inbox, OutboxMessage.objects.filter(inbox=inbox).order_by("id"))


@pytest.mark.django_db
def test_gap_is_per_inbox_and_overridable_on_the_channel(make_inbox, t0, settings):
    settings.ALWAYSON_OUTBOX_GAP = 600
    chatty, default = make_inbox("chatty"), make_inbox("default")
    channel_for(chatty, gap=60)
    send = Recorder()
    for inbox in (chatty, default):
        hold(inbox, f"{inbox.slug} 1", t0)
    assert dispatch(send, now=t0) == 2
    for inbox in (chatty, default):
        hold(inbox, f"{inbox.slug} 2", t0 + SECOND)

    assert dispatch(send, now=t0 + 59 * SECOND) == 0
    assert dispatch(send, now=t0 + 60 * SECOND) == 1  # chatty's 60 s gap is over
    assert dispatch(send, now=t0 + 599 * SECOND) == 0  # default's 600 s gap is not
    assert dispatch(send, now=t0 + 600 * SECOND) == 1

    assert send.bodies[2:] == [("chatty", "chatty 2"), ("default", "default 2")]
    assert Channel.objects.get(inbox=default).gap_seconds == 600


# --- at least once: failures, backoff, parking ------------------------------------------------


@pytest.mark.django_db
def test_at_least_once_failed_send_is_recorded_and_backs_off(inbox, t0):
    hold(inbox, "one", t0)
    hold(inbox, "two", t0)
    broken = Recorder(fail={"desk"})

    assert dispatch(broken, now=t0) == 0

    assert rows(inbox) == [("one", HELD, None, 1), ("two", HELD, None, 1)]
    assert set(OutboxMessage.objects.values_list("error", flat=True)) == {"desk: channel down"}
    channel = Channel.objects.get(inbox=inbox)
    assert channel.failures == 1
    assert channel.last_error == "desk: channel down"
    # retry_delay(1) with ALWAYSON_RETRY_BASE=10: between 5 and 10 seconds.
    assert t0 + 5 * SECOND <= channel.retry_at <= t0 + 10 * SECOND

    assert dispatch(broken, now=channel.retry_at - SECOND) == 0  # backing off: not even tried
    assert len(broken.sent) == 1

    working = Recorder()
    assert dispatch(working, now=channel.retry_at) == 2  # retried once retry_at has come
    assert working.bodies == [("desk", "one\n\ntwo")]
    assert [(body, status) for body, status, _, _ in rows(inbox)] == [("one", SENT), ("two", SENT)]
    assert set(OutboxMessage.objects.values_list("error", flat=True)) == {""}
    channel.refresh_from_db()
    assert (channel.failures, channel.retry_at, channel.last_error) == (0, None, "")


@pytest.mark.django_db
def test_backoff_grows_and_rows_are_parked_after_max_attempts(inbox, t0, fast_parking):
    first = hold(inbox, "one", t0)
    second = hold(inbox, "two", t0)
    broken = Recorder(fail={"desk"})
    now, delays = t0, []
    for attempt in range(1, fast_parking):
        assert dispatch(broken, now=now) == 0
        channel = Channel.objects.get(inbox=inbox)
        assert channel.failures == attempt
        assert statuses(inbox) == [HELD, HELD]
        delays.append(channel.retry_at - now)
        assert dispatch(broken, now=channel.retry_at - SECOND) == 0
        now = channel.retry_at
    assert len(broken.sent) == fast_parking - 1
    assert timedelta(seconds=5) <= delays[0] <= timedelta(seconds=10)
    assert timedelta(seconds=10) <= delays[1] <= timedelta(seconds=20)

    assert dispatch(broken, now=now) == 0  # the last attempt: parked

    assert rows(inbox) == [("one", FAILED, None, fast_parking), ("two", FAILED, None, fast_parking)]
    channel = Channel.objects.get(inbox=inbox)
    assert (channel.failures, channel.retry_at) == (0, None)
    assert dispatch(Recorder(), now=now + HOUR) == 0  # parked rows are not sent again

    out = _call("deadletters")
    assert "2 failed outbox message(s)" in out
    assert f"  {first.pk}\tdesk\t{fast_parking}\tdesk: channel down\t'one'" in out
    assert f"  {second.pk}\tdesk\t{fast_parking}\tdesk: channel down\t'two'" in out

    assert "resent 2 message(s)" in _call("deadletters", "--resend", str(first.pk), str(second.pk))
    assert rows(inbox) == [("one", HELD, None, 0), ("two", HELD, None, 0)]
    assert "0 failed outbox message(s)" in _call("deadletters")
    send = Recorder()
    assert dispatch(send, now=now + HOUR) == 2
    assert send.bodies == [("desk", "one\n\ntwo")]


@pytest.mark.django_db
def test_deadletters_resend_refuses_ids_that_are_not_failed(inbox, t0):
    held = hold(inbox, "still held", t0)
    with pytest.raises(CommandError, match=r"not failed outbox messages.*nothing changed"):
        _call("deadletters", "--resend", str(held.pk))
    assert statuses(inbox) == [HELD]


@pytest.mark.django_db
def test_failing_inbox_does_not_block_other_inboxes_in_the_same_pass(make_inbox, t0, fast_parking):
    a, b, c = make_inbox("a"), make_inbox("b"), make_inbox("c")
    for inbox in (a, b, c):
        hold(inbox, f"{inbox.slug} news", t0)
    send = Recorder(fail={"a"})

    assert dispatch(send, now=t0) == 2

    assert [slug for slug, *_ in send.sent] == ["a", "b", "c"]
    assert statuses(a) == [HELD]
    assert statuses(b) == statuses(c) == [SENT]
    # Later passes: a keeps failing until parked; b and c go on sending.
    now = t0
    for _ in range(fast_parking - 1):
        now = Channel.objects.get(inbox=a).retry_at + HOUR
        hold(b, "b more", now)
        assert dispatch(send, now=now) == 1
    assert statuses(a) == [FAILED]
    assert statuses(b) == [SENT] * fast_parking


# --- at most once -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_at_most_once_marks_rows_sent_before_the_send(inbox, t0):
    channel_for(inbox, mode=Channel.Mode.AT_MOST_ONCE)
    hold(inbox, "one", t0)
    hold(inbox, "two", t0)
    seen = []

    def send(delivery):
        seen.append(statuses(inbox))

    assert dispatch(send, now=t0) == 2

    assert seen == [[SENT, SENT]]
    assert [(b, s, at) for b, s, at, _ in rows(inbox)] == [("one", SENT, t0), ("two", SENT, t0)]


@pytest.mark.django_db
def test_at_least_once_sends_before_marking_rows_sent(inbox, t0):
    hold(inbox, "one", t0)
    seen = []

    assert dispatch(lambda delivery: seen.append(statuses(inbox)), now=t0) == 1

    assert seen == [[HELD]]
    assert statuses(inbox) == [SENT]


@pytest.mark.django_db
def test_failed_at_most_once_send_marks_rows_failed_and_never_resends(inbox, t0):
    channel_for(inbox, mode=Channel.Mode.AT_MOST_ONCE)
    hold(inbox, "lost", t0)
    broken = Recorder(fail={"desk"})

    assert dispatch(broken, now=t0) == 0

    assert statuses(inbox) == [FAILED]
    assert OutboxMessage.objects.get().error == "desk: channel down"
    assert Channel.objects.get(inbox=inbox).retry_at is None  # nothing to retry
    for later in (t0 + MINUTE, t0 + 2 * HOUR, t0 + 48 * HOUR):
        assert dispatch(broken, now=later) == 0
    assert len(broken.sent) == 1
    assert "1 failed outbox message(s)" in _call("deadletters")


# --- the idempotency key ----------------------------------------------------------------------


class Crash(Exception):
    """Not a SendFailed: the process 'dies' after the send, before the commit."""


@pytest.mark.django_db
def test_idempotency_key_is_the_same_when_a_crash_after_send_repeats_it(inbox, t0):
    hold(inbox, "one", t0)
    hold(inbox, "two", t0)
    keys = []

    def send_then_crash(delivery):
        keys.append(delivery.idempotency_key)
        raise Crash("killed after send, before commit")

    with pytest.raises(Crash):
        dispatch(send_then_crash, now=t0)
    assert rows(inbox) == [("one", HELD, None, 0), ("two", HELD, None, 0)]  # rolled back

    send = Recorder()
    assert dispatch(send, now=t0 + SECOND) == 2  # sent again ...
    assert [key for _, _, key, _ in send.sent] == keys  # ... under the same key
    assert keys == [expected_key(inbox, OutboxMessage.objects.filter(inbox=inbox))]


@pytest.mark.django_db
def test_idempotency_key_differs_for_different_rows(make_inbox, t0):
    a, b = make_inbox("a"), make_inbox("b")
    send = Recorder()
    hold(a, "one", t0)
    dispatch(send, now=t0)
    hold(a, "two", t0 + HOUR)
    hold(a, "three", t0 + HOUR)
    dispatch(send, now=t0 + HOUR)
    hold(b, "one", t0)
    dispatch(send, now=t0 + HOUR)

    keys = [key for _, _, key, _ in send.sent]
    assert len(keys) == len(set(keys)) == 3
    assert all(re.fullmatch(r"[0-9a-f]{32}", key) for key in keys)
    _, two, three = OutboxMessage.objects.filter(inbox=a).order_by("id")
    assert expected_key(a, [two]) != expected_key(a, [two, three]) != expected_key(a, [three])


# --- a send is retried as it was: the same rows, the same key ---------------------------------


def posted(server):
    """(Idempotency-Key, raw body, message ids) of each POST the server received."""
    return [
        (
            post["headers"]["Idempotency-Key"],
            post["body"],
            [m["id"] for m in json.loads(post["body"])["messages"]],
        )
        for post in server.posts()
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("urgent", [False, True], ids=["plain", "urgent"])
def test_a_send_that_timed_out_is_retried_as_it_was_and_later_messages_go_next(
    webhook_inbox, webhook, t0, settings, urgent
):
    """The receiver got the first POST and answered too late: the retry must be the same
    send (same key, same body), and what was queued meanwhile a send of its own."""
    bound = settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT
    settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT = 1
    webhook.delay = 3  # longer than the timeout; teardown wakes the handler early
    one, two = hold(webhook_inbox, "one", t0), hold(webhook_inbox, "two", t0)
    assert dispatch(now=t0) == 0
    retry_at = Channel.objects.get(inbox=webhook_inbox).retry_at
    three = hold(webhook_inbox, "three", t0 + SECOND, urgent=urgent)
    webhook.delay = 0
    # The usual bound again for the sends that must go: a loopback answer can take longer
    # than a second on a machine busy with other suites.
    settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT = bound

    assert dispatch(now=retry_at) == 2

    [(key, body, ids), repeat] = posted(webhook)
    assert repeat == (key, body, [one.pk, two.pk])
    assert statuses(webhook_inbox) == [SENT, SENT, HELD]
    # The retry that went out started the gap: a plain message waits for it, an urgent one
    # goes at once.
    next_send = retry_at if urgent else retry_at + HOUR
    if not urgent:
        assert dispatch(now=next_send - SECOND) == 0
    assert dispatch(now=next_send) == 1
    later_key, _, later_ids = posted(webhook)[2]
    assert later_ids == [three.pk]
    assert later_key != key
    assert statuses(webhook_inbox) == [SENT, SENT, SENT]


@pytest.mark.django_db
def test_messages_queued_after_a_crashed_send_wait_for_its_repeat(inbox, t0):
    one, two = hold(inbox, "one", t0), hold(inbox, "two", t0)
    crashed = Recorder()

    def send_then_crash(delivery):
        crashed(delivery)
        raise Crash("killed after send, before commit")

    with pytest.raises(Crash):
        dispatch(send_then_crash, now=t0)
    three = hold(inbox, "three", t0 + SECOND, urgent=True)

    send = Recorder()
    assert dispatch(send, now=t0 + SECOND) == 2
    assert dispatch(send, now=t0 + SECOND) == 1  # urgent: at once, in a send of its own

    [(_, body, key, ids)] = crashed.sent
    assert (body, ids) == ("one\n\ntwo", [one.pk, two.pk])
    assert send.sent[0] == ("desk", body, key, ids)  # the repeat: the same send
    [(_, later_body, later_key, later_ids)] = send.sent[1:]
    assert (later_body, later_ids) == ("three", [three.pk])
    assert later_key != key
    assert statuses(inbox) == [SENT, SENT, SENT]


def _fail_until_parked(inbox, send, now, max_attempts, queue_after_first=None):
    """Dispatch through a failing `send` until its send is parked; the time of the last try."""
    for attempt in range(1, max_attempts + 1):
        assert dispatch(send, now=now) == 0
        if attempt == 1 and queue_after_first:
            queue_after_first()
        if attempt < max_attempts:
            now = Channel.objects.get(inbox=inbox).retry_at
    return now


@pytest.mark.django_db
def test_a_failing_send_is_parked_whole_and_later_messages_make_their_own(inbox, t0, fast_parking):
    one, two = hold(inbox, "one", t0), hold(inbox, "two", t0)
    later = []
    broken = Recorder(fail={"desk"})

    now = _fail_until_parked(
        inbox,
        broken,
        t0,
        fast_parking,
        queue_after_first=lambda: later.append(hold(inbox, "three", t0 + SECOND, urgent=True)),
    )

    assert len(broken.sent) == fast_parking
    assert {(body, key, tuple(ids)) for _, body, key, ids in broken.sent} == {
        ("one\n\ntwo", broken.sent[0][2], (one.pk, two.pk))
    }
    assert rows(inbox) == [
        ("one", FAILED, None, fast_parking),
        ("two", FAILED, None, fast_parking),
        ("three", HELD, None, 0),  # never attempted: its own send gets every attempt
    ]
    send = Recorder()
    assert dispatch(send, now=now) == 1
    assert [(body, ids) for _, body, _, ids in send.sent] == [("three", [later[0].pk])]
    assert send.sent[0][2] != broken.sent[0][2]


@pytest.mark.django_db
@pytest.mark.parametrize("mode", [Channel.Mode.AT_LEAST_ONCE, Channel.Mode.AT_MOST_ONCE])
def test_resending_one_message_of_a_parked_send_resends_the_whole_send_under_its_key(
    inbox, t0, fast_parking, mode
):
    channel_for(inbox, mode=mode)
    one, two = hold(inbox, "one", t0), hold(inbox, "two", t0)
    broken = Recorder(fail={"desk"})
    attempts = fast_parking if mode == Channel.Mode.AT_LEAST_ONCE else 1
    now = _fail_until_parked(inbox, broken, t0, attempts)
    [parked_key] = {key for _, _, key, _ in broken.sent}
    three = hold(inbox, "three", now)
    send = Recorder()
    assert dispatch(send, now=now + HOUR) == 1  # a later send went out meanwhile

    assert "resent 2 message(s)" in _call("deadletters", "--resend", str(two.pk))

    assert [(b, s, a) for b, s, _, a in rows(inbox)] == [
        ("one", HELD, 0),
        ("two", HELD, 0),
        ("three", SENT, 0),
    ]
    assert dispatch(send, now=now + 2 * HOUR) == 2
    assert send.sent == [
        ("desk", "three", send.sent[0][2], [three.pk]),
        ("desk", "one\n\ntwo", parked_key, [one.pk, two.pk]),
    ]


@pytest.mark.django_db
def test_deadletters_lists_each_parked_message_with_its_send_key(inbox, t0, fast_parking):
    one, two = hold(inbox, "one", t0), hold(inbox, "two", t0)
    broken = Recorder(fail={"desk"})
    _fail_until_parked(inbox, broken, t0, fast_parking)
    key = broken.sent[0][2]

    out = _call("deadletters")

    assert f"  {one.pk}\tdesk\t{fast_parking}\tdesk: channel down\t'one'\t{key}\n" in out
    assert f"  {two.pk}\tdesk\t{fast_parking}\tdesk: channel down\t'two'\t{key}\n" in out


# --- the email channel ------------------------------------------------------------------------


@pytest.mark.django_db
def test_email_goes_to_the_owner_with_a_stable_message_id(make_inbox, owner_with_email, t0, locmem):
    inbox = make_inbox("desk", owner=owner_with_email)
    hold(inbox, "Refund 881 approved\nThe customer was told.", t0)
    hold(inbox, "Digest: 3 new tickets", t0)

    assert dispatch(now=t0) == 2

    [message] = locmem
    ids = OutboxMessage.objects.filter(inbox=inbox).order_by("id")
    key = expected_key(inbox, ids)
    assert message.to == ["ada@example.org"]
    assert message.subject == "[desk] Refund 881 approved"
    assert message.body == "Refund 881 approved\nThe customer was told.\n\nDigest: 3 new tickets"
    assert message.extra_headers["Message-ID"] == f"<{key}@alwayson>"
    assert message.message()["Message-ID"] == f"<{key}@alwayson>"
    assert statuses(inbox) == [SENT, SENT]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first_line", "subject"),
    [
        (
            "Refund order 881? Approve or deny within 4 hours:"
            " https://desk.example.com/approvals/desk/refund-881/",
            "[desk] Refund order 881? Approve or deny within 4 hours",
        ),
        ("Read www.example.com/a-long-path first", "[desk] Read"),
        (
            "The customer of order 881 asked twice for a refund of the second parcel, which"
            " never arrived",
            "[desk] The customer of order 881 asked twice for a refund of the second parcel,"
            " which…",
        ),
        ("https://desk.example.com/report", "[desk] A message from your agent"),
    ],
    ids=["link", "bare-www", "long", "only-a-link"],
)
def test_an_email_subject_is_cut_before_a_link_and_at_a_word(
    make_inbox, owner_with_email, t0, locmem, first_line, subject
):
    inbox = make_inbox("desk", owner=owner_with_email)
    hold(inbox, f"{first_line}\nmore", t0)

    assert dispatch(now=t0) == 1

    [message] = locmem
    assert message.subject == subject
    assert message.body == f"{first_line}\nmore"


@pytest.mark.django_db
def test_email_goes_to_the_channel_address_when_set(make_inbox, owner_with_email, t0, locmem):
    inbox = make_inbox("desk", owner=owner_with_email)
    channel_for(inbox, email="ops@example.org")
    hold(inbox, "hello", t0)

    assert dispatch(now=t0) == 1

    assert [m.to for m in locmem] == [["ops@example.org"]]


@pytest.mark.django_db
def test_email_to_an_owner_without_address_is_a_recorded_failed_send(inbox, t0, locmem):
    assert inbox.owner.email == ""
    hold(inbox, "hello", t0)

    assert dispatch(now=t0) == 0

    assert locmem == []
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts) == (HELD, 1)
    assert "no address" in message.error
    channel = Channel.objects.get(inbox=inbox)
    assert "no address" in channel.last_error
    assert channel.retry_at > t0


@pytest.mark.django_db
def test_email_through_a_real_smtp_server(make_inbox, owner_with_email, t0, smtp_server, settings):
    settings.DEFAULT_FROM_EMAIL = "agent@alwayson.test"
    inbox = make_inbox("desk", owner=owner_with_email)
    hold(inbox, "first line", t0)
    hold(inbox, "second message", t0)

    assert dispatch(now=t0) == 2

    assert smtp_server.arrived.wait(WAIT)
    [envelope] = smtp_server.envelopes
    key = expected_key(inbox, OutboxMessage.objects.filter(inbox=inbox))
    assert envelope["mail_from"] == "agent@alwayson.test"
    assert envelope["rcpt_tos"] == ["ada@example.org"]
    message = envelope["message"]
    assert message["Message-ID"] == f"<{key}@alwayson>"
    assert message["To"] == "ada@example.org"
    assert message["Subject"] == "[desk] first line"
    text = message.get_body(preferencelist=("plain",)).get_content()
    assert text.replace("\r\n", "\n").strip() == "first line\n\nsecond message"  # CRLF on the wire
    html = message.get_body(preferencelist=("html",)).get_content()
    assert "<p>first line</p>" in html
    assert statuses(inbox) == [SENT, SENT]


@pytest.mark.django_db
def test_refused_smtp_connection_is_a_recorded_failed_send(
    make_inbox, owner_with_email, t0, settings
):
    use_email_backend(
        settings,
        "django.core.mail.backends.smtp.EmailBackend",
        host="127.0.0.1",
        port=free_port(),  # nothing listens
        timeout=WAIT,
    )
    inbox = make_inbox("desk", owner=owner_with_email)
    hold(inbox, "hello", t0)

    assert dispatch(now=t0) == 0

    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts) == (HELD, 1)
    assert message.error.startswith("email to ada@example.org:")
    assert Channel.objects.get(inbox=inbox).retry_at > t0


# --- the webhook channel ----------------------------------------------------------------------


@pytest.mark.django_db
def test_webhook_posts_json_with_the_idempotency_key(webhook_inbox, webhook, t0):
    channel_for(webhook_inbox, url=webhook.url("/hooks/alwayson?team=ops"))
    hold(webhook_inbox, "one", t0)
    hold(webhook_inbox, "two", t0 + SECOND, urgent=True)

    assert dispatch(now=t0 + SECOND) == 2

    [request] = webhook.requests
    messages = list(OutboxMessage.objects.filter(inbox=webhook_inbox).order_by("id"))
    key = expected_key(webhook_inbox, messages)
    assert request["method"] == "POST"
    assert request["path"] == "/hooks/alwayson?team=ops"
    assert request["headers"]["Idempotency-Key"] == key
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"] == "alwayson-dispatcher"
    assert json.loads(request["body"]) == {
        "inbox": "hooked",
        "idempotency_key": key,
        "text": "one\n\ntwo",
        "messages": [
            {"id": m.pk, "body": m.body, "urgent": m.urgent, "created": m.created.isoformat()}
            for m in messages
        ],
    }
    assert statuses(webhook_inbox) == [SENT, SENT]


@pytest.mark.django_db
@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_webhook_any_2xx_answer_is_a_send(webhook_inbox, webhook, t0, status):
    webhook.status = status
    hold(webhook_inbox, "one", t0)

    assert dispatch(now=t0) == 1
    assert statuses(webhook_inbox) == [SENT]


def _retried_then_parked(inbox, server, t0, max_attempts):
    """Dispatch until parked, checking the backoff between attempts; the POSTs received."""
    now = t0
    for attempt in range(1, max_attempts + 1):
        assert dispatch(now=now) == 0
        assert len(server.posts()) == attempt
        channel = Channel.objects.get(inbox=inbox)
        if attempt < max_attempts:
            assert statuses(inbox) == [HELD, HELD]
            assert OutboxMessage.objects.filter(inbox=inbox, attempts=attempt).count() == 2
            assert channel.retry_at > now
            assert dispatch(now=channel.retry_at - SECOND) == 0  # backing off
            assert len(server.posts()) == attempt  # not even tried
            now = channel.retry_at
    assert rows(inbox) == [("one", FAILED, None, max_attempts), ("two", FAILED, None, max_attempts)]
    return server.posts()


@pytest.mark.django_db
@pytest.mark.parametrize("status", [500, 503, 404, 410, 429])
def test_webhook_error_answer_is_retried_with_backoff_then_parked(
    webhook_inbox, webhook, t0, fast_parking, status
):
    webhook.status = status
    hold(webhook_inbox, "one", t0)
    hold(webhook_inbox, "two", t0)

    posts = _retried_then_parked(webhook_inbox, webhook, t0, fast_parking)

    assert len({p["headers"]["Idempotency-Key"] for p in posts}) == 1  # same rows, same key
    message = OutboxMessage.objects.filter(inbox=webhook_inbox).first()
    assert message.error == f"webhook {webhook.url()}: HTTP {status}"
    assert "failed outbox message(s)" in _call("deadletters", "--inbox", "hooked")


@pytest.mark.django_db
def test_webhook_timeout_is_retried_with_backoff_then_parked(
    webhook_inbox, webhook, t0, settings, fast_parking
):
    settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT = 1
    webhook.delay = 3  # longer than the timeout; teardown wakes the handler early
    hold(webhook_inbox, "one", t0)
    hold(webhook_inbox, "two", t0)

    started = time.monotonic()
    posts = _retried_then_parked(webhook_inbox, webhook, t0, fast_parking)
    elapsed = time.monotonic() - started

    assert elapsed < fast_parking * 2.5  # each attempt gave up after about a second
    assert len({p["headers"]["Idempotency-Key"] for p in posts}) == 1
    message = OutboxMessage.objects.filter(inbox=webhook_inbox).first()
    assert message.error == f"webhook {webhook.url()}: no answer within 1 s"


@pytest.mark.django_db
def test_webhook_refused_connection_is_a_failed_send(make_inbox, t0):
    inbox = make_inbox("hooked")
    channel_for(inbox, kind=Channel.Kind.WEBHOOK, url=f"http://127.0.0.1:{free_port()}/x")
    hold(inbox, "one", t0)

    assert dispatch(now=t0) == 0

    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts) == (HELD, 1)
    assert message.error.startswith("webhook http://127.0.0.1:")


@pytest.mark.django_db
def test_a_failing_webhook_does_not_block_an_email_inbox(
    webhook_inbox, webhook, make_inbox, owner_with_email, t0, locmem
):
    webhook.status = 500
    mailed = make_inbox("mailed", owner=owner_with_email)
    hold(webhook_inbox, "to the hook", t0)
    hold(mailed, "to the owner", t0)

    assert dispatch(now=t0) == 1

    assert statuses(webhook_inbox) == [HELD]
    assert statuses(mailed) == [SENT]
    assert [m.body for m in locmem] == ["to the owner"]


# --- known bugs (strict xfail: they start failing when fixed) ---------------------------------


class RawServer:
    """A TCP server on 127.0.0.1 that answers each connection with fixed raw bytes."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn, suppress(OSError):
                conn.settimeout(WAIT)
                conn.recv(65536)
                conn.sendall(self.reply)

    def stop(self):
        self.stopping.set()
        self.thread.join(WAIT)
        self.sock.close()


@pytest.fixture
def garbage_server(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = RawServer(b"this is not HTTP\r\n\r\n")
    yield server
    server.stop()


@pytest.mark.django_db
def test_webhook_answering_garbage_is_a_failed_send_not_a_crash(
    make_inbox, garbage_server, t0, locmem
):
    broken, fine = make_inbox("broken"), make_inbox("fine")
    channel_for(broken, kind=Channel.Kind.WEBHOOK, url=f"http://127.0.0.1:{garbage_server.port}/")
    channel_for(fine, email="fine@example.org")
    hold(broken, "one", t0)
    hold(fine, "two", t0)

    assert dispatch(now=t0) == 1  # today: raises http.client.BadStatusLine

    assert statuses(broken) == [HELD]
    assert OutboxMessage.objects.get(inbox=broken).attempts == 1
    assert statuses(fine) == [SENT]


@pytest.mark.django_db
def test_webhook_redirect_is_not_a_delivery(webhook_inbox, webhook, t0):
    webhook.status = (302, "/moved")
    hold(webhook_inbox, "one", t0)

    dispatch(now=t0)

    assert statuses(webhook_inbox) == [HELD]  # today: SENT, after a bodiless GET /moved
    assert [(r["method"], r["path"]) for r in webhook.requests] == [("POST", "/hooks/alwayson")]


@pytest.mark.django_db
def test_dispatch_inbox_takes_a_slug(inbox, t0):
    hold(inbox, "one", t0)
    send = Recorder()

    assert dispatch_inbox("desk", send, now=t0) == 1
    assert send.bodies == [("desk", "one")]


# --- rundispatcher ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rundispatcher_once_sends_through_each_inbox_channel(
    make_inbox, owner_with_email, webhook, locmem, loop_command
):
    mailed = make_inbox("mailed", owner=owner_with_email)
    hooked = make_inbox("hooked")
    channel_for(hooked, kind=Channel.Kind.WEBHOOK, url=webhook.url())
    past = timezone.now() - MINUTE  # the command reads the database clock
    hold(mailed, "by mail", past)
    hold(hooked, "by hook 1", past)
    hold(hooked, "by hook 2", past)

    call_command("rundispatcher", "--once", "--verbosity", "0")

    assert [(m.to, m.body) for m in locmem] == [(["ada@example.org"], "by mail")]
    [post] = webhook.posts()
    assert json.loads(post["body"])["text"] == "by hook 1\n\nby hook 2"
    assert statuses(mailed) == [SENT]
    assert statuses(hooked) == [SENT, SENT]

    hold(mailed, "inside the gap", timezone.now())
    call_command("rundispatcher", "--once", "--verbosity", "0")
    assert len(locmem) == 1
    assert statuses(mailed) == [SENT, HELD]


@pytest.mark.django_db
@pytest.mark.parametrize("interval", ["0", "-0.5"])
def test_rundispatcher_refuses_a_non_positive_interval(interval, loop_command):
    with pytest.raises(CommandError, match="--interval must be positive"):
        call_command("rundispatcher", "--once", f"--interval={interval}")


# --- PostgreSQL: commits seen from another connection, dispatchers at once ---------------------


def _bounded_session():
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute("SET statement_timeout = '20s'")


def _from_another_connection(fn):
    """Run fn in a new thread (so on a new database connection); its result."""
    result, errors = [], []

    def run():
        try:
            _bounded_session()
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the second connection hung"
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("mode", "seen_during_send"),
    [(Channel.Mode.AT_MOST_ONCE, [SENT, SENT]), (Channel.Mode.AT_LEAST_ONCE, [HELD, HELD])],
)
def test_another_connection_sees_what_is_committed_during_the_send(
    inbox, t0, mode, seen_during_send
):
    """At most once: marked sent and committed before the send. At least once: the mark is
    not committed until the send has returned. In both, the send's key is committed on its
    rows before the send, so a crash during it cannot change what a retry sends."""
    channel_for(inbox, mode=mode)
    hold(inbox, "one", t0)
    hold(inbox, "two", t0)
    seen = []

    def committed():
        rows = OutboxMessage.objects.filter(inbox=inbox).order_by("id")
        return list(rows.values_list("status", "send_key"))

    def send(delivery):
        seen.append((delivery.idempotency_key, _from_another_connection(committed)))

    assert dispatch(send, now=t0) == 2

    [(key, during_send)] = seen
    assert during_send == [(status, key) for status in seen_during_send]
    assert statuses(inbox) == [SENT, SENT]


class Dispatchers:
    """n threads, one connection each, released together by a barrier, each calling fn(i)."""

    def __init__(self, n, fn):
        self.fn = fn
        self.results = [None] * n
        self.errors = []
        self.barrier = threading.Barrier(n, timeout=WAIT)
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"dispatcher-{i}", daemon=True)
            for i in range(n)
        ]

    def _run(self, index):
        try:
            _bounded_session()
            self.barrier.wait()
            self.results[index] = self.fn(index)
        except BaseException as exc:
            self.errors.append(exc)
            self.barrier.abort()
        finally:
            connection.close()

    def run(self):
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 3 * WAIT
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        assert not any(thread.is_alive() for thread in self.threads), "a dispatcher hung"
        assert self.errors == []
        return self.results


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", [Channel.Mode.AT_LEAST_ONCE, Channel.Mode.AT_MOST_ONCE])
def test_dispatchers_at_once_never_send_the_same_rows_twice(make_inbox, t0, mode):
    inboxes = [make_inbox() for _ in range(12)]
    for n, inbox in enumerate(inboxes):
        if n % 2:  # the others' channels are created by the racing dispatchers
            channel_for(inbox, mode=mode)
        for m in range(3):
            hold(inbox, f"{inbox.slug} #{m}", t0)
    sends = []
    lock = threading.Lock()

    def slow_send(delivery):
        time.sleep(0.05)  # hold the inbox long enough for the others to reach it
        with lock:
            sends.append(
                (
                    threading.current_thread().name,
                    delivery.inbox.slug,
                    [m.pk for m in delivery.messages],
                )
            )

    results = Dispatchers(3, lambda i: dispatch(slow_send, now=t0)).run()

    sent_ids = [pk for _, _, ids in sends for pk in ids]
    assert len(sent_ids) == len(set(sent_ids)) == 36
    assert sum(results) == 36
    assert sorted(slug for _, slug, _ in sends) == sorted(i.slug for i in inboxes)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {SENT}
    assert Channel.objects.count() == 12
    assert dispatch(slow_send, now=t0 + 2 * HOUR) == 0


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", [Channel.Mode.AT_LEAST_ONCE, Channel.Mode.AT_MOST_ONCE])
def test_second_dispatcher_skips_an_inbox_while_the_first_is_sending(inbox, t0, mode):
    """The sender waits until the other dispatcher has finished its pass: that pass must
    have sent nothing."""
    channel_for(inbox, mode=mode)
    for m in range(3):
        hold(inbox, f"#{m}", t0)
    finished = [threading.Event(), threading.Event()]
    sends = []

    def dispatcher(index):
        def send(delivery):
            sends.append((index, [m.pk for m in delivery.messages]))
            assert finished[1 - index].wait(WAIT), "the other dispatcher did not finish"

        try:
            return dispatch_inbox(inbox.pk, send, now=t0)
        finally:
            finished[index].set()

    results = Dispatchers(2, dispatcher).run()

    assert sorted(results) == [0, 3]
    assert len(sends) == 1
    assert statuses(inbox) == [SENT, SENT, SENT]


@pytest.fixture
def dispatcher_process(tmp_path):
    """Start `manage.py rundispatcher` on the test database; killed at teardown."""
    started = []

    def start(*args):
        log_path = tmp_path / f"dispatcher-{len(started)}.log"
        loopback = "127.0.0.1,localhost"
        env = {"no_proxy": loopback, "NO_PROXY": loopback}
        started.append(start_command("rundispatcher", args, log_path, env))
        return started[-1], log_path

    yield start
    for proc in started:
        proc.kill()
        proc.wait(WAIT)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_killed_mid_send_is_repeated_with_the_same_rows_and_key(
    webhook_inbox, webhook, dispatcher_process
):
    """A real fault: the receiver has the POST, the dispatcher is SIGKILLed before it could
    commit; an urgent message arrives. The repeat is the same send; the urgent one follows."""
    webhook.delay = 3 * WAIT  # never answers the first POST; teardown wakes the handler
    now = clock.database_now()
    one, two = hold(webhook_inbox, "one", now), hold(webhook_inbox, "two", now)
    proc, log_path = dispatcher_process("--once", "--verbosity", "0")
    wait_for(lambda: webhook.posts() or proc.poll() is not None, 3 * WAIT, "the first POST")
    assert webhook.posts(), log_path.read_text(errors="replace")
    proc.kill()
    proc.wait(WAIT)
    three = hold(webhook_inbox, "three", now, urgent=True)
    webhook.delay = 0

    # The killed session's channel lock goes when PostgreSQL notices the dead client.
    assert wait_for(lambda: dispatch(), WAIT, "the retry") == 2
    assert dispatch() == 1

    [(key, body, ids), repeat, (later_key, _, later_ids)] = posted(webhook)
    assert ids == [one.pk, two.pk]
    assert repeat == (key, body, ids)
    assert later_ids == [three.pk]
    assert later_key != key
    assert statuses(webhook_inbox) == [SENT, SENT, SENT]
