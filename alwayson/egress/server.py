"""The egress gateway as a process (`manage.py runegress`): the one process of a sealed
deployment that holds the credentials, serving Egress to clients that hold none.

`<service>/<path>` is forwarded through an Egress (alwayson/egress/gateway.py): the same
allowlist, credential and scrub as in process, and the call is recorded here. Two ways in,
each answering only its own clients:

- a Unix socket (ALWAYSON_EGRESS_SOCKET) for the sealed worker. The socket file's mode and
  directory decide which users may connect at all; each request then names the run it is
  made for (inbox, holder, generation), and is served only while that run holds the inbox's
  lease, so a run that was fenced off cannot spend a credential any more than it can finish.
- 127.0.0.1:PORT (ALWAYSON_EGRESS_PORT) for an agent that runs out of process: each request
  brings ALWAYSON_EGRESS_TOKEN, which a web page cannot set on a cross-origin request.

Both refuse a `Host` that is not the gateway's own, so a page that rebinds its DNS name to
127.0.0.1 is refused before anything is sent. The gateway's own answers (a refusal, a
failure) carry `X-Alwayson-Egress`, which the client reads to tell them from the service's.
"""

import hmac
import json
import os
import socket
import socketserver
import stat
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from django.conf import settings
from django.db import close_old_connections, connection

from alwayson.egress.exceptions import EgressFailed, EgressRefused
from alwayson.egress.gateway import RESERVED_HEADERS, Egress
from alwayson.egress.services import Service, configured_services
from inbox.models import Lease

# The prefix of the gateway's own headers: read here, never forwarded, never passed back.
OWN_HEADERS = "x-alwayson-"
INBOX = "X-Alwayson-Inbox"
HOLDER = "X-Alwayson-Holder"
GENERATION = "X-Alwayson-Generation"
TOKEN = "X-Alwayson-Egress-Token"
OUTCOME = "X-Alwayson-Egress"
# The name the sealed worker's client gives the socket in its URLs (http://egress/...).
SOCKET_HOST = "egress"
# The Messages API, for the sealed worker's Claude agent: a service no configuration can
# name (configured names start with a letter), served on the socket only.
MODEL_SERVICE = "_model"
DEFAULT_MODEL_URL = "https://api.anthropic.com"


class Refusal(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def model_service() -> dict:
    """{MODEL_SERVICE: Service} when this process holds ANTHROPIC_API_KEY, else {}."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return {}
    service = Service(
        name=MODEL_SERVICE,
        base_url=(settings.ANTHROPIC_BASE_URL or DEFAULT_MODEL_URL).rstrip("/"),
        methods=frozenset({"GET", "POST"}),
        paths=("/v1/messages", "/v1/models"),
        secret_env="ANTHROPIC_API_KEY",
        # As the SDK presents it; the sealed worker's SDK sends none (alwayson/claude/client.py).
        header="Authorization",
        prefix="Bearer ",
        timeout=float(settings.ALWAYSON_CLAUDE_TIMEOUT),
        max_bytes=32 * 1024 * 1024,
    )
    return {MODEL_SERVICE: service}


class TokenGate:
    """The TCP port's clients: whoever brings the deployment's token, for one inbox (or the
    services open to every inbox)."""

    def __init__(self, token: str, inbox=None):
        self.token, self.inbox = token, inbox

    def egress(self, headers) -> Egress:
        given = headers.get(TOKEN) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise Refusal(401, f"this gateway answers only requests that bring {TOKEN}")
        return Egress(self.inbox)


class LeaseGate:
    """The socket's clients: a run, served while it holds its inbox's lease."""

    def egress(self, headers, now=None) -> Egress:
        try:
            inbox_id = int(headers.get(INBOX) or "")
            generation = int(headers.get(GENERATION) or "")
        except ValueError:
            raise Refusal(400, f"{INBOX} and {GENERATION} must name the run (integers)") from None
        holder = headers.get(HOLDER) or ""
        lease = Lease.objects.held(inbox_id, holder, generation, now).select_related("inbox")
        lease = lease.first()
        if lease is None:
            raise Refusal(
                403,
                f"inbox {inbox_id}: generation {generation} of {holder!r} does not hold its "
                "lease (taken over or expired); nothing was sent",
            )
        return Egress(lease.inbox, services={**configured_services(), **model_service()})


class GatewayHandler(BaseHTTPRequestHandler):
    """One request from a client of the gateway, forwarded through the Egress its gate
    admits it to."""

    gate: TokenGate | LeaseGate  # set on each server's handler class
    hosts: frozenset = frozenset()  # the Host values this gateway answers to
    max_body = 32 * 1024 * 1024
    protocol_version = "HTTP/1.1"
    # Buffered: the status line, headers and body leave in one write, flushed when the
    # request is done, not as two packets a client's delayed ACK holds back.
    wbufsize = 64 * 1024

    def handle(self):
        # A thread per client connection, which keeps its requests coming (keep-alive): the
        # database connection lives as long, not one per request.
        try:
            super().handle()
        finally:
            connection.close()

    def _handle(self):
        close_old_connections()
        self._forward()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _forward(self):
        host = (self.headers.get("Host") or "").lower()
        if host not in self.hosts:
            # DNS rebinding: a page at rebind.example that now resolves to 127.0.0.1.
            return self._refuse(403, "refused", f"Host {host!r} is not this gateway's")
        try:
            egress = self.gate.egress(self.headers)
        except Refusal as exc:
            return self._refuse(exc.status, "refused", str(exc))
        parts = urlsplit(self.path)
        service, _, rest = parts.path.lstrip("/").partition("/")
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.max_body:
            return self._refuse(413, "refused", f"body larger than {self.max_body} bytes")
        body = self.rfile.read(length) if length else None
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in RESERVED_HEADERS
            and name.lower() != "accept-encoding"
            and not name.lower().startswith(OWN_HEADERS)
        }
        try:
            answer = egress.request(
                service,
                self.command,
                "/" + rest,
                params=parse_qsl(parts.query, keep_blank_values=True),
                content=body,
                headers=headers,
            )
        except EgressRefused as exc:
            return self._refuse(403, "refused", str(exc))
        except EgressFailed as exc:
            return self._refuse(502, "failed", str(exc))
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            lowered = name.lower()
            if lowered not in ("content-length", "date", "server") and not lowered.startswith(
                OWN_HEADERS
            ):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.content)

    def _refuse(self, status, outcome, message):
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        # The body may be unread: this connection carries no further request, and says so,
        # so that a client's pool does not send the next one on it.
        self.send_header("Connection", "close")
        self.send_header(OUTCOME, outcome)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        pass  # Egress logs each call, without the query string; the default would print it


def _handler(gate, hosts):
    return type("BoundGatewayHandler", (GatewayHandler,), {"gate": gate, "hosts": hosts})


def tcp_gateway(port: int, token: str, inbox=None, host="127.0.0.1") -> ThreadingHTTPServer:
    """The gateway on host:port for out-of-process agents that bring `token`."""
    if not token:
        raise ValueError("ALWAYSON_EGRESS_TOKEN must be set to serve the gateway on a port")
    server = ThreadingHTTPServer((host, port), _handler(TokenGate(token, inbox), frozenset()))
    bound = server.server_address[1]
    names = {host, "127.0.0.1", "localhost", "[::1]"}
    server.RequestHandlerClass.hosts = frozenset(
        {f"{name}:{bound}" for name in names} | ({*names} if bound == 80 else set())
    )
    server.daemon_threads = True
    return server


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def socket_gateway(path, mode=0o660) -> _UnixHTTPServer:
    """The gateway on the Unix socket `path` for sealed workers; OSError if another gateway
    listens there or the path is something else."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink()  # left by a gateway that did not exit cleanly
        else:
            raise OSError(f"another gateway is listening on {path}")
        finally:
            probe.close()
    # The socket is created with the umask's mode: never, even for a moment, wider than asked.
    previous = os.umask(0o777 & ~mode)
    try:
        server = _UnixHTTPServer(str(path), _handler(LeaseGate(), frozenset({SOCKET_HOST})))
    finally:
        os.umask(previous)
    os.chmod(path, mode)
    return server
