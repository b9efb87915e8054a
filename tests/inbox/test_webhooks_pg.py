"""The same delivery POSTed twice at once: one event, two 2xx answers (PostgreSQL).

Each request runs in its own thread through Django's test Client, so each is a separate
PostgreSQL session. To make the race certain rather than likely, the test holds the inbox's
lease row (the lock every store takes first) until `pg_blocking_pids` shows every request
queued behind it; then all of them reach the UNIQUE constraint in the same instant.

Every wait is bounded: the barrier and the joins have timeouts and each request's session has
a lock_timeout, so a regression fails the test instead of hanging the suite.
"""

import threading

import pytest
from django.db import connection, transaction
from django.test import Client

from inbox.models import Event, Lease
from tests.support import postgres
from tests.support.webhooks import BODY, SCHEMES, post, signed

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("secrets"),
]

TIMEOUT = 20


def post_together(n, scheme, slug, body, headers, hold_lease_of=None):
    """POST one delivery from `n` threads released by one barrier; their status codes."""
    barrier = threading.Barrier(n + 1, timeout=TIMEOUT)
    statuses, errors, pids = [None] * n, [], [None] * n

    def run(index):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '10s'")
                cursor.execute("SELECT pg_backend_pid()")
                pids[index] = cursor.fetchone()[0]
            client = Client()
            barrier.wait()
            statuses[index] = post(client, scheme, slug, body, headers).status_code
        except BaseException as exc:  # surfaced by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]

    def start_and_join():
        for thread in threads:
            thread.start()
        barrier.wait()
        if hold_lease_of is not None:
            wait_until_blocked(pids)
        return threads

    if hold_lease_of is None:
        start_and_join()
    else:
        with transaction.atomic():
            Lease.objects.select_for_update().get(inbox=hold_lease_of)
            start_and_join()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a request never finished"
    assert not errors, errors
    return statuses


def wait_until_blocked(pids):
    postgres.wait_until_blocked(pids, TIMEOUT, what="requests")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_two_concurrent_copies_are_one_event_and_two_2xx(inbox, scheme):
    headers = signed(scheme, BODY)
    statuses = post_together(2, scheme, inbox.slug, BODY, headers, hold_lease_of=inbox)
    assert sorted(statuses) == [200, 202]
    assert Event.objects.filter(inbox=inbox, source=scheme).count() == 1


def test_many_concurrent_copies_over_many_rounds(inbox):
    for round_ in range(10):
        body = f'{{"id": "evt_{round_}", "type": "charge.succeeded"}}'.encode()
        statuses = post_together(6, "stripe", inbox.slug, body, signed("stripe", body))
        assert sorted(statuses) == [200] * 5 + [202], statuses
    assert Event.objects.filter(inbox=inbox).count() == 10
