"""The paced outbox: at most one send per gap and inbox, held messages merged in order."""

from datetime import timedelta

import pytest

from alwayson.runtime.api import dispatch
from outbox.models import OutboxMessage

MINUTE = timedelta(minutes=1)


class Recorder:
    """A send() that records (inbox slug, body) for each send."""

    def __init__(self):
        self.sent = []

    def __call__(self, delivery):
        self.sent.append((delivery.inbox.slug, delivery.body))


def hold(inbox, body, at):
    return OutboxMessage.objects.create(inbox=inbox, body=body, created=at)


def sent_at(inbox):
    return list(OutboxMessage.objects.filter(inbox=inbox).values_list("body", "sent_at"))


@pytest.mark.django_db
def test_three_updates_inside_the_gap_go_out_as_two_sends(inbox, t0):
    """The article's scenario 8: updates at minutes 0, 10 and 20, a one-hour gap."""
    send = Recorder()
    for n, minute in enumerate((0, 10, 20)):
        hold(inbox, f"update {n}", t0 + minute * MINUTE)
        dispatch(send, now=t0 + minute * MINUTE)
    assert send.sent == [("desk", "update 0")]

    assert dispatch(send, now=t0 + 61 * MINUTE) == 2

    assert send.sent == [("desk", "update 0"), ("desk", "update 1\n\nupdate 2")]
    assert sent_at(inbox) == [
        ("update 0", t0),
        ("update 1", t0 + 61 * MINUTE),
        ("update 2", t0 + 61 * MINUTE),
    ]


@pytest.mark.django_db
def test_gap_is_per_inbox(make_inbox, t0):
    a, b = make_inbox("a"), make_inbox("b")
    hold(a, "a first", t0)
    dispatch(Recorder(), now=t0)
    hold(a, "a second", t0 + MINUTE)
    hold(b, "b first", t0 + MINUTE)

    send = Recorder()
    assert dispatch(send, now=t0 + MINUTE) == 1

    assert send.sent == [("b", "b first")]
    assert sent_at(a) == [("a first", t0), ("a second", None)]
    assert sent_at(b) == [("b first", t0 + MINUTE)]


@pytest.mark.django_db
def test_send_that_raises_leaves_the_messages_held(inbox, t0):
    hold(inbox, "one", t0)
    hold(inbox, "two", t0)

    def broken(delivery):
        raise ConnectionError("channel down")

    with pytest.raises(ConnectionError, match="channel down"):
        dispatch(broken, now=t0)

    assert sent_at(inbox) == [("one", None), ("two", None)]
    send = Recorder()
    assert dispatch(send, now=t0 + MINUTE) == 2  # no gap was started by the failed send
    assert send.sent == [("desk", "one\n\ntwo")]


@pytest.mark.django_db
def test_dispatch_returns_the_number_of_messages_sent(make_inbox, t0):
    a, b = make_inbox("a"), make_inbox("b")
    hold(a, "a1", t0)
    hold(a, "a2", t0)
    hold(b, "b1", t0)
    send = Recorder()

    assert dispatch(send, now=t0) == 3
    assert dispatch(send, now=t0 + 2 * 60 * MINUTE) == 0  # nothing held

    assert sorted(send.sent) == [("a", "a1\n\na2"), ("b", "b1")]
    assert not OutboxMessage.objects.held().exists()
