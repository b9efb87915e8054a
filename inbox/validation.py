"""Checks shared by every entry point that stores something: they run before any write."""

import json

MAX_KEY_LENGTH = 255


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
    return value


def require_mapping(field: str, value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object (a dict), not {type(value).__name__}")
    return require_json(field, value)
