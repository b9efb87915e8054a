"""The environment, and every parser a setting is read with.

Each parser refuses a malformed value with ImproperlyConfigured naming the variable: a typo
stops the process at start-up instead of being read as a default (manage.py prints the
message, which says what to set, as one line and exits 1). The settings modules read the
environment only through these, so every variable is checked the same way.

Only what needs no application code is checked here; values whose check needs an app's code
(webhook secrets, egress services, the Claude policy) are read as plain data and checked in
that app's ready().
"""

import os
import re
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent

_environ = environ.Env()
# Into os.environ, not only into these parsers: the egress gateway and the chat channels read
# their credentials from the environment at each call, and a .env file must reach them too.
# Not in the sealed worker, whose environment was cleaned of credentials on purpose while
# the file may hold them (alwayson/egress/sealing.py).
if os.environ.get("ALWAYSON_SEALED_WORKER") != "1":
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# The most each kind of duration setting takes: far beyond any sane value, and far inside
# what a timedelta added to a datetime, a sleep, or PostgreSQL's millisecond timeouts (a 32-bit
# integer: about 24 days) can hold. A larger value stops start-up instead of passing `check`
# and failing later (`prune` with an OverflowError). docs/reference/settings.md lists them.
MAX_WAIT = 3600  # a timeout, a lock wait, a signature's tolerance, a heartbeat: an hour
MAX_HOLD = 86400  # a lease, a connection's age, a transaction left idle: a day
MAX_INTERVAL = 30 * 86400  # a gap between sends, a backoff, a cool-off, an alert's: 30 days
MAX_WINDOW = 365 * 86400  # the time a person has to answer an approval: a year
MAX_HSTS = 2 * 365 * 86400  # the HSTS max-age: two years, longer than browsers keep one
MAX_RETENTION_DAYS = 3650  # how long prune keeps a finished row: ten years

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def string(name, default=""):
    return _environ.str(name, default=default)


def string_list(name, default):
    """Comma-separated; set but empty is an empty list, unset is `default`."""
    return _environ.list(name, default=default)


def items(name):
    """Comma-separated and stripped, empty items kept: the setting's check names an empty one
    ("a,,b") instead of the list quietly shrinking."""
    raw = string(name)
    if not raw.strip():
        return []
    return [item.strip() for item in raw.split(",")]


def strict_bool(name, default):
    """django-environ reads any unknown word as False; a typo in DEBUG must not pass silently."""
    raw = string(name, str(default)).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of true/false/1/0/yes/no/on/off, not {raw!r}")


def integer(name, default):
    try:
        return _environ.int(name, default=default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer: {exc}") from None


def positive_int(name, default):
    value = integer(name, default)
    if value <= 0:
        raise ImproperlyConfigured(f"{name} must be a positive integer, not {value}")
    return value


def non_negative_int(name, default):
    """positive_int, where 0 is a choice too (SECURE_HSTS_SECONDS=0: no HSTS header)."""
    if string(name, str(default)).strip() == "0":
        return 0
    return positive_int(name, default)


def optional_positive_int(name):
    """None when unset or empty: a limit nobody set is no limit."""
    if not string(name).strip():
        return None
    return positive_int(name, None)


def _within(name, value, minimum, maximum, unit):
    if not minimum <= value <= maximum:
        raise ImproperlyConfigured(
            f"{name} must be from {minimum} to {maximum} {unit}, not {value}"
        )
    return value


def whole(name, default, minimum, maximum, unit):
    """A whole number from `minimum` to `maximum` of `unit` (named in the error)."""
    return _within(name, integer(name, default), minimum, maximum, unit)


def seconds(name, default, maximum):
    """Whole seconds, from 1 to `maximum` (one of the MAX_ kinds above)."""
    return _within(name, positive_int(name, default), 1, maximum, "seconds")


def seconds_or_zero(name, default, maximum):
    """seconds, where 0 is a choice too (SECURE_HSTS_SECONDS=0: no HSTS header)."""
    return _within(name, non_negative_int(name, default), 0, maximum, "seconds")


def positive_seconds(name, default, maximum):
    """Seconds, fractions allowed, more than 0 and at most `maximum`."""
    # Python's float, not django-environ's, which drops what is not a digit: 1e12 read as 112.
    raw = string(name, str(default)).strip()
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number of seconds, not {raw!r}") from None
    if not 0 < value <= maximum:  # NaN and infinity too
        raise ImproperlyConfigured(
            f"{name} must be more than 0 and up to {maximum} seconds, not {value}"
        )
    return value


def days(name, default, minimum=1):
    """A retention: whole days, from `minimum` to MAX_RETENTION_DAYS."""
    return _within(name, positive_int(name, default), minimum, MAX_RETENTION_DAYS, "days")


def optional_days(name, minimum):
    """None when unset or empty: kept forever."""
    if not string(name).strip():
        return None
    return days(name, 0, minimum=minimum)


def one_of(name, choices, default):
    """One of `choices`, in any case and with spaces around it."""
    value = string(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def subset(name, choices, default):
    """A comma-separated list of some of `choices` (or none)."""
    values = string_list(name, default)
    if not set(values) <= set(choices):
        raise ImproperlyConfigured(
            f"{name} must list kinds among {','.join(choices)} (or be empty), not {values!r}"
        )
    return values


def json_value(name, default, like=None):
    """The variable's JSON, as data; `like` shows the expected shape in the error."""
    try:
        return _environ.json(name, default=default)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        if like:
            raise ImproperlyConfigured(f"{name} must be JSON like {like}: {exc}") from None
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def lists_by_key(name, what):
    """A JSON object whose values are lists, a single string standing for a list of one:
    `{"desk": ["a", "b"], "ops": "c"}`. The items themselves are the setting's to check."""
    try:
        config = _environ.json(name, default={})
        if not isinstance(config, dict):
            raise ValueError(f"expected a JSON object of {what}")
        return {
            key: [value] if isinstance(value, str) else list(value) for key, value in config.items()
        }
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def http_url(name, default):
    url = _environ.url(name, default=default)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ImproperlyConfigured(f"{name} must be an http(s) URL, not {url.geturl()!r}")
    return url.geturl()


def database_config(name, url):
    """Django's DATABASES entry for `url` (django-environ's reading of it)."""
    try:
        return environ.Env.db_url_config(url)
    except (KeyError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name} is not a usable database URL: {exc}") from None


def email_config(name, default):
    """django-environ's reading of an email URL (EMAIL_BACKEND, EMAIL_HOST, ...)."""
    try:
        return _environ.email_url(name, default=default)
    except (KeyError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name} is not a usable email URL: {exc}") from None


def proxy_ssl_header(name):
    """`HTTP_X_FORWARDED_PROTO,https`: the header (as Django names it in request.META) and the
    value by which the proxy in front says the request came over HTTPS. Only set it behind a
    proxy that always sets or strips that header, or any client can claim HTTPS."""
    raw = string(name).strip()
    if not raw:
        return None
    header, _, value = (part.strip() for part in raw.partition(","))
    if not re.fullmatch(r"HTTP_[A-Z0-9_]+", header) or not value or "," in value:
        raise ImproperlyConfigured(
            f"{name} must be a request.META header and a value, like "
            f"HTTP_X_FORWARDED_PROTO,https; not {raw!r}"
        )
    return (header, value)


def trusted_origins(name):
    origins = string_list(name, [])
    for origin in origins:
        if not re.fullmatch(r"https?://[^/\s]+", origin):
            raise ImproperlyConfigured(
                f"{name} must be comma-separated origins like https://example.com "
                f"(scheme and host, no path); not {origin!r}"
            )
    return origins


def bearer_token(name):
    """A secret a client brings as `Authorization: Bearer ...`; empty when unset."""
    token = string(name).strip()
    if token and (len(token) < 16 or re.search(r"\s", token)):
        raise ImproperlyConfigured(
            f"{name} must be at least 16 characters without spaces "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or unset"
        )
    return token
