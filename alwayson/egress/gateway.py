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
import re
import unicodedata
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from http.cookiejar import CookieJar, DefaultCookiePolicy
from itertools import product
from urllib.parse import quote, unquote, urlsplit

import httpx
from django.conf import settings
from django.db.models.functions import Now

from alwayson.egress import unpack
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
    # What the compressed content of one answer may open to, all layers together
    # (alwayson/egress/unpack.py): past it the answer is withheld.
    max_unpacked_bytes: int = 1024 * 1024

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
        max_unpacked = config.get("max_unpacked_bytes", 1024 * 1024)
        for key, value in (
            ("timeout", timeout),
            ("max_bytes", max_bytes),
            ("max_unpacked_bytes", max_unpacked),
        ):
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
            max_unpacked_bytes=int(max_unpacked),
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


class UncleanPath(ValueError):
    """A path the gateway will not send: the message says why, in words an agent can act on."""


def normal_path(path) -> str:
    """The path as the service reads it, whatever it decodes: percent-decoded until it stops
    changing. The allowlist is matched on this form, and the path is sent as written.

    Refused (UncleanPath): a path not starting with `/`; `?` or `#` (the query goes in
    params); a literal space or control character; escapes that are not UTF-8; and, in the
    decoded form, also after Unicode compatibility folding (fullwidth `．` and `／` are `.`
    and `/` to some servers): an IIS `%uXXXX` escape, a control character or NUL, a
    backslash, a `;` path parameter (`..;` is `..` to Tomcat), a `/` that was encoded, an
    empty segment (`//`) or a dot segment (`.`, `..`, or only dots and spaces, which Windows
    servers trim to nothing). Then every decoding a server may stop at has the same
    segments, and none of them climbs out of its prefix."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise UncleanPath("it must be a string starting with /")
    if "?" in path or "#" in path:
        raise UncleanPath("? and # are not part of a path: pass query parameters as params=")
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in path):
        raise UncleanPath("it has a literal space or control character: percent-encode it (%20)")
    decoded = path
    try:
        while (once_more := unquote(decoded, errors="strict")) != decoded:
            decoded = once_more
    except UnicodeDecodeError:
        raise UncleanPath(
            "it has percent-escapes that are not UTF-8 (such as an overlong %c0%ae)"
        ) from None
    folded = unicodedata.normalize("NFKC", decoded)
    if re.search("%u[0-9a-f]{4}", folded, re.IGNORECASE):
        raise UncleanPath("it has an IIS %uXXXX escape: write the character in UTF-8 (%XX)")
    if any(unicodedata.category(ch) == "Cc" for ch in folded):
        raise UncleanPath("it has a control character or NUL once percent-decoded")
    if "\\" in folded:
        raise UncleanPath("it has a backslash once percent-decoded")
    if ";" in folded:
        raise UncleanPath("it has a ';' path parameter once percent-decoded")
    # Decoding and folding only ever add slashes: one more is a separator that was encoded.
    if folded.count("/") != path.count("/"):
        raise UncleanPath("it has an encoded '/' (%2F, or a look-alike once decoded)")
    if "//" in folded:
        raise UncleanPath("it has an empty segment (//)")
    if any(segment and not segment.strip(" .") for segment in folded.split("/")):
        raise UncleanPath("it has a dot segment ('.' or '..') once percent-decoded")
    return decoded


def _unsafe_path(path) -> str:
    """Why a configured path prefix is refused, or "": it must be its own normal form, so
    it means what it says (`/v1/café`, not `/v1/caf%C3%A9`)."""
    try:
        normal = normal_path(path)
    except UncleanPath as exc:
        return str(exc)
    return "" if normal == path else "write it percent-decoded"


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
            unpack.Credential(_secret_pattern(secret), REDACTED.encode()),
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


def _client(transport=None) -> httpx.Client:
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
def _shared_client() -> httpx.Client:
    """One client for the process, shared by its threads (httpx's pool is thread-safe): its
    TLS context is built once (loading the CA bundle took ~30 ms a call) and connections are
    kept between calls. It holds no credential: each request carries its own."""
    return _client()


def _pairs(params) -> list:
    """Query parameters as (name, value) pairs, from a mapping or pairs."""
    if not params:
        return []
    items = params.items() if hasattr(params, "items") else params
    return [(str(key), str(value)) for key, value in items]


def scrub(data, secret):
    """`data` (str or bytes) with the credential replaced by REDACTED in every form a service
    may write it back in, wherever an answer reaches the agent: body, headers, reason phrase,
    an EgressFailed message. A str is matched as its UTF-8 bytes."""
    if not secret or not isinstance(data, str | bytes):
        return data
    pattern, redacted = _secret_pattern(secret), REDACTED.encode()
    if isinstance(data, bytes):
        return pattern.sub(redacted, data)
    return pattern.sub(redacted, data.encode("utf-8", "surrogatepass")).decode(
        "utf-8", "surrogatepass"
    )


@lru_cache(maxsize=16)
def _secret_pattern(secret: str) -> re.Pattern:
    """The credential as a service may echo it: each character literal or escaped (see
    _chars), so raw, percent-encoded (quote or quote_plus, either case of hex, also %25XX
    double-encoded), JSON-escaped (\\uXXXX either case, \\/, fully or in part) and HTML
    character references, mixed in any way; or its base64 (_base64), each base64 character
    escaped the same ways. Not covered: other text encodings (UTF-16, hex, MIME base64 broken
    into lines), and an echo a service transforms further (hashed, reversed, split)."""
    data = secret.encode()
    forms = [b"".join(_chars(ch) for ch in secret)]
    # Under 6 bytes, the base64 forms are too few characters not to match unrelated text.
    if len(data) >= 6:
        forms += _base64(data)
    return re.compile(b"|".join(forms))


_HTML_NAMES = {
    "&": "amp",
    "<": "lt",
    ">": "gt",
    '"': "quot",
    "'": "apos",
    "/": "sol",
    "+": "plus",
    "=": "equals",
}
_JSON_SHORT = {
    "/": "/",
    '"': '"',
    "\\": "\\",
    "\b": "b",
    "\f": "f",
    "\n": "n",
    "\r": "r",
    "\t": "t",
}


def _hex(value: int, digits: int = 0) -> bytes:
    """`value` in hexadecimal as a pattern matching either case, with optional leading 0s."""
    text = f"{value:0{digits}x}" if digits else "0*" + f"{value:x}"
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in text).encode()


def _chars(chars) -> bytes:
    """A pattern for any one of `chars` as a service may write it. Each form starts with its
    own byte (the character, %, \\, & or +), so a position that starts none fails fast."""
    literal, percent, backslash, reference = [], [], [], []
    for char in chars:
        code, utf8 = ord(char), char.encode()
        literal.append(re.escape(utf8))
        percent.append(b"%(?:25)?".join(_hex(byte, 2) for byte in utf8))
        units = [code]
        if code > 0xFFFF:  # JSON writes it as a surrogate pair
            high, low = divmod(code - 0x10000, 0x400)
            units = [0xD800 + high, 0xDC00 + low]
        backslash.append(b"u" + rb"\\u".join(_hex(unit, 4) for unit in units))
        if char in _JSON_SHORT:
            backslash.append(re.escape(_JSON_SHORT[char].encode()))
        reference += [f"#0*{code}".encode(), b"#[xX]" + _hex(code)]
        if char in _HTML_NAMES:
            reference.append(_HTML_NAMES[char].encode())
    forms = [
        b"(?:" + b"|".join(literal) + b")",
        b"%(?:25)?(?:" + b"|".join(percent) + b")",
        rb"\\(?:" + b"|".join(backslash) + b")",
        b"&(?:" + b"|".join(reference) + b");",
    ]
    if " " in chars:
        forms.append(rb"\+")
    return b"(?:" + b"|".join(forms) + b")"


_BASE64_ALPHABETS = (
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
)


def _base64(data: bytes) -> list[bytes]:
    """Patterns for `data` inside base64 text (standard and urlsafe, padded or not) at each
    of the three alignments it can have there: `Basic user:secret` puts it after a prefix of
    any length. A base64 character that mixes the secret's bits with its neighbours' matches
    any of the characters those neighbours could make, so the match takes every character
    that carries a bit of the secret."""
    patterns = []
    for alphabet in _BASE64_ALPHABETS:
        for offset in range(3):
            bits = "?" * 8 * offset + "".join(f"{byte:08b}" for byte in data)
            bits += "?" * (-len(bits) % 6)
            chars = []
            for start in range(0, len(bits), 6):
                window = bits[start : start + 6]
                if window == "??????":
                    continue  # the prefix's alone
                choices = product(*("01" if bit == "?" else bit for bit in window))
                values = sorted({int("".join(choice), 2) for choice in choices})
                chars.append(_chars([alphabet[value] for value in values]))
            patterns.append(b"".join(chars) + _chars("=") + b"{0,2}")
    return patterns
