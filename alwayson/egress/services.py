"""The outside services agents may call (ALWAYSON_EGRESS_SERVICES), checked once per value
of the setting: each one's URL, methods, path prefixes, inboxes, limits and where its
credential lives."""

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from alwayson.egress.exceptions import EgressFailed
from alwayson.egress.paths import unsafe_path

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
NAME = re.compile(r"[a-z][a-z0-9_-]{0,49}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_SLOT = "{secret}"


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
            if not isinstance(path, str) or not path.startswith("/") or unsafe_path(path):
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
