"""`run.http` as a run gets it: the gateway in this process, or, in a sealed worker, the
`runegress` process over its Unix socket (alwayson/egress/server.py).

Both take the same calls and answer the same way (an EgressResponse, EgressRefused,
EgressFailed), so an agent does not know which one it has. The sealed client holds nothing
worth stealing: the services' allowlist (which names no secret) to describe them, and the
run's lease, which the gateway checks on every call.
"""

import json as jsonlib
import threading
from typing import TYPE_CHECKING

from django.conf import settings

from alwayson.egress.exceptions import EgressFailed, EgressRefused
from alwayson.egress.gateway import Egress, EgressResponse
from alwayson.egress.server import GENERATION, HOLDER, INBOX, OUTCOME, SOCKET_HOST
from alwayson.egress.services import configured_services

if TYPE_CHECKING:
    import httpx

# Beyond a service's own timeout: the gateway's lease check and the two local hops.
HOP_MARGIN = 5.0


def http_for(run):
    """The egress client for `run` (anything with inbox, holder and generation; with a
    `check_lease`, it is called before every call)."""
    if settings.ALWAYSON_EGRESS_SOCKET:
        return GatewayClient(settings.ALWAYSON_EGRESS_SOCKET, run)
    return Egress(run.inbox, guard=getattr(run, "check_lease", None))


def run_headers(run) -> dict:
    """What names `run` to the gateway, which serves it only while it holds the lease."""
    return {INBOX: str(run.inbox.pk), HOLDER: run.holder, GENERATION: str(run.generation)}


_clients: dict[str, "httpx.Client"] = {}
_clients_lock = threading.Lock()


def socket_client(path) -> "httpx.Client":
    """One client per socket for the process, shared by its slots (httpx's pool is
    thread-safe): no TLS to set up on a local socket, connections kept between calls."""
    import httpx  # here, not with the module: see Egress._send

    with _clients_lock:
        client = _clients.get(str(path))
        if client is None:
            transport = httpx.HTTPTransport(uds=str(path), verify=False)
            client = _clients[str(path)] = httpx.Client(transport=transport, trust_env=False)
        return client


def close_socket_clients():
    """Hang up every kept connection to a gateway: each holds one of its threads, and that
    thread's database connection, until then (a test that stops its gateway calls this)."""
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


class GatewayClient:
    """Egress's calls, made by the gateway process for this run."""

    def __init__(self, socket_path, run):
        self.socket_path = socket_path
        self.inbox = run.inbox
        self.slug = run.inbox.slug
        self._headers = run_headers(run)
        self._services = configured_services()
        self._guard = getattr(run, "check_lease", None)

    def get(self, service, path, **kwargs) -> EgressResponse:
        return self.request(service, "GET", path, **kwargs)

    def post(self, service, path, **kwargs) -> EgressResponse:
        return self.request(service, "POST", path, **kwargs)

    def allowed_names(self) -> list[str]:
        return sorted(s.name for s in self._services.values() if s.allows_inbox(self.slug))

    def allowed(self) -> list[str]:
        return [self._services[name].describe() for name in self.allowed_names()]

    def request(
        self, service, method, path, *, params=None, json=None, content=None, headers=None
    ) -> EgressResponse:
        if self._guard is not None:
            # Before the gateway's own check of the lease, which needs the database.
            self._guard()
        if not isinstance(path, str) or not path.startswith("/"):
            raise EgressRefused(f"{service}: path {path!r} is not a clean absolute path")
        headers = {str(k): str(v) for k, v in (headers or {}).items()}
        if json is not None:
            content = jsonlib.dumps(json).encode()
            headers.setdefault("Content-Type", "application/json")
        target = self._services.get(service) if isinstance(service, str) else None
        timeout = (target.timeout if target else 10.0) + HOP_MARGIN
        # The path goes as it is: the gateway normalises it and decides, and a refusal is
        # recorded there with the rest of the deployment's calls.
        url = f"http://{SOCKET_HOST}/{service}{path}"
        import httpx  # here, not with the module: see Egress._send

        try:
            answer = socket_client(self.socket_path).request(
                str(method).upper(),
                url,
                params=params,
                content=content,
                headers={**headers, **self._headers},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            raise EgressFailed(
                f"the egress gateway at {self.socket_path} could not be reached "
                f"({type(exc).__name__}); is runegress running?"
            ) from None
        outcome = answer.headers.get(OUTCOME)
        if outcome is not None:
            try:
                message = answer.json()["error"]
            except (ValueError, KeyError, TypeError):
                message = answer.text
            raise (EgressRefused if outcome == "refused" else EgressFailed)(message)
        shown = {name: value for name, value in answer.headers.items() if name != "content-length"}
        return EgressResponse(answer.status_code, shown, answer.content, answer.reason_phrase)
