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
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import TYPE_CHECKING
from urllib.parse import quote

from django.db.models.functions import Now

from alwayson.egress import unpack
from alwayson.egress.exceptions import EgressFailed, EgressRefused
from alwayson.egress.models import EgressCall
from alwayson.egress.paths import UncleanPath, normal_path
from alwayson.egress.scrub import REDACTED, scrub, secret_pattern
from alwayson.egress.services import SECRET_SLOT, Service, configured_services

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("alwayson.egress")

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
# Headers that ask the service, or a proxy or framework in front of it, to take the request
# as another method, path, host or client than the allowlist checked: refused, with every
# X-Forwarded-* header.
REROUTING_HEADERS = frozenset(
    {
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-url",
        "x-rewrite-url",
        "forwarded",
        "x-real-ip",
        "x-host",
    }
)
REROUTING_PREFIX = "x-forwarded-"
# Response headers an agent never reads back: they carry session state or hop details.
HIDDEN_RESPONSE_HEADERS = frozenset(
    {"set-cookie", "connection", "keep-alive", "transfer-encoding", "content-encoding"}
)


@dataclass
class EgressResponse:
    """What the service answered, as the agent may see it: no cookies, no credential (see
    scrub): the status, its reason phrase, the headers and the body."""

    status: int
    headers: dict = field(default_factory=dict)
    content: bytes = b""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        # UTF-8 only (a BOM allowed), the encoding scrub matches: json.loads would read a
        # UTF-16 or UTF-32 body too, and hand back a credential the scrub could not see.
        return json.loads(self.content.decode("utf-8-sig"))


class Egress:
    """The client an agent calls through (`run.http`), bound to the inbox it runs for."""

    def __init__(self, inbox=None, services: dict | None = None, transport=None, guard=None):
        """`guard`: called before each call, to refuse it by raising (a run's check_lease: a
        run that lost its lease makes no call, recorded or not)."""
        self.inbox = inbox
        self.slug = getattr(inbox, "slug", inbox)
        self.services = configured_services() if services is None else services
        self._transport = transport
        self._guard = guard

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
        if self._guard is not None:
            self._guard()
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
            message = scrub(str(exc), secret)
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
        try:
            normal = normal_path(path)
        except UncleanPath as exc:
            raise EgressRefused(
                f"{target.name}: path {path!r} is not a clean absolute path: {exc}"
            ) from None
        if not target.allows_path(normal):
            decoded = f" (decoded: {normal})" if normal != path else ""
            raise EgressRefused(
                f"{target.name}: path {path}{decoded} is outside the allowed paths: "
                + ", ".join(target.paths)
            )
        credential_header = _header_key(target.header)
        for name in headers or {}:
            lowered = _header_key(name)
            if lowered in REROUTING_HEADERS or lowered.startswith(REROUTING_PREFIX):
                raise EgressRefused(
                    f"{target.name}: header {name} may not be set by an agent: it could "
                    "re-route the request past the allowlist (method, path or host)"
                )
            if lowered in RESERVED_HEADERS or lowered == credential_header:
                raise EgressRefused(f"{target.name}: header {name} may not be set by an agent")
        if target.query and any(key == target.query for key, _ in _pairs(params)):
            raise EgressRefused(f"{target.name}: query parameter {target.query} is reserved")
        return target

    def _send(self, target, method, path, params, json, content, headers, secret):
        # Imported at the first call, not with the module: httpx (and the command-line tools
        # it loads when they are installed) is a fifth of every manage.py command's start-up,
        # and most processes never call out.
        import httpx

        headers = {str(k): str(v) for k, v in (headers or {}).items()}
        params = _pairs(params)
        base_url = target.base_url
        if target.secret_in_path:
            base_url = base_url.replace(SECRET_SLOT, quote(secret, safe=":"))
        elif secret and target.query:
            params.append((target.query, secret))
        elif secret:
            headers[target.header] = f"{target.prefix}{secret}"
        own = self._transport is not None
        client = _client(self._transport) if own else _shared_client()
        try:
            with (
                client if own else nullcontext(),
                client.stream(
                    method,
                    base_url + path,
                    params=params,
                    json=json,
                    content=content,
                    headers=headers,
                    timeout=target.timeout,
                ) as answer,
            ):
                # The raw bytes: the transfer encoding is decoded by unpack.decode_transfer,
                # whose bound holds inside each chunk too (httpx's decoders have none).
                raw = bytearray()
                for chunk in answer.iter_raw():
                    raw += chunk
                    if len(raw) > target.max_bytes:
                        raise EgressFailed(
                            f"{target.name} {path}: answer larger than {target.max_bytes} bytes"
                        )
                body = _opened(target, answer.headers, bytes(raw), secret, path)
                # Scrubbed as the agent reads them: each header merged and decoded by httpx,
                # the reason phrase, and the body that .text and .json() decode.
                shown = {
                    scrub(name, secret): scrub(value, secret)
                    for name, value in answer.headers.items()
                    if name.lower() not in HIDDEN_RESPONSE_HEADERS
                }
                return EgressResponse(
                    answer.status_code, shown, body, scrub(answer.reason_phrase, secret)
                )
        except httpx.HTTPError as exc:
            # Not str(exc): httpx names the URL, and a query-parameter credential is in it.
            raise EgressFailed(f"{target.name} {path}: {type(exc).__name__}") from None

    def _record(self, service, method, path, outcome, status=None, error=""):
        inbox_id = getattr(self.inbox, "pk", None)
        EgressCall.objects.create(
            inbox_id=inbox_id,
            service=_printable(service)[:50],
            method=_printable(method)[:10],
            path=_printable(path)[:300],
            outcome=outcome,
            status=status,
            error=_printable(error)[:500],
            at=Now(),  # the database's clock, like every other timestamp it keeps
        )


def _opened(target, headers, raw, secret, path) -> bytes:
    """The body as the agent gets it: its transfer encoding decoded, its compressed content
    opened and checked, the credential taken out of every layer (alwayson/egress/unpack.py).
    EgressFailed when it cannot be shown: nothing of it reaches the agent."""
    try:
        body = unpack.decode_transfer(
            raw,
            headers.get("content-encoding", ""),
            unpack.Budget(target.max_bytes, over=f"larger than {target.max_bytes} bytes decoded"),
        )
        if not secret:
            return body
        return unpack.opened_and_scrubbed(
            body,
            unpack.declared(
                headers.get("content-type", ""), headers.get("content-disposition", "")
            ),
            unpack.Credential(secret_pattern(secret), REDACTED.encode()),
            unpack.Budget(target.max_unpacked_bytes),
        )
    except unpack.Withheld as exc:
        raise EgressFailed(f"{target.name} {path}: answer withheld: {exc}") from None


def _header_key(name) -> str:
    """A header's name as servers match it: any case, and `_` as `-` (CGI, WSGI and PHP read
    X_Forwarded_For as X-Forwarded-For)."""
    return str(name).strip().lower().replace("_", "-")


def _printable(value) -> str:
    """A call's text as it is recorded: a character that is not printable as its escape
    (\\x00), since PostgreSQL stores no NUL and the admin should show what was asked."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def _client(transport=None) -> "httpx.Client":
    import httpx

    # No redirects: a 3xx is returned as it is, so an answer can never carry the credential
    # to another host (or another path) that the allowlist did not name. No cookies: a
    # service's Set-Cookie is neither shown to the agent nor sent again, to any inbox.
    return httpx.Client(
        follow_redirects=False,
        trust_env=False,
        transport=transport,
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        # The encodings unpack.decode_transfer decodes: httpx's default names those its own
        # decoders know, which may not be the same.
        headers={"Accept-Encoding": unpack.ACCEPT_ENCODING},
    )


@lru_cache(maxsize=1)
def _shared_client() -> "httpx.Client":
    """One client for the process, shared by its threads: its TLS context is built once and
    connections are kept between calls. It holds no credential: each request carries its own."""
    return _client()


def _pairs(params) -> list:
    """Query parameters as (name, value) pairs, from a mapping or pairs."""
    if not params:
        return []
    items = params.items() if hasattr(params, "items") else params
    return [(str(key), str(value)) for key, value in items]
