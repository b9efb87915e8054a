"""A webhook delivery costs the fewest queries the database allows, so a regression (a lookup
per request, a session read, an extra clock query) fails here instead of in a benchmark."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inbox.models import Event, Lease
from tests.test_webhooks import BODY, client, post, secrets, signed  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

# PostgreSQL: the one statement that resolves the slug, stores, marks and wakes (and, for
# the schemes whose signatures carry a time, the database's clock). SQLite: the slug, then
# the INSERT and the marker's UPDATE in one transaction (a savepoint inside the test's own).
STORE = {"postgresql": 1, "sqlite": 5}
DUPLICATE = {"postgresql": 1, "sqlite": 4}
CLOCK = {"github": 0, "stripe": 1, "standard": 1}
CLOCK_QUERIES = {"postgresql": 1, "sqlite": 0}


def deliver(client, scheme, slug):
    return post(client, scheme, slug, BODY, signed(scheme, BODY))


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
def test_a_stored_delivery_and_its_retry_take_the_fewest_queries(client, secrets, inbox, scheme):
    vendor = connection.vendor
    clock = CLOCK[scheme] * CLOCK_QUERIES[vendor]
    with CaptureQueriesContext(connection) as stored:
        assert deliver(client, scheme, inbox.slug).status_code == 202
    with CaptureQueriesContext(connection) as duplicate:
        assert deliver(client, scheme, inbox.slug).status_code == 200
    assert len(stored) == STORE[vendor] + clock, [q["sql"] for q in stored]
    assert len(duplicate) == DUPLICATE[vendor] + clock, [q["sql"] for q in duplicate]
    assert Event.objects.filter(inbox=inbox).count() == 1
    assert Lease.objects.get(inbox=inbox).work_at is not None


def test_a_delivery_to_an_unknown_inbox_is_one_query_and_a_404(client, secrets, db):
    with CaptureQueriesContext(connection) as queries:
        assert deliver(client, "github", "nobody").status_code == 404
    assert len(queries) == 1
