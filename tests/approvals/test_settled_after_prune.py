"""A settled approval stays settled after prune deleted its answer event and expiry timer:
every later answer, from the API or the page, is refused and stores nothing, for as long as
the Approval row exists."""

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client

from alwayson.ops.retention import prune
from alwayson.runtime.api import (
    acquire,
    answer_approval,
    claim_batch,
    finish,
    request_approval,
    run_scheduler,
)
from approvals.models import Approval, AuditEntry
from inbox import clock
from inbox.models import Event, Lease
from inbox.services import Held
from tests.support.pages import detail_url, text_of
from timers.models import Timer

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
WINDOW = 4 * HOUR


def run_done(inbox, now):
    """Claim and finish every due event, as a worker would: the answer reached the agent."""
    generation = acquire(inbox, "w", now=now)
    ids = [event.pk for event in claim_batch(inbox, "w", generation, now=now)]
    assert finish(Held(inbox, "w", generation, ids), [], now=now)


def settle_and_prune(inbox, start, answer, by=None):
    """Ask at `start`, answer (or let it expire), let the expiry timer fire, and prune past
    the key retention: the answer event and the timer are gone, the Approval row stays.
    The moment after the prune."""
    request_approval(inbox, "r1", "refund order 881", WINDOW, now=start)
    if answer is not None:
        assert answer_approval(inbox, "r1", answer, now=start + HOUR, by=by).stands == answer
    assert run_scheduler(now=start + WINDOW + HOUR) == 1
    run_done(inbox, start + WINDOW + HOUR)
    pruned_at = start + (settings.ALWAYSON_RETAIN_EVENT_KEYS + 1) * DAY
    prune(pruned_at)
    assert not Event.objects.filter(source="approval", source_id="r1").exists()
    assert not Timer.objects.filter(inbox=inbox, key="expire:r1").exists()
    assert Lease.objects.get(inbox=inbox).work_at is None
    return pruned_at


def approval_row():
    return Approval.objects.filter(request_id="r1").values().get()


def assert_nothing_stored(inbox, row):
    assert not Event.objects.filter(inbox=inbox, source="approval", source_id="r1").exists()
    assert not Event.objects.filter(inbox=inbox).exists()
    assert approval_row() == row
    assert Lease.objects.get(inbox=inbox).work_at is None


@pytest.mark.parametrize(
    "answer, late, stands",
    [("yes", "no", "yes"), ("no", "yes", "no"), (None, "yes", "expired")],
)
def test_late_answer_after_prune_is_refused(inbox, t0, answer, late, stands):
    later = settle_and_prune(inbox, t0, answer) + HOUR
    row = approval_row()
    assert row["answer"] == stands

    assert answer_approval(inbox, "r1", late, now=later).stands == stands

    assert_nothing_stored(inbox, row)
    refused = AuditEntry.objects.filter(approval_id=row["id"]).latest("id")
    assert (refused.answer, refused.result, refused.at) == (
        late,
        AuditEntry.Result.ALREADY_SETTLED,
        later,
    )


def test_late_answer_after_prune_from_the_page_is_refused(inbox):
    owner = inbox.owner
    # The page answers at the database's clock: the request was settled 31 days before it.
    start = clock.database_now() - (settings.ALWAYSON_RETAIN_EVENT_KEYS + 2) * DAY
    assert settle_and_prune(inbox, start, "yes", by=owner) < clock.database_now()
    row = approval_row()
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    page = client.get(detail_url(inbox.slug, "r1"))
    assert "Approved." in text_of(page)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', text_of(page)).group(1)

    response = client.post(
        detail_url(inbox.slug, "r1"),
        {"answer": "no", "csrfmiddlewaretoken": token},
        follow=True,
    )

    assert response.status_code == 200
    html = text_of(response)
    assert "This request was already settled; the first outcome stands." in html
    assert "Approved." in html
    assert_nothing_stored(inbox, row)
    refused = AuditEntry.objects.filter(approval_id=row["id"]).latest("id")
    assert (refused.username, refused.answer, refused.via, refused.result) == (
        owner.username,
        "no",
        AuditEntry.Via.PAGE,
        AuditEntry.Result.ALREADY_SETTLED,
    )


def test_a_first_approval_of_two_after_its_deadline_is_still_expired(inbox, t0):
    """The row's answer is what stands once it is set; a request still open on its row (a
    first approval only) is decided by its deadline, as before."""
    lee = inbox.owner
    request_approval(inbox, "r1", "refund order 900", WINDOW, now=t0, approvers=2)
    assert answer_approval(inbox, "r1", "yes", now=t0 + HOUR, by=lee).stands == "waiting"

    assert answer_approval(inbox, "r1", "no", now=t0 + WINDOW + HOUR, by=lee).stands == "expired"

    assert Event.objects.get(source="approval", source_id="r1").payload["answer"] == "expired"
    assert approval_row()["answer"] == "expired"
