"""The path allowlist is matched on the path as a server reads it, percent-decoded until it
stops changing, and anything a server could read as another path or another method is
refused before it leaves the process. Loopback servers only."""

import json
import threading
from http.client import HTTPConnection

import pytest

from alwayson.egress.exceptions import EgressRefused
from alwayson.egress.gateway import Egress
from alwayson.egress.models import EgressCall
from alwayson.egress.server import TOKEN, tcp_gateway
from alwayson.egress.services import check_services
from tests.support.egress import SECRET
from tests.support.loopback import Loopback

pytestmark = pytest.mark.django_db

GATEWAY_TOKEN = "paths-gateway-token-2c7d"


@pytest.fixture
def service():
    with Loopback() as server:
        yield server


@pytest.fixture
def egress_settings(settings, service, monkeypatch):
    monkeypatch.setenv("PAYMENTS_TOKEN", SECRET)
    settings.ALWAYSON_EGRESS_SERVICES = check_services(
        {
            "payments": {
                "base_url": service.url(),
                "methods": ["GET", "POST"],
                "paths": ["/v1/refunds", "/v1/files/"],
                "secret_env": "PAYMENTS_TOKEN",
            }
        }
    )
    return settings


@pytest.fixture
def http(egress_settings, inbox):
    return Egress(inbox)


PATH_TRICKS = {
    # Tomcat and Spring read `..;` as `..`: a path parameter on a dot segment.
    "/v1/refunds/..;/admin": "';' path parameter",
    "/v1/refunds;x=1/../../admin": "';' path parameter",
    "/v1/refunds/re_1;jsessionid=1": "';' path parameter",
    "/v1/refunds/%3B/admin": "';' path parameter",
    # Decoded twice (a proxy, then the application) or three times.
    "/v1/refunds/%252e%252e/admin": "dot segment",
    "/v1/refunds/%25252e%25252e/admin": "dot segment",
    "/v1/refunds/%2e%2e/admin": "dot segment",
    "/v1/refunds/.%2E/admin": "dot segment",
    "/v1/refunds/../admin": "dot segment",
    "/v1/refunds/./re_1": "dot segment",
    "/v1/refunds/..": "dot segment",
    "/v1/refunds/.": "dot segment",
    "/v1/refunds/...": "dot segment",  # Windows drops trailing dots and spaces: `..`
    "/v1/refunds/..%20/admin": "dot segment",
    "/v1/refunds/%ef%bc%8e%ef%bc%8e/admin": "dot segment",  # fullwidth ．． folds to ..
    "/v1/refunds/%c0%ae%c0%ae/admin": "not UTF-8",  # overlong `.`, read as one by old decoders
    "/v1/refunds/%u002e%u002e/admin": "%uXXXX",  # IIS decodes %u escapes
    "/v1/refunds/%25u002e%25u002e/admin": "%uXXXX",
    # An encoded separator: one decoding later, the path has another shape.
    "/v1/refunds%2F..%2Fadmin": "encoded '/'",
    "/v1/refunds%2fadmin": "encoded '/'",
    "/v1/refunds/%252F/admin": "encoded '/'",
    "/v1/refunds/%ef%bc%8fadmin": "encoded '/'",  # fullwidth ／ folds to /
    "/v1/refunds\\..\\admin": "backslash",
    "/v1/refunds/%5c..%5cadmin": "backslash",
    "/v1/refunds/%255c/admin": "backslash",
    "/v1/refunds//admin": "empty segment",
    "//evil.example/v1/refunds": "empty segment",
    "/v1/refunds/%00": "control character",
    "/v1/refunds/%2500": "control character",
    "/v1/refunds/re_1%0d%0aHost:%20evil": "control character",
    "/v1/refunds/\x00": "space or control character",
    "/v1/refunds/\t": "space or control character",
    "/v1/refunds/a b": "space or control character",
    "/v1/refunds?admin=1": "query parameters",
    "/v1/refunds#admin": "query parameters",
    "v1/refunds": "starting with /",
    # Clean, but outside the allowed prefixes once decoded.
    "/v1/refunds%58": "outside the allowed paths",
    "/v1/%61dmin": "outside the allowed paths",
    "/v1/files": "outside the allowed paths",  # the prefix is /v1/files/
}


@pytest.mark.parametrize("path, reason", PATH_TRICKS.items(), ids=repr)
def test_a_path_that_could_reach_another_path_is_refused_and_nothing_is_sent(
    http, service, path, reason
):
    with pytest.raises(EgressRefused, match=reason) as refused:
        http.get("payments", path)
    assert service.requests == []
    call = EgressCall.objects.get()
    assert (call.outcome, call.error) == ("refused", str(refused.value))
    # Recorded as given; a control character written as its escape (PostgreSQL takes no NUL).
    assert call.path == (path if path.isprintable() else repr(path)[1:-1])


@pytest.mark.parametrize(
    "path, received",
    [
        ("/v1/refunds", "/v1/refunds"),
        ("/v1/refunds/", "/v1/refunds/"),
        ("/v1/refunds/re_1", "/v1/refunds/re_1"),
        ("/v1/refunds/re%5F1", "/v1/refunds/re%5F1"),  # sent as written, matched decoded
        ("/v1/%72efunds/re_1", "/v1/%72efunds/re_1"),
        ("/v1/files/a%20b.pdf", "/v1/files/a%20b.pdf"),
        ("/v1/files/caf%C3%A9", "/v1/files/caf%C3%A9"),
        ("/v1/files/re..1", "/v1/files/re..1"),  # dots inside a name are not a dot segment
        ("/v1/files/.well-known", "/v1/files/.well-known"),
        ("/v1/files/100%25", "/v1/files/100%25"),
    ],
)
def test_a_clean_path_is_matched_decoded_and_sent_as_written(http, service, path, received):
    assert http.get("payments", path).ok
    [request] = service.requests
    assert request["path"] == received


ROUTING_HEADERS = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
    "x-http-method-override",
    "X-Original-URL",
    "X-Rewrite-URL",
    "X-Forwarded-For",
    "X-Forwarded-Host",
    "X-Forwarded-Proto",
    "X-Forwarded-Prefix",
    "x-forwarded-uri",
    "X_Forwarded_Host",  # CGI and WSGI read _ as -
    "Forwarded",
    "X-Real-IP",
    "X-Host",
]


@pytest.mark.parametrize("header", ROUTING_HEADERS)
def test_a_header_that_could_reroute_the_request_is_refused_and_nothing_is_sent(
    http, service, header
):
    with pytest.raises(EgressRefused, match=f"header {header} may not be set.*re-route"):
        http.get("payments", "/v1/refunds", headers={header: "/admin"})
    assert service.requests == []
    assert EgressCall.objects.get().outcome == "refused"


@pytest.mark.parametrize(
    "configured, header",
    [
        ("X-Api-Key", "x_api_key"),
        ("X-Api-Key", " X-API-KEY"),
        ("X_Api_Key", "X_Api_Key"),
        ("X_Api_Key", "x-api-key"),
    ],
)
def test_the_credential_header_cannot_be_set_in_any_spelling(
    settings, service, inbox, configured, header
):
    settings.ALWAYSON_EGRESS_SERVICES = check_services(
        {"keyed": {"base_url": service.url(), "header": configured, "prefix": ""}}
    )
    with pytest.raises(EgressRefused, match="may not be set by an agent"):
        Egress(inbox).get("keyed", "/", headers={header: "mine"})
    assert service.requests == []


@pytest.mark.parametrize(
    "config_path",
    ["/v1/refunds/..;/x", "/v1/%2e%2e", "/v1/refunds%2Fx", "/v1/caf%C3%A9", "/v1//x"],
)
def test_a_configured_prefix_must_be_written_in_its_normal_form(config_path):
    with pytest.raises(ValueError, match="a.paths"):
        check_services({"a": {"base_url": "https://a.example", "paths": [config_path]}})


# --- the same refusals through the gateway as a process -----------------------------------------


@pytest.fixture
def gateway(egress_settings, inbox):
    server = tcp_gateway(0, GATEWAY_TOKEN, inbox)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_the_gateway_process_refuses_the_same_tricks(gateway, service):
    tricks = [
        ("/payments/v1/refunds/..;/admin", {}, "';' path parameter"),
        ("/payments/v1/refunds/%252e%252e/admin", {}, "dot segment"),
        ("/payments/v1/refunds%2F..%2Fadmin", {}, "encoded '/'"),
        ("/payments/v1/refunds", {"X-HTTP-Method-Override": "DELETE"}, "re-route"),
        ("/payments/v1/refunds", {"X-Forwarded-Host": "evil.example"}, "re-route"),
        ("/payments/v1/refunds", {"X-Original-URL": "/admin"}, "re-route"),
    ]
    for path, headers, reason in tricks:
        connection = HTTPConnection("127.0.0.1", gateway, timeout=10)
        connection.request("GET", path, headers={**headers, TOKEN: GATEWAY_TOKEN})
        response = connection.getresponse()
        error = json.loads(response.read())["error"]
        connection.close()
        assert (response.status, reason in error) == (403, True), (path, headers, error)
    assert service.requests == []
    assert EgressCall.objects.filter(outcome="refused").count() == len(tricks)
