"""JSON documents as a policy rule reads a call's arguments: a field named by a JSON Pointer
(or one argument's name), what it finds there (ABSENT when nothing), and JSON's own types and
equality (true is not 1, and 1 is 1.0)."""

import json
import re

INDEX = re.compile(r"0|[1-9][0-9]*")  # an array index in a JSON Pointer
LONE_TILDE = re.compile(r"~(?![01])")


class _Absent:
    def __repr__(self):
        return "absent"


ABSENT = _Absent()


def path(field, where) -> tuple[str, ...]:
    """The segments `field` names: a JSON Pointer's, or one argument's name."""
    if not isinstance(field, str) or not field:
        raise ValueError(
            f"{where}: a field is an argument's name or a JSON Pointer such as /order/amount, "
            f"not {field!r}"
        )
    if not field.startswith("/"):
        return (field,)
    if LONE_TILDE.search(field):
        raise ValueError(
            f"{where}: in a JSON Pointer a ~ is written ~0 and a / inside a name ~1; "
            f"{field!r} has a ~ followed by something else"
        )
    return tuple(s.replace("~1", "/").replace("~0", "~") for s in field[1:].split("/"))


def pointer(segments) -> str:
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in segments)


def lookup(document, segments):
    for segment in segments:
        if isinstance(document, dict):
            document = document.get(segment, ABSENT)
        elif isinstance(document, list) and INDEX.fullmatch(segment):
            index = int(segment)
            document = document[index] if index < len(document) else ABSENT
        else:
            return ABSENT
        if document is ABSENT:
            return ABSENT
    return document


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_type(value) -> str:
    """The JSON type of a value, as JSON Schema names it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def same(a, b) -> bool:
    """JSON equality: true is not 1, and 1 is 1.0."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if is_number(a) and is_number(b):
        return a == b
    return json_type(a) == json_type(b) and a == b


def as_json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def described(value) -> str:
    kind = json_type(value)
    return "null" if kind == "null" else f"{'an' if kind[0] in 'aio' else 'a'} {kind}"
