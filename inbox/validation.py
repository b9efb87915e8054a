"""Checks shared by every entry point that stores something: they run before any write.

Each raises ValueError naming the argument. A value one database would keep and the other
refuse (a NUL, an over-long key, a lone surrogate) is refused here on both, so an input is
valid or not whatever the engine.
"""

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

MAX_KEY_LENGTH = 255
# A primary key is a 64-bit integer (BigAutoField) on both databases.
MIN_ID, MAX_ID = -(2**63), 2**63 - 1

# Deeper JSON is refused before storing: json.dumps (here, the JSONField) recurses per level,
# on a stack that may already be a request deep, and nothing a sender means nests this far.
# Above a webhook body's limit (inbox/webhooks.py), which the payload wraps.
MAX_JSON_DEPTH = 128
# Larger JSON is refused: one event or timer payload is read whole by every run that claims
# it. Above any webhook body the default ALWAYSON_WEBHOOK_MAX_BYTES lets through.
MAX_JSON_BYTES = 8 * 1024 * 1024

# What PostgreSQL's text and jsonb cannot hold: NUL (psycopg refuses it before sending) and
# unpaired surrogates (not UTF-8). SQLite keeps both; refusing them on both databases gives
# the same answer whatever the engine.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def require_key(field: str, value, max_length: int = MAX_KEY_LENGTH) -> str:
    """A non-blank string that fits its column (`max_length`, the model field's)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, not {_short(value)}")
    if len(value) > max_length:
        raise ValueError(f"{field} is longer than {max_length} characters")
    return require_text(field, value)


def require_text(field: str, value) -> str:
    """A string both databases can store (free text: a reason, an error, a message body)."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, not {_short(value)}")
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL character, which cannot be stored")
    # A surrogate is not ASCII: most text is, and is checked without the search.
    if not value.isascii() and UNSTORABLE.search(value):
        raise ValueError(f"{field} contains a lone surrogate, which cannot be stored")
    return value


def require_json(field: str, value):
    """Plain JSON both databases store as given: no NaN, sets, datetimes or bytes; string
    keys only (json.dumps would turn 1 into "1" and could merge two keys into one); at most
    MAX_JSON_DEPTH levels and MAX_JSON_BYTES bytes."""
    json_text(field, value)
    return value


# json.dumps builds an encoder per call when given options; this one is built once.
_encode = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode


def json_text(field: str, value) -> str:
    """require_json's checks, and the value's compact JSON text (what ingest stores, so the
    value is encoded once)."""
    _walk_containers(field, value)
    try:
        encoded = _encode(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} is not JSON-serialisable: {exc}") from None
    # Every string is in the text: a NUL written as \u0000, a lone surrogate as itself. Only
    # when one may be there are the strings walked, for the error (or to find that the
    # \u0000 was typed as text, which is fine).
    if "\\u0000" in encoded or (not encoded.isascii() and UNSTORABLE.search(encoded)):
        _walk_strings(field, value)
    # A character is at most 4 bytes of UTF-8: only a long text is measured in bytes.
    if len(encoded) > MAX_JSON_BYTES // 4 and len(encoded.encode()) > MAX_JSON_BYTES:
        raise ValueError(f"{field} is larger than {MAX_JSON_BYTES} bytes as JSON")
    return encoded


# The common payload, one object of plain values, is checked without the walk below: its
# keys' and values' types are compared as sets (at C speed, on every delivery).
_KEY_TYPES = frozenset({str})
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _walk_containers(field, value):
    """Depth and keys, iteratively: a deep value is measured without spending the stack it
    would overflow (json.dumps would)."""
    if (
        type(value) is dict
        and _KEY_TYPES.issuperset(map(type, value))
        and _PLAIN_TYPES.issuperset(map(type, value.values()))
    ):
        return
    containers = dict | list | tuple
    stack = [(value, 1)] if isinstance(value, containers) else []
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{field} nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise ValueError(f"{field} has a non-string key {_short(key)}")
            children = item.values()
        else:
            children = item
        stack.extend((child, depth + 1) for child in children if isinstance(child, containers))


def _walk_strings(field, value):
    """The first string (a key or a value) that both databases cannot store; after
    _walk_containers, so depth and keys are known to be fine."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError(f"{field} contains a NUL character, which cannot be stored")
            if UNSTORABLE.search(item):
                raise ValueError(f"{field} contains a lone surrogate, which cannot be stored")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def require_mapping(field: str, value) -> dict:
    mapping_text(field, value)
    return value


def mapping_text(field: str, value) -> str:
    """require_mapping's checks, and the mapping's JSON text (json_text)."""
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object (a dict), not {type(value).__name__}")
    return json_text(field, value)


def require_duration(field: str, value) -> timedelta:
    """Seconds (int or float) or a timedelta, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be seconds or a timedelta, not {_short(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number of seconds, not {value!r}")
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"{field} is out of range: {value!r} seconds") from None


def require_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an int, not {_short(value)}")
    return value


def require_ids(field: str, value) -> list[int]:
    """Primary keys, as a list: an iterable of ints, not a string (whose characters would
    each be taken for an id) and not a single id."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"{field} must be a list of ids, not {_short(value)}")
    ids = list(value)
    for pk in ids:
        if isinstance(pk, bool) or not isinstance(pk, int):
            raise ValueError(f"{field} must be a list of ids (ints), not one of {_short(pk)}")
        if not MIN_ID <= pk <= MAX_ID:
            # SQLite raises OverflowError binding it; no row has such an id anyway.
            raise ValueError(f"{field}: {pk} is out of range for an id")
    return ids


def _short(value) -> str:
    """A value for an error message: a huge argument is named, not echoed whole."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({type(value).__name__})"


def require_now(now) -> datetime:
    """A `now` an operation was given: an aware datetime (a naive one would be read in the
    host's zone, and compare wrongly with the database's clock)."""
    if not isinstance(now, datetime) or timezone.is_naive(now):
        raise ValueError(f"now must be an aware datetime, not {now!r}")
    return now


def alwayson_setting(name: str):
    """Setting `name`, one of alwayson's (alwayson/settings/), as an app's ready() reads it.

    Missing, the project that installs alwayson's apps has not taken alwayson's settings:
    every process stops at start-up saying how to, the first app to read one says so, and
    nothing fails later on a setting no process was started without."""
    try:
        return getattr(settings, name)
    except AttributeError:
        raise ImproperlyConfigured(
            f"{name} is not set, and alwayson's apps read it: add"
            " `from alwayson.settings.embedded import *` to your settings, before your own"
            " values of alwayson's settings (docs/how-to/embed-in-a-project.md)"
        ) from None


def checked_setting(name: str, check, value, expected: str = ""):
    """`check(value)` for setting `name`, its ValueError raised as ImproperlyConfigured naming
    the setting (and what it `expected`). Each app checks its own settings in ready() with
    it: the settings import no app."""
    try:
        return check(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}{expected}: {exc}") from None
