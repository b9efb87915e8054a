"""The egress gateway: one allowlist for every outbound call an agent makes, a credential
the agent never sees, and nothing refused leaves the process. Loopback servers only."""

import json
import logging
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from alwayson.egress.apps import checked_services
from alwayson.egress.exceptions import EgressFailed, EgressRefused
from alwayson.egress.gateway import Egress
from alwayson.egress.models import EgressCall
from alwayson.egress.scrub import REDACTED
from alwayson.egress.services import check_services
from alwayson.settings import env
from tests.support.egress import QUERY_SECRET, SECRET
from tests.support.loopback import Loopback

pytestmark = pytest.mark.django_db


@pytest.fixture
def evil():
    with Loopback() as server:
        yield server


@pytest.fixture
def http(egress_settings, inbox):
    return Egress(inbox)


# --- allowed calls -----------------------------------------------------------------------------


def test_allowed_call_carries_a_credential_the_agent_never_holds(http, service):
    response = http.post("payments", "/v1/refunds", json={"order": "881"})
    assert response.status == 200 and response.json() == {"refund": "re_1"}
    [request] = service.requests
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert json.loads(request["body"]) == {"order": "881"}
    assert SECRET not in repr(response.__dict__)
    call = EgressCall.objects.get()
    assert (call.service, call.method, call.path, call.outcome, call.status) == (
        "payments",
        "POST",
        "/v1/refunds",
        "sent",
        200,
    )


def test_query_parameter_credential_is_added_by_the_gateway(http, service):
    assert http.get("maps", "/geocode", params={"q": "Berlin"}).ok
    [request] = service.requests
    assert request["path"] == f"/maps/geocode?q=Berlin&key={QUERY_SECRET}"
    assert "Authorization" not in request["headers"]


def test_a_service_that_echoes_the_credential_is_scrubbed(http):
    response = http.get("payments", "/v1/echo")
    assert SECRET not in response.text and REDACTED in response.text
    assert response.json() == {"seen": f"Bearer {REDACTED}"}
    assert response.headers["x-seen"] == f"Bearer {REDACTED}"
    assert response.reason == f"Seen Bearer {REDACTED}"
    assert "set-cookie" not in {name.lower() for name in response.headers}


def test_a_cookie_one_call_got_is_never_sent_again(egress_settings, service, make_inbox):
    """Calls share one client (and its connections), not its cookie jar: a service's
    Set-Cookie would otherwise ride along on the next call, another inbox's too."""
    Egress(make_inbox("first")).get("payments", "/v1/echo")  # answers Set-Cookie: sid=1
    Egress(make_inbox("second")).get("payments", "/v1/echo")
    assert [r["headers"].get("Cookie") for r in service.requests] == [None, None]


# --- refused calls -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda h: h.get("unknown", "/"), "not allowed"),
        (lambda h: h.get("http://127.0.0.1:9/", "/"), "not allowed"),
        (lambda h: h.request("payments", "DELETE", "/v1/refunds"), "method DELETE"),
        (lambda h: h.get("payments", "/v1/customers"), "outside the allowed paths"),
        (lambda h: h.get("payments", "/v1/refundsX"), "outside the allowed paths"),
        (lambda h: h.get("payments", "/v1/refunds/../customers"), "clean absolute path"),
        (lambda h: h.get("payments", "/v1/refunds/%2e%2e/customers"), "clean absolute path"),
        (lambda h: h.get("payments", "//evil.example/v1/refunds"), "clean absolute path"),
        (lambda h: h.get("payments", "v1/refunds"), "clean absolute path"),
        (lambda h: h.get("payments", "/v1/refunds?x=1"), "clean absolute path"),
        (
            lambda h: h.get("payments", "/v1/refunds", headers={"authorization": "Bearer mine"}),
            "may not be set",
        ),
        (lambda h: h.get("payments", "/v1/refunds", headers={"Host": "evil"}), "may not be set"),
        (lambda h: h.get("maps", "/geocode", params={"key": "mine"}), "reserved"),
    ],
)
def test_calls_outside_the_allowlist_are_refused_before_anything_leaves(
    http, service, call, reason
):
    with pytest.raises(EgressRefused, match=reason):
        call(http)
    assert service.requests == []
    assert EgressCall.objects.get().outcome == "refused"


def test_a_service_limited_to_other_inboxes_is_refused_here(egress_settings, make_inbox, service):
    with pytest.raises(EgressRefused, match="'desk-only' is not allowed"):
        Egress(make_inbox("other")).get("desk-only", "/v1/refunds")
    assert Egress(make_inbox("desk")).get("desk-only", "/v1/refunds").ok
    assert len(service.requests) == 1


def test_redirects_are_returned_not_followed(http, evil):
    response = http.get("payments", "/v1/redirect", headers={"X-Evil": evil.url("/steal")})
    assert response.status == 302
    assert evil.requests == []


def test_timeouts_and_oversized_answers_fail_without_naming_the_credential(http, settings):
    with pytest.raises(EgressFailed, match="ReadTimeout") as slow:
        http.get("payments-slow", "/v1/slow")
    with pytest.raises(EgressFailed, match="larger than 1000 bytes"):
        http.get("payments", "/v1/big")
    assert SECRET not in str(slow.value)
    assert list(EgressCall.objects.order_by("id").values_list("outcome", flat=True)) == [
        "failed",
        "failed",
    ]


def test_a_timeout_with_a_query_credential_does_not_leak_the_url(egress_settings, monkeypatch):
    with Loopback(lambda request: (time.sleep(1.5), (200, {}, b""))[1]) as slow:
        egress_settings.ALWAYSON_EGRESS_SERVICES = check_services(
            {
                "maps": {
                    "base_url": slow.url(),
                    "query": "key",
                    "secret_env": "MAPS_KEY",
                    "timeout": 0.5,
                }
            }
        )
        with pytest.raises(EgressFailed) as failed:
            Egress("desk").get("maps", "/")
    assert QUERY_SECRET not in str(failed.value)
    assert QUERY_SECRET not in EgressCall.objects.get().error


def test_a_missing_credential_fails_naming_the_service_only(http, monkeypatch, service):
    monkeypatch.delenv("PAYMENTS_TOKEN")
    with pytest.raises(EgressFailed, match="service payments has no credential"):
        http.get("payments", "/v1/refunds")
    assert service.requests == []


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, field",
    [
        ({"Bad Name": {"base_url": "https://a.example"}}, "service name"),
        ({"a": {"base_url": "ftp://a.example"}}, "a.base_url"),
        ({"a": {"base_url": "https://u:p@a.example"}}, "a.base_url"),
        ({"a": {"base_url": "https://a.example", "methods": ["TRACE"]}}, "a.methods"),
        ({"a": {"base_url": "https://a.example", "paths": ["v1"]}}, "a.paths"),
        ({"a": {"base_url": "https://a.example", "paths": ["/v1/../x"]}}, "a.paths"),
        ({"a": {"base_url": "https://a.example", "secret_env": "A B"}}, "a.secret_env"),
        ({"a": {"base_url": "https://a.example", "timeout": 0}}, "a.timeout"),
        ({"a": {"base_url": "https://a.example", "max_unpacked_bytes": -1}}, "a.max_unpacked"),
        ({"a": {"base_url": "https://a.example", "max_unpacked_bytes": "1"}}, "a.max_unpacked"),
        ({"a": {"base_url": "https://a.example", "secret": "sk_x"}}, "unknown field"),
        ([], "JSON object"),
    ],
)
def test_malformed_services_are_refused_naming_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        check_services(config)


def egress_services(name):
    """The services as start-up reads them: JSON in the settings, checked in the egress app's
    ready()."""
    return checked_services(name, env.json_value(name, {}))


def test_malformed_services_stop_start_up(monkeypatch):
    monkeypatch.setenv("ALWAYSON_EGRESS_SERVICES", '{"a": {"base_url": "nope"}}')
    with pytest.raises(ImproperlyConfigured, match="ALWAYSON_EGRESS_SERVICES"):
        egress_services("ALWAYSON_EGRESS_SERVICES")


# --- the admin -----------------------------------------------------------------------------------


def test_admin_shows_each_inbox_services_and_last_day_counts_never_the_secret(
    http, admin_user, inbox
):
    http.post("payments", "/v1/refunds")
    with pytest.raises(EgressRefused):
        http.get("payments", "/v1/customers")
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/admin/inbox/inbox/{inbox.pk}/change/").content.decode()
    assert "payments: GET,POST http://127.0.0.1" in page
    assert "1 sent, 1 refused, 0 failed" in page
    assert "desk-only" in page  # limited to this inbox, so shown here
    assert SECRET not in page and "PAYMENTS_TOKEN" not in page
    listing = client.get("/admin/alwayson_egress/egresscall/?outcome__exact=refused")
    listing = listing.content.decode()
    assert "/v1/customers" in listing and SECRET not in listing


def test_logs_name_the_service_and_path_only(http, caplog):
    caplog.set_level(logging.DEBUG)
    http.get("maps", "/geocode", params={"q": "x"})
    with pytest.raises(EgressRefused):
        http.get("payments", "/v1/customers")
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "maps GET /geocode -> 200" in text
    assert QUERY_SECRET not in text and SECRET not in text
