"""Checks shared by every entry point that stores something: they run before any write."""

import json
import re
from datetime import timedelta

MAX_KEY_LENGTH = 255

# What PostgreSQL's text and jsonb cannot hold: NUL (psycopg refuses it before sending) and
# unpaired surrogates (not UTF-8). SQLite keeps both; refusing them on both databases gives
# the same answer whatever the engine.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def require_key(field: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, not {value!r}")
    if len(value) > MAX_KEY_LENGTH:
        raise ValueError(f"{field} is longer than {MAX_KEY_LENGTH} characters")
    return value


def require_json(field: str, value):
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} is not JSON-serialisable: {exc}") from None
    _require_storable_strings(field, value)
    return value


def _require_storable_strings(field, value):
    """PostgreSQL's jsonb refuses NUL characters and lone surrogates that SQLite would keep;
    refuse them on both, so a payload is valid or not whatever the database."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{field} contains a NUL character, which cannot be stored")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{field} contains a lone surrogate, which cannot be stored") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _require_storable_strings(field, key)
            _require_storable_strings(field, item)
    elif isinstance(value, list | tuple):
        for item in value:
            _require_storable_strings(field, item)


def require_mapping(field: str, value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object (a dict), not {type(value).__name__}")
    return require_json(field, value)


def require_duration(field: str, value) -> timedelta:
    """Seconds (int or float) or a timedelta, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be seconds or a timedelta, not {value!r}")
    return timedelta(seconds=value)
