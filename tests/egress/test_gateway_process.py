"""The gateway as a process answers only its own clients: on its Unix socket, a run that holds
its lease; on its port, a client with the deployment's token. Any other Host is refused
(DNS rebinding), and a refusal sends nothing. Loopback servers only."""

import json
import shutil
import socket
import stat
import tempfile
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from http.client import HTTPConnection
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from alwayson.egress.client import GatewayClient, close_socket_clients, http_for
from alwayson.egress.exceptions import EgressFailed, EgressRefused
from alwayson.egress.gateway import Egress
from alwayson.egress.models import EgressCall
from alwayson.egress.scrub import REDACTED
from alwayson.egress.server import OUTCOME, TOKEN, socket_gateway, tcp_gateway
from inbox.models import Lease
from tests.support.egress import SECRET

pytestmark = pytest.mark.django_db(transaction=True)

GATEWAY_TOKEN = "gateway-token-4b1d9e0c7a2f"


def serving(server):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    return thread


def stop(server, thread):
    close_socket_clients()
    server.shutdown()
    server.server_close()
    thread.join(10)


# --- the port: out-of-process agents with the token ---------------------------------------------


@pytest.fixture
def port_gateway(egress_settings, inbox):
    server = tcp_gateway(0, GATEWAY_TOKEN, inbox)
    thread = serving(server)
    yield server.server_address[1]
    stop(server, thread)


def fetch(port, path, data=None, headers=None, host=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {}
    )
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_port_forwards_with_the_credential_added(port_gateway, service):
    status, _, body = fetch(
        port_gateway,
        "/payments/v1/refunds?order=881",
        data=b'{"amount": 5}',
        headers={"Content-Type": "application/json", TOKEN: GATEWAY_TOKEN},
    )
    assert (status, json.loads(body)) == (200, {"refund": "re_1"})
    [request] = service.requests
    assert request["path"] == "/v1/refunds?order=881"
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert request["body"] == b'{"amount": 5}'
    assert TOKEN not in request["headers"]  # the gateway's own header goes no further


@pytest.mark.parametrize("token", [None, "", "gateway-token-wrong00000", GATEWAY_TOKEN + "x"])
def test_the_port_refuses_a_request_without_the_token(port_gateway, service, token):
    headers = {} if token is None else {TOKEN: token}
    status, answer_headers, body = fetch(port_gateway, "/payments/v1/refunds", b"{}", headers)
    assert status == 401 and TOKEN.encode() in body
    assert answer_headers[OUTCOME] == "refused"
    assert service.requests == [] and not EgressCall.objects.exists()


@pytest.mark.parametrize(
    "host", ["rebind.attacker.example", "rebind.attacker.example:{port}", "127.0.0.1:1", ""]
)
def test_the_port_refuses_a_host_that_is_not_its_own(port_gateway, service, host):
    """DNS rebinding: a web page whose name now resolves to 127.0.0.1 reaches the port with
    its own name as Host. Refused even with the token (a page cannot send it anyway)."""
    status, _, body = fetch(
        port_gateway,
        "/payments/v1/refunds",
        b"{}",
        {TOKEN: GATEWAY_TOKEN},
        host=host.format(port=port_gateway),
    )
    assert status == 403 and b"is not this gateway's" in body
    assert service.requests == []


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}"])
def test_the_port_answers_to_its_own_names(port_gateway, service, host):
    status, _, _ = fetch(
        port_gateway,
        "/payments/v1/refunds",
        b"{}",
        {TOKEN: GATEWAY_TOKEN},
        host=host.format(port=port_gateway),
    )
    assert status == 200 and len(service.requests) == 1


def test_the_port_answers_with_no_echoed_credential_in_status_line_headers_or_body(
    port_gateway, service
):
    connection = HTTPConnection("127.0.0.1", port_gateway, timeout=10)
    connection.request("GET", "/payments/v1/echo", headers={TOKEN: GATEWAY_TOKEN})
    response = connection.getresponse()
    status_line = f"HTTP/1.1 {response.status} {response.reason}"
    headers, seen, body = response.getheaders(), response.getheader("X-Seen"), response.read()
    connection.close()
    assert service.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert SECRET not in status_line + repr(headers) + body.decode()
    assert seen == f"Bearer {REDACTED}"


def test_the_port_refuses_what_the_allowlist_refuses(port_gateway, service):
    auth = {TOKEN: GATEWAY_TOKEN}
    assert fetch(port_gateway, "/payments/v1/customers", headers=auth)[0] == 403
    status, _, body = fetch(
        port_gateway, "/payments/v1/refunds", headers={**auth, "Authorization": "x"}
    )
    assert status == 403 and b"may not be set" in body
    assert fetch(port_gateway, "/nowhere/x", headers=auth)[0] == 403
    assert service.requests == []


def test_runegress_on_a_port_needs_the_token(settings):
    settings.ALWAYSON_EGRESS_TOKEN = ""
    settings.ALWAYSON_EGRESS_SOCKET = ""
    with pytest.raises(CommandError, match="ALWAYSON_EGRESS_TOKEN must be set"):
        call_command("runegress", "--port", "8123")


def test_a_port_gateway_cannot_be_made_without_a_token(inbox):
    with pytest.raises(ValueError, match="ALWAYSON_EGRESS_TOKEN"):
        tcp_gateway(0, "", inbox)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--addr", "0.0.0.0", "--port", "8123"], "loopback"),
        (["--port", "0"], "--port"),
        (["--port", "8123", "--inbox", "no-such-inbox"], "unknown inbox"),
    ],
)
def test_runegress_refuses_bad_arguments(args, message, settings):
    settings.ALWAYSON_EGRESS_PORT = 0
    with pytest.raises(CommandError, match=message):
        call_command("runegress", *args)


# --- the socket: the sealed worker's runs, while they hold their lease ---------------------------


@pytest.fixture
def socket_path():
    # A short path of its own: a Unix socket's name is limited to about 100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="gw-"))
    yield directory / "egress.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sock(egress_settings, socket_path):
    egress_settings.ALWAYSON_EGRESS_SOCKET = str(socket_path)
    server = socket_gateway(socket_path)
    thread = serving(server)
    yield socket_path
    stop(server, thread)


def holding(inbox, holder="worker-1", generation=7, seconds=60):
    """A run of `inbox` that holds its lease, as the worker makes one."""
    Lease.objects.filter(inbox=inbox).update(
        holder=holder, generation=generation, until=timezone.now() + timedelta(seconds=seconds)
    )
    return SimpleNamespace(inbox=inbox, holder=holder, generation=generation)


def test_a_run_that_holds_its_lease_is_served_through_the_socket(sock, service, inbox):
    http = http_for(holding(inbox))
    assert isinstance(http, GatewayClient)
    answer = http.post("payments", "/v1/refunds", json={"order": "881"})
    assert (answer.status, answer.json()) == (200, {"refund": "re_1"})
    [request] = service.requests
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert json.loads(request["body"]) == {"order": "881"}
    assert not any(name.lower().startswith("x-alwayson-") for name in request["headers"])
    # Recorded once, by the gateway, for the run's inbox.
    [call] = EgressCall.objects.all()
    assert (call.inbox_id, call.service, call.outcome, call.status) == (
        inbox.pk,
        "payments",
        "sent",
        200,
    )


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"generation": 8}, id="taken-over"),
        pytest.param({"holder": "worker-2"}, id="another-holder"),
        pytest.param({"until": timezone.now() - timedelta(seconds=1)}, id="expired"),
        pytest.param({"holder": "", "until": None}, id="released"),
    ],
)
def test_a_run_that_lost_its_lease_spends_no_credential(sock, service, inbox, change):
    run = holding(inbox)
    Lease.objects.filter(inbox=inbox).update(**change)
    with pytest.raises(EgressRefused, match="does not hold its lease"):
        http_for(run).post("payments", "/v1/refunds")
    assert service.requests == []


def test_the_allowlist_refuses_through_the_socket_and_the_gateway_records_it(sock, service, inbox):
    http = http_for(holding(inbox))
    with pytest.raises(EgressRefused, match="outside the allowed paths"):
        http.get("payments", "/v1/customers")
    with pytest.raises(EgressRefused, match="not allowed"):
        http.get("nowhere", "/x")
    assert service.requests == []
    assert EgressCall.objects.filter(outcome="refused", inbox=inbox).count() == 2


def test_a_service_that_is_down_fails_through_the_socket(sock, inbox, egress_settings):
    from tests.support.egress import services_for
    from tests.support.processes import free_port

    egress_settings.ALWAYSON_EGRESS_SERVICES = services_for(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(EgressFailed, match="payments /v1/refunds: ConnectError"):
        http_for(holding(inbox)).post("payments", "/v1/refunds")


def test_a_gateway_that_is_not_running_is_a_failure_not_a_crash(
    egress_settings, socket_path, inbox
):
    egress_settings.ALWAYSON_EGRESS_SOCKET = str(socket_path)
    with pytest.raises(EgressFailed, match="is runegress running"):
        http_for(holding(inbox)).post("payments", "/v1/refunds")


def test_the_services_answer_headers_cannot_pose_as_the_gateways(sock, inbox, egress_settings):
    """A service that answers `X-Alwayson-Egress: refused` does not make the client raise."""
    from tests.support.egress import services_for
    from tests.support.loopback import Loopback

    def posing(request):
        return 200, {OUTCOME: "refused", "X-Alwayson-Inbox": "1"}, b'{"error": "fake"}'

    with Loopback(posing) as poser:
        egress_settings.ALWAYSON_EGRESS_SERVICES = services_for(poser.url())
        answer = http_for(holding(inbox)).get("payments", "/v1/refunds")
    assert answer.status == 200 and answer.json() == {"error": "fake"}
    assert not any(name.lower().startswith("x-alwayson-") for name in answer.headers)


def test_the_socket_answers_no_other_host(sock, service, inbox):
    run = holding(inbox)
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(sock))
        client.sendall(
            b"GET /payments/v1/refunds HTTP/1.1\r\nHost: rebind.attacker.example\r\n"
            + f"X-Alwayson-Inbox: {inbox.pk}\r\nX-Alwayson-Holder: {run.holder}\r\n".encode()
            + f"X-Alwayson-Generation: {run.generation}\r\nConnection: close\r\n\r\n".encode()
        )
        reply = client.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 403") and b"is not this gateway's" in reply
    assert service.requests == []


def test_the_socket_is_made_for_its_owner_and_group_only(sock):
    assert stat.S_IMODE(sock.stat().st_mode) == 0o660


def test_a_second_gateway_on_a_live_socket_is_refused(sock):
    with pytest.raises(OSError, match="another gateway is listening"):
        socket_gateway(sock)


def test_a_socket_left_by_a_gateway_that_died_is_replaced(egress_settings, socket_path, inbox):
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(socket_path))
    left.close()  # bound, never listening: what a killed gateway leaves behind
    server = socket_gateway(socket_path)
    thread = serving(server)
    try:
        egress_settings.ALWAYSON_EGRESS_SOCKET = str(socket_path)
        assert http_for(holding(inbox)).get("maps", "/geocode").status == 200
    finally:
        stop(server, thread)


def test_a_path_that_is_not_a_socket_is_left_alone(socket_path):
    socket_path.write_text("precious")
    with pytest.raises(OSError, match="is not a socket"):
        socket_gateway(socket_path)
    assert socket_path.read_text() == "precious"


def test_without_the_socket_setting_a_run_calls_in_process(egress_settings, inbox):
    assert isinstance(http_for(holding(inbox)), Egress)
