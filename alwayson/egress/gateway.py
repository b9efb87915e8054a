"""The egress gateway: every outbound HTTP call an agent makes passes one allowlist, which
adds a credential the agent never sees.

An agent holds no token. It names a service and a path (`run.http.post("payments",
"/v1/refunds", json=...)`); the gateway checks the service's allowed methods, path prefixes
and inboxes, reads the credential from the environment at call time, adds it, and returns
what the service answered with the credential scrubbed out. Nothing it refuses leaves the
process. A prompt injected into a webhook can make an agent call a tool, never hand it the
secret: the secret is in no transcript, message, tool argument, log line or table.

In one process (development, the tests) the agent's code could read the environment this
gateway reads, so it is trusted code. A sealed worker (alwayson/egress/sealing.py) holds no
credential: its `run.http` reaches this gateway in the `runegress` process
(alwayson/egress/server.py, alwayson/egress/client.py), as an out-of-process agent does.
"""

import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import httpx
from django.conf import settings
from django.db.models.functions import Now

from alwayson.egress.models import EgressCall

log = logging.getLogger("alwayson.egress")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
NAME = re.compile(r"[a-z][a-z0-9_-]{0,49}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REDACTED = "[redacted]"
SECRET_SLOT = "{secret}"
# Headers an agent may not set: the transport's own, and anything that could redirect the
# request or smuggle a second credential past the one the gateway adds.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "connection",
        "content-length",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "keep-alive",
        "cookie",
    }
)
# Response headers an agent never reads back: they carry session state or hop details.
HIDDEN_RESPONSE_HEADERS = frozenset(
    {"set-cookie", "connection", "keep-alive", "transfer-encoding", "content-encoding"}
)


class EgressRefused(Exception):
    """The gateway refused the call before anything left the process; the message says why
    in words an agent (or a model reading a tool result) can act on."""


class EgressFailed(Exception):
    """The call was allowed but did not get an answer: a timeout, a refused connection, a
    response over the size limit, or a credential missing from the environment."""


@dataclass(frozen=True)
class Service:
    """One outside service an agent may call, from ALWAYSON_EGRESS_SERVICES."""

    name: str
    base_url: str
    methods: frozenset = frozenset({"GET"})
    paths: tuple = ("/",)
    # The credential: the environment variable that holds it, read at call time, and where
    # it goes: `header` with `prefix` before it, the query parameter `query`, or in place of
    # `{secret}` in base_url (APIs such as Telegram's that put the token in the path).
    secret_env: str = ""
    header: str = "Authorization"
    prefix: str = "Bearer "
    query: str = ""
    inboxes: frozenset = frozenset()  # slugs allowed to call it; empty: every inbox
    timeout: float = 10.0
    max_bytes: int = 1024 * 1024

    @classmethod
    def from_config(cls, name, config) -> "Service":
        """A Service from its JSON configuration; ValueError naming the field otherwise."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"service name {name!r}: lowercase letters, digits, - and _")
        if not isinstance(config, dict):
            raise ValueError(f"{name}: expected an object, not {type(config).__name__}")
        known = set(cls.__dataclass_fields__) - {"name"}
        unknown = set(config) - known
        if unknown:
            raise ValueError(f"{name}: unknown field(s) {sorted(unknown)}")
        base = config.get("base_url")
        parts = urlsplit(base) if isinstance(base, str) else None
        if not parts or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{name}.base_url must be an http(s) URL, not {base!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"{name}.base_url must not carry a query, fragment or user")
        if SECRET_SLOT in base and not config.get("secret_env"):
            raise ValueError(f"{name}.base_url has {SECRET_SLOT} but no secret_env fills it")
        methods = config.get("methods", ["GET"])
        if not isinstance(methods, list) or not methods:
            raise ValueError(f"{name}.methods must be a non-empty list")
        methods = frozenset(str(m).upper() for m in methods)
        if not methods <= METHODS:
            raise ValueError(f"{name}.methods: {sorted(methods - METHODS)} not among {METHODS}")
        paths = config.get("paths", ["/"])
        if not isinstance(paths, list) or not paths:
            raise ValueError(f"{name}.paths must be a non-empty list of path prefixes")
        for path in paths:
            if not isinstance(path, str) or not path.startswith("/") or _unsafe_path(path):
                raise ValueError(f"{name}.paths: {path!r} is not a clean absolute path")
        secret_env = config.get("secret_env", "")
        if secret_env and not (isinstance(secret_env, str) and ENV_NAME.fullmatch(secret_env)):
            raise ValueError(f"{name}.secret_env must name an environment variable")
        header = config.get("header", "Authorization")
        query = config.get("query", "")
        prefix = config.get("prefix", "Bearer ")
        for key, value in (("header", header), ("query", query), ("prefix", prefix)):
            if not isinstance(value, str):
                raise ValueError(f"{name}.{key} must be a string")
        inboxes = config.get("inboxes", [])
        if not isinstance(inboxes, list) or not all(isinstance(s, str) for s in inboxes):
            raise ValueError(f"{name}.inboxes must be a list of inbox slugs")
        timeout, max_bytes = config.get("timeout", 10.0), config.get("max_bytes", 1024 * 1024)
        for key, value in (("timeout", timeout), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name}.{key} must be a positive number, not {value!r}")
        return cls(
            name=name,
            base_url=base.rstrip("/"),
            methods=methods,
            paths=tuple(paths),
            secret_env=secret_env,
            header=header,
            prefix=prefix,
            query=query,
            inboxes=frozenset(inboxes),
            timeout=float(timeout),
            max_bytes=int(max_bytes),
        )

    @property
    def secret_in_path(self) -> bool:
        return SECRET_SLOT in self.base_url

    def allows_inbox(self, slug) -> bool:
        return not self.inboxes or slug in self.inboxes

    def allows_path(self, path) -> bool:
        return any(
            path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")
            for prefix in self.paths
        )

    def describe(self) -> str:
        """What the admin and the agent may see: never the credential, nor where it lives."""
        methods = ",".join(sorted(self.methods))
        return f"{self.name}: {methods} {self.base_url} {' '.join(self.paths)}"

    def credential(self) -> str:
        if not self.secret_env:
            return ""
        secret = os.environ.get(self.secret_env, "")
        if not secret:
            raise EgressFailed(f"service {self.name} has no credential configured")
        return secret


def check_services(config) -> dict:
    """ALWAYSON_EGRESS_SERVICES as {name: Service}; ValueError naming the field otherwise.
    A value that is a Service already (as a test or a caller builds them) is kept."""
    if not isinstance(config, dict):
        raise ValueError("expected a JSON object of services by name")
    return {
        name: item if isinstance(item, Service) else Service.from_config(name, item)
        for name, item in config.items()
    }


# The setting's value and its Services: the settings hold the JSON, parsed once per value.
_services = (None, {})


def configured_services() -> dict:
    """The services agents may call: ALWAYSON_EGRESS_SERVICES as {name: Service}. Checked at
    start-up by the app's ready(); parsed again only when the setting is given a new value."""
    global _services
    configured = settings.ALWAYSON_EGRESS_SERVICES
    seen, checked = _services
    if seen is not configured:
        checked = check_services(configured)
        _services = (configured, checked)
    return checked


def _unsafe_path(path) -> bool:
    """A path that could leave its prefix once a server decodes or normalises it."""
    lowered = path.lower()
    if any(bad in lowered for bad in ("\\", "%2e", "%2f", "%5c", "%00", "?", "#", "//")):
        return True
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in path):
        return True
    return posixpath.normpath(path) != path.rstrip("/") and path != "/"


@dataclass
class EgressResponse:
    """What the service answered, as the agent may see it: no cookies, no credential."""

    status: int
    headers: dict = field(default_factory=dict)
    content: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.content)


class Egress:
    """The client an agent calls through (`run.http`), bound to the inbox it runs for."""

    def __init__(self, inbox=None, services: dict | None = None, transport=None):
        self.inbox = inbox
        self.slug = getattr(inbox, "slug", inbox)
        self.services = configured_services() if services is None else services
        self._transport = transport

    def get(self, service, path, **kwargs) -> EgressResponse:
        return self.request(service, "GET", path, **kwargs)

    def post(self, service, path, **kwargs) -> EgressResponse:
        return self.request(service, "POST", path, **kwargs)

    def allowed_names(self) -> list[str]:
        return sorted(s.name for s in self.services.values() if s.allows_inbox(self.slug))

    def allowed(self) -> list[str]:
        """The services this inbox may call, described for an agent or a model."""
        return [self.services[name].describe() for name in self.allowed_names()]

    def request(
        self, service, method, path, *, params=None, json=None, content=None, headers=None
    ) -> EgressResponse:
        method = str(method).upper()
        try:
            target = self._check(service, method, path, params, headers)
        except EgressRefused as exc:
            self._record(service, method, path, "refused", error=str(exc))
            log.warning("egress refused: %s", exc)
            raise
        secret = ""
        try:
            secret = target.credential()
            response = self._send(target, method, path, params, json, content, headers, secret)
        except EgressFailed as exc:
            message = _scrub(str(exc), secret)
            self._record(target.name, method, path, "failed", error=message)
            log.warning("egress failed: %s %s %s: %s", target.name, method, path, message)
            raise EgressFailed(message) from None
        self._record(target.name, method, path, "sent", status=response.status)
        log.info("egress %s %s %s -> %s", target.name, method, path, response.status)
        return response

    def _check(self, service, method, path, params, headers) -> Service:
        target = self.services.get(service) if isinstance(service, str) else None
        if target is None or not target.allows_inbox(self.slug):
            names = ", ".join(self.allowed_names()) or "none"
            raise EgressRefused(f"service {service!r} is not allowed (allowed: {names})")
        if method not in target.methods:
            raise EgressRefused(f"{target.name}: method {method} is not allowed")
        if not isinstance(path, str) or not path.startswith("/") or _unsafe_path(path):
            raise EgressRefused(f"{target.name}: path {path!r} is not a clean absolute path")
        if not target.allows_path(path):
            raise EgressRefused(f"{target.name}: path {path} is outside the allowed paths")
        for name in headers or {}:
            lowered = str(name).lower()
            if lowered in RESERVED_HEADERS or lowered == target.header.lower():
                raise EgressRefused(f"{target.name}: header {name} may not be set by an agent")
        if target.query and any(key == target.query for key, _ in _pairs(params)):
            raise EgressRefused(f"{target.name}: query parameter {target.query} is reserved")
        return target

    def _send(self, target, method, path, params, json, content, headers, secret):
        headers = {str(k): str(v) for k, v in (headers or {}).items()}
        params = _pairs(params)
        base_url = target.base_url
        if target.secret_in_path:
            base_url = base_url.replace(SECRET_SLOT, quote(secret, safe=":"))
        elif secret and target.query:
            params.append((target.query, secret))
        elif secret:
            headers[target.header] = f"{target.prefix}{secret}"
        # No redirects: a 3xx is returned as it is, so an answer can never carry the
        # credential to another host (or another path) that the allowlist did not name.
        client = httpx.Client(
            timeout=target.timeout,
            follow_redirects=False,
            trust_env=False,
            transport=self._transport,
        )
        try:
            with (
                client,
                client.stream(
                    method,
                    base_url + path,
                    params=params,
                    json=json,
                    content=content,
                    headers=headers,
                ) as answer,
            ):
                body = bytearray()
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > target.max_bytes:
                        raise EgressFailed(
                            f"{target.name} {path}: answer larger than {target.max_bytes} bytes"
                        )
                shown = {
                    name: _scrub(value, secret)
                    for name, value in answer.headers.items()
                    if name.lower() not in HIDDEN_RESPONSE_HEADERS
                }
                return EgressResponse(answer.status_code, shown, _scrub_bytes(bytes(body), secret))
        except httpx.HTTPError as exc:
            # Not str(exc): httpx names the URL, and a query-parameter credential is in it.
            raise EgressFailed(f"{target.name} {path}: {type(exc).__name__}") from None

    def _record(self, service, method, path, outcome, status=None, error=""):
        inbox_id = getattr(self.inbox, "pk", None)
        EgressCall.objects.create(
            inbox_id=inbox_id,
            service=str(service)[:50],
            method=method[:10],
            path=str(path)[:300],
            outcome=outcome,
            status=status,
            error=error[:500],
            at=Now(),  # the database's clock, like every other timestamp it keeps
        )


def _pairs(params) -> list:
    """Query parameters as (name, value) pairs, from a mapping or pairs."""
    if not params:
        return []
    items = params.items() if hasattr(params, "items") else params
    return [(str(key), str(value)) for key, value in items]


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, REDACTED) if secret and isinstance(text, str) else text


def _scrub_bytes(data: bytes, secret: str) -> bytes:
    return data.replace(secret.encode(), REDACTED.encode()) if secret else data
