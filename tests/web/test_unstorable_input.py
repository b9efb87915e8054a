"""A NUL in a URL, a query, a form or a header never reaches the database.

PostgreSQL's text cannot hold U+0000 and psycopg refuses it before sending, so every lookup
that carried one used to answer 500 there (SQLite answered 404). One middleware
(`alwayson.web.middleware.RefuseUnstorableInput`, first in MIDDLEWARE) turns such a request away
before any view, session or admin lookup runs: 404 for the path, 400 with the reason for the
rest. Each test asserts the answer and that no query was issued, so it means the same on SQLite,
where the old lookups answered 404 but still carried the NUL to the database.
"""

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.services import request_approval

pytestmark = pytest.mark.django_db


def refused_without_a_query(client, method, path, status, **kwargs):
    with CaptureQueriesContext(connection) as ctx:
        # The test client re-raises what a view lets out: a would-be 500 fails here.
        response = getattr(client, method)(path, **kwargs)
    assert response.status_code == status, response.content
    assert ctx.captured_queries == []
    assert b"NUL" in response.content
    return response


@pytest.fixture
def staff_client(django_user_model):
    user = django_user_model.objects.create_user("operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize("slug", ["%00", "de%00sk", "desk%00"])
def test_a_nul_in_a_webhook_address_is_404_before_anything(inbox, scheme, slug):
    client = Client(enforce_csrf_checks=True)
    for path in (f"/hooks/{scheme}/{slug}/", f"/hooks/{scheme}/{slug}"):
        refused_without_a_query(
            client, "post", path, 404, data=b"{}", content_type="application/json"
        )


def test_a_nul_in_an_approval_address_is_404_for_its_owner(owner, inbox):
    inbox.owner = owner
    inbox.save()
    request_approval(inbox, "refund-1", "refund order 1", 3600)
    client = Client()
    client.force_login(owner)
    for path in (f"/approvals/{inbox.slug}/x%00y/", f"/approvals/{inbox.slug}/refund-1%00/"):
        refused_without_a_query(client, "get", path, 404)
        refused_without_a_query(client, "post", path, 404, data={"answer": "yes"})
    assert client.get(f"/approvals/{inbox.slug}/refund-1/").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/admin/inbox/event/?source__exact=%00",
        "/admin/inbox/event/?status__exact=%00",
        "/admin/inbox/event/?q=%00",
        "/admin/outbox/outboxmessage/?status__exact=a%00b",
        "/admin/autocomplete/?app_label=timers&model_name=timer&field_name=inbox&term=%00",
        "/admin/autocomplete/?app_label=inbox&model_name=inbox&field_name=owner&term=x%00",
        "/admin/inbox/event/?%00=1",
    ],
)
def test_a_nul_in_an_admin_query_is_400_with_the_reason(staff_client, inbox, path):
    response = refused_without_a_query(staff_client, "get", path, 400)
    assert response["Content-Type"].startswith("text/plain")


def test_a_nul_in_a_posted_form_is_400(staff_client, owner, inbox):
    client = Client()
    client.force_login(owner)
    refused_without_a_query(
        client, "post", "/accounts/login/", 400, data={"username": "a\x00", "password": "x"}
    )
    refused_without_a_query(
        staff_client,
        "post",
        "/admin/inbox/event/",
        400,
        data={"action": "requeue", "_selected_action": ["1\x00"]},
    )


def test_a_nul_in_a_header_is_400(inbox):
    refused_without_a_query(
        Client(), "get", "/accounts/login/", 400, headers={"User-Agent": "a\x00"}
    )


# A session cookie is looked up in the database; the second form is how a cookie quotes a NUL.
@pytest.mark.parametrize("cookie", ["sessionid=abcdefgh\x00ijk", 'sessionid="abcdefgh\\000ijk"'])
def test_a_nul_in_a_cookie_is_400(inbox, cookie):
    refused_without_a_query(Client(), "get", "/", 400, HTTP_COOKIE=cookie)


def test_the_same_requests_without_the_nul_still_work(staff_client, inbox):
    assert staff_client.get("/admin/inbox/event/?source__exact=github").status_code == 200
    autocomplete = "/admin/autocomplete/?app_label=timers&model_name=timer&field_name=inbox&term=d"
    assert staff_client.get(autocomplete).status_code == 200
    assert (
        Client().get("/accounts/login/", headers={"User-Agent": "Mozilla/5.0"}).status_code == 200
    )
