"""A send's idempotency key comes from what its messages are, not from their row ids or a
stamp: a failover that loses a run's commit (and the stamp of a send that already went out)
and the rerun that says the same again send under the same key, so the receiver drops it."""

from datetime import timedelta

import pytest
from django.db import transaction

from alwayson.runtime.api import ingest
from outbox.models import OutboxMessage
from outbox.services import dispatch
from tests.support.runs import finish_run, start_run

HOUR = timedelta(hours=1)


class Lost(Exception):
    """What the promoted standby never received."""


def sent_keys(run, now, say):
    keys = []
    for text in say:
        run.say(text, urgent=True)
    assert finish_run(run, now=now) is True
    dispatch(send=lambda delivery: keys.append(delivery.idempotency_key), now=now)
    return keys


@pytest.mark.django_db
def test_a_rerun_after_a_lost_commit_that_says_the_same_sends_under_the_same_key(inbox, t0):
    ingest(inbox, "chat", "m1", {"text": "refund 881"}, now=t0)
    first = start_run(inbox, "A", now=t0)
    with pytest.raises(Lost), transaction.atomic():
        sent = sent_keys(first, t0, ["Refunded order 881."])
        raise Lost  # the finish, the messages and the stamp: gone with the old primary
    assert not OutboxMessage.objects.exists()

    rerun = start_run(inbox, "B", now=t0 + HOUR)  # the lease lapsed; the event is claimed again
    assert [e.source_id for e in rerun.events] == ["m1"]
    assert sent_keys(rerun, t0 + HOUR, ["Refunded order 881."]) == sent


@pytest.mark.django_db
def test_a_later_attempt_that_says_something_else_is_a_new_send(inbox, t0):
    ingest(inbox, "chat", "m1", {"text": "refund 881"}, now=t0)
    first = start_run(inbox, "A", now=t0)
    with pytest.raises(Lost), transaction.atomic():
        sent = sent_keys(first, t0, ["Refunded order 881."])
        raise Lost

    rerun = start_run(inbox, "B", now=t0 + HOUR)
    [other] = sent_keys(rerun, t0 + HOUR, ["The payment service is down; I will retry."])
    assert other != sent[0]


@pytest.mark.django_db
def test_each_message_of_a_run_has_its_own_say_key_from_its_place_and_its_words(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.say("same words")
    run.say("same words")
    run.say("other words")
    assert finish_run(run, now=t0) is True

    keys = list(OutboxMessage.objects.order_by("id").values_list("say_key", flat=True))
    assert len(set(keys)) == 3 and all(key.startswith("say-") for key in keys)
