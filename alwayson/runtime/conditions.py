"""The language of a policy rule's `when`: which field of a call's arguments, and what it
must be. The reference, with examples, is docs/reference/policy-rules.md.

    {"currency": "EUR"}                                  a top-level argument, by its name
    {"/order/amount": {"gt": 500}}                       a nested field: a JSON Pointer
    {"/email": {"regex": "[a-z.]+@example\\.com"}}       the whole string must match
    {"/items": {"any": {"/amount": {"gt": 500}}}}        some element of a list
    {"/items": {"all": {"/sku": {"prefix": "BOOK-"}}}}   every element (and there is one)

A field is a JSON Pointer (RFC 6901: `/order/amount`, `/items/0`; `~1` stands for a `/` and
`~0` for a `~` inside a name) or, as before pointers, a top-level argument's exact name. A
dotted `order.amount` is not a path: an argument's name may contain dots, so it could mean
either, and check_against() refuses it, naming the pointer to write.

Judging is three-valued: a condition holds, fails, or cannot be judged (the field is absent,
its value is of a type the operator does not take, a string is too long for a regex, `all`
meets an empty list). The policy (policy.decide) never lets a call through on a condition it
could not judge.
"""

import json
import operator
import re
from functools import lru_cache
from re import _constants as sre
from re import _parser as sre_parser  # the stdlib's own parser: a pattern's structure

# A regex runs on Python's backtracking matcher, which has no timeout: the bounds below keep
# the worst case of any accepted pattern on any accepted argument to milliseconds (a pattern
# at the step limit takes about 30 ms on a 1,000-character worst case, where `.*a.*a.*a.*c`
# took two minutes).
MAX_PATTERN = 200  # characters of a pattern
MAX_MATCHED = 1000  # characters of an argument a regex is tried on; a longer one is not judged
MAX_STEPS = 10**7  # backtracking paths a pattern may have on a MAX_MATCHED-character argument

ORDERING = {"lt": operator.lt, "lte": operator.le, "gt": operator.gt, "gte": operator.ge}
MEMBERSHIP = ("in", "not_in")
QUANTIFIERS = ("any", "all")
OPERATORS = ("eq", "ne", *ORDERING, *MEMBERSHIP, "prefix", "regex", "exists", *QUANTIFIERS)
DEFAULT = "default"  # beside the operators: the value an absent field is judged as

INDEX = re.compile(r"0|[1-9][0-9]*")  # an array index in a JSON Pointer
LONE_TILDE = re.compile(r"~(?![01])")


class _Absent:
    def __repr__(self):
        return "absent"


ABSENT = _Absent()


# --- fields ---------------------------------------------------------------------------------


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


def _pointer(segments) -> str:
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in segments)


def _lookup(document, segments):
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


def _is_pointers(condition) -> bool:
    """A condition of `any` or `all` that tests fields of each element, not the element."""
    return (
        isinstance(condition, dict)
        and bool(condition)
        and all(isinstance(k, str) and k.startswith("/") for k in condition)
    )


# --- syntax ---------------------------------------------------------------------------------


def check_when(where, when):
    """`when` if well formed; ValueError naming the rule, the field and the operator."""
    if not isinstance(when, dict):
        raise ValueError(f"{where} when must be an object of argument conditions")
    for field, condition in when.items():
        place = f"{where} when[{field!r}]"
        path(field, place)
        _check_condition(place, condition)


def _check_condition(where, condition):
    if not isinstance(condition, dict):
        return  # a bare value: equality
    if not set(condition) - {DEFAULT}:
        raise ValueError(f"{where} names no operator")
    if DEFAULT in condition and "exists" in condition:
        raise ValueError(f"{where}: default gives an absent field a value, so exists cannot hold")
    for op, operand in condition.items():
        if op != DEFAULT:
            _check_operator(where, op, operand)


def _check_operator(where, op, operand):
    if op not in OPERATORS:
        raise ValueError(
            f"{where}: unknown operator {op!r}; use {', '.join(OPERATORS)} (and {DEFAULT}, "
            f"the value an absent field is judged as)"
        )
    if op in ORDERING and not (_number(operand) or isinstance(operand, str)):
        raise ValueError(f"{where}: {op} needs a number or a string, not {operand!r}")
    if op in MEMBERSHIP and not isinstance(operand, list):
        raise ValueError(f"{where}: {op} needs a list, not {operand!r}")
    if op == "prefix" and not (isinstance(operand, str) and operand):
        raise ValueError(f"{where}: prefix needs a non-empty string, not {operand!r}")
    if op == "regex":
        if not isinstance(operand, str):
            raise ValueError(f"{where}: regex needs a pattern (a string), not {operand!r}")
        try:
            compiled(operand)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if op == "exists" and not isinstance(operand, bool):
        raise ValueError(f"{where}: exists needs true or false, not {operand!r}")
    if op in QUANTIFIERS:
        _check_element(f"{where} {op}", operand)


def _check_element(where, condition):
    if not _is_pointers(condition):
        for key in condition if isinstance(condition, dict) else ():
            if str(key).startswith("/"):
                raise ValueError(
                    f"{where}: {key!r} is a JSON Pointer beside operators; test the fields of "
                    f"each element or the element itself, not both"
                )
            if key not in (*OPERATORS, DEFAULT):
                raise ValueError(
                    f"{where}: {key!r} is neither an operator nor a JSON Pointer; to test a "
                    f"field of each element, write '/{key}'"
                )
        _check_condition(where, condition)
        return
    for field, inner in condition.items():
        place = f"{where}[{field!r}]"
        path(field, place)
        _check_condition(place, inner)


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> re.Pattern:
    """The pattern compiled, once per process; ValueError if it is too long, does not
    compile, or could backtrack for too long (see MAX_STEPS)."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(
            f"regex is {len(pattern)} characters long; a pattern is at most {MAX_PATTERN}"
        )
    try:
        parsed = sre_parser.parse(pattern)
        result = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None
    steps = _steps(parsed, pattern)
    if steps > MAX_STEPS:
        raise ValueError(
            f"regex {pattern!r} could backtrack through about {steps:.0e} paths on a "
            f"{MAX_MATCHED}-character argument, more than {MAX_STEPS:.0e}: use at most two "
            f"repeats (*, +, {{m,n}}) with a few alternatives or optional parts beside them"
        )
    return result


_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


def _steps(items, pattern) -> int:
    """An upper bound on the paths a backtracking matcher may try: each repeat multiplies
    them by the lengths it can take, an alternation by its alternatives. A repeated part that
    itself varies (`(a+)+`, `(\\w+\\s?)*`, `(ab|a)*`) is exponential in the argument's length,
    so it is refused outright."""
    total = 1
    for op, av in items:
        if op in _REPEATS:
            low, high, item = av
            inner = _steps(item, pattern)
            if high > 1 and inner > 1:
                raise ValueError(
                    f"regex {pattern!r} repeats a part that itself repeats or alternates "
                    f"(like (a+)+ or (ab|a)*), which can take exponential time; write the "
                    f"repeated part as a fixed sequence or a character class"
                )
            total *= (min(high, MAX_MATCHED) - min(low, MAX_MATCHED) + 1) * inner
        elif op is sre.BRANCH:
            total *= sum(_steps(alternative, pattern) for alternative in av[1])
        elif op is sre.SUBPATTERN:
            total *= _steps(av[3], pattern)
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            total *= _steps(av[1], pattern)
        elif op is sre.ATOMIC_GROUP:
            total *= _steps(av, pattern)
        elif op is sre.GROUPREF_EXISTS:
            total *= _steps(av[1], pattern) + (_steps(av[2], pattern) if av[2] else 1)
    return total


# --- judging a call -------------------------------------------------------------------------


def judge(when: dict, document, at: str = "") -> tuple[bool | None, str]:
    """Whether every condition of `when` holds on `document` (a call's arguments, or one
    element of a list at `at`): True, False, or None when one could not be judged and none
    failed, with the reason for None."""
    return _every(
        _holds(condition, _lookup(document, path(field, "when")), _shown(at, field))
        for field, condition in when.items()
    )


def _shown(at, field) -> str:
    return at + field if field.startswith("/") or at else field


def _every(outcomes) -> tuple[bool | None, str]:
    unjudged = None
    for held, why in outcomes:
        if held is False:
            return False, ""
        if held is None and unjudged is None:
            unjudged = why
    return (True, "") if unjudged is None else (None, unjudged)


def _some(outcomes) -> tuple[bool | None, str]:
    unjudged = None
    for held, why in outcomes:
        if held is True:
            return True, ""
        if held is None and unjudged is None:
            unjudged = why
    return (False, "") if unjudged is None else (None, unjudged)


def _holds(condition, value, shown) -> tuple[bool | None, str]:
    if value is ABSENT and isinstance(condition, dict):
        value = condition.get(DEFAULT, ABSENT)
    return _every(_apply(op, operand, value, shown) for op, operand in _checks(condition))


def _checks(condition):
    """A condition's (operator, operand) pairs: a bare value is equality."""
    if not isinstance(condition, dict):
        return [("eq", condition)]
    return [(op, operand) for op, operand in condition.items() if op != DEFAULT]


def _apply(op, operand, value, shown) -> tuple[bool | None, str]:
    if op == "exists":
        return (value is not ABSENT) == operand, ""
    if value is ABSENT:
        return None, f"{shown} is absent"
    if op in ("eq", "ne"):
        return _same(value, operand) == (op == "eq"), ""
    if op in MEMBERSHIP:
        return any(_same(value, item) for item in operand) == (op == "in"), ""
    if op in ORDERING:
        if (_number(value) and _number(operand)) or (
            isinstance(value, str) and isinstance(operand, str)
        ):
            return ORDERING[op](value, operand), ""
        kind = "strings" if isinstance(operand, str) else "numbers"
        return None, f"{shown} is {_described(value)}; {op} {_json(operand)} compares {kind}"
    if op in ("prefix", "regex") and not isinstance(value, str):
        return None, f"{shown} is {_described(value)}, not a string"
    if op == "prefix":
        return value.startswith(operand), ""
    if op == "regex":
        if len(value) > MAX_MATCHED:
            return None, f"{shown} is longer than {MAX_MATCHED} characters, too long for a regex"
        try:
            return compiled(operand).fullmatch(value) is not None, ""
        except (TypeError, ValueError) as exc:  # a policy stored without its check
            return None, f"{shown}: {exc}"
    if op in QUANTIFIERS:
        if not isinstance(value, list):
            return None, f"{shown} is {_described(value)}, not a list"
        if op == "all" and not value:
            return None, f"{shown} is an empty list, so no element shows what all of them are"
        outcomes = (_element(operand, item, f"{shown}/{i}") for i, item in enumerate(value))
        return (_some if op == "any" else _every)(outcomes)
    return None, f"unknown operator {op!r}"  # a policy stored without its check


def _element(condition, item, shown):
    if _is_pointers(condition):
        return judge(condition, item, at=shown)
    return _holds(condition, item, shown)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value) -> str:
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


def _same(a, b) -> bool:
    """JSON equality: true is not 1, and 1 is 1.0."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if _number(a) and _number(b):
        return a == b
    return _kind(a) == _kind(b) and a == b


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _described(value) -> str:
    kind = _kind(value)
    return "null" if kind == "null" else f"{'an' if kind[0] in 'aio' else 'a'} {kind}"


# --- fitting a tool's JSON Schema -----------------------------------------------------------


def check_against(where, tool, when, schema):
    """Refuse a condition that cannot hold on any arguments `schema` (the tool's JSON Schema
    input) accepts: a field it does not have, an operator on a type the field cannot be
    (prefix on a number, a regex on an integer), a value the field can never equal. Only what
    certainly cannot match is refused: where the schema does not say, the rule stands."""
    for field, condition in when.items():
        place = f"{where} tests {field!r}"
        node, always = _field(place, tool, field, schema, schema)
        _fits(place, tool, field, condition, node, always, schema)


def _field(where, tool, field, node, root, within=""):
    """The schema of `field` under `node` (the tool's input, or an element of the list
    `within`), and whether the schema makes the field always present."""
    segments = path(field, where)
    always, walked = True, ""
    for segment in segments:
        child, required = _child(node, segment, root)
        if child is None:
            raise ValueError(
                _not_in_schema(where, tool, field, segment, node, root, walked, within)
            )
        always = always and required
        node, walked = child, walked + _pointer([segment])
    return node, always


def _not_in_schema(where, tool, field, segment, node, root, walked, within) -> str:
    fields = ", ".join(sorted(_fields(node, root))) or "none"
    if not walked and not within and not field.startswith("/"):
        hint = ""
        nested = _pointer(field.split("."))
        if "." in field and _resolves(nested, root):
            hint = f"; for the nested field write {nested!r}"
        return f"{where}, which {tool} does not take; its arguments: {fields}{hint}"
    place = (
        (f"an element of {within!r}" + (f" at {walked}" if walked else "")) if within else walked
    )
    if "array" in (_types(node, root) or ()):
        return (
            f"{where}, which {tool} does not take: {place} is a list; name an element by its "
            f"index ({walked or field}/0) or test its elements with any or all"
        )
    return (
        f"{where}, which {tool} does not take: {place or 'its input'} has no field "
        f"{segment!r}; its fields: {fields}"
    )


def _resolves(field, root) -> bool:
    node = root
    for segment in path(field, "field"):
        node, _ = _child(node, segment, root)
        if node is None:
            return False
    return True


def _deref(node, root):
    """`node` with a local $ref ("#/$defs/...") followed; {} (says nothing) for another."""
    for _ in range(32):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        ref = node["$ref"]
        target = _lookup(root, path(ref[1:], "$ref")) if ref.startswith("#/") else ABSENT
        if not isinstance(target, dict):
            return {}
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return {}


def _branches(node):
    for key in ("anyOf", "oneOf", "allOf"):
        yield from node.get(key) or []


def _child(node, segment, root):
    """The schema of `segment` under `node` (None if the schema has no such field) and
    whether `node` requires it."""
    node = _deref(node, root)
    if not isinstance(node, dict):
        return None, False
    found, required = [], False
    properties = node.get("properties")
    if isinstance(properties, dict) and segment in properties:
        found.append(properties[segment])
        required = segment in (node.get("required") or [])
    else:
        for pattern, schema in (node.get("patternProperties") or {}).items():
            if re.search(pattern, segment):
                found.append(schema)
        if not found and isinstance(node.get("additionalProperties"), dict):
            found.append(node["additionalProperties"])
    if INDEX.fullmatch(segment):
        fixed, index = node.get("prefixItems") or [], int(segment)
        if index < len(fixed):
            found.append(fixed[index])
        elif isinstance(node.get("items"), dict):
            found.append(node["items"])
    for branch in _branches(node):
        child, _ = _child(branch, segment, root)
        if child is not None:
            found.append(child)
    if not found:
        return None, False
    return (found[0] if len(found) == 1 else {"anyOf": found}), required


def _fields(node, root) -> set:
    node = _deref(node, root)
    if not isinstance(node, dict):
        return set()
    names = set(node.get("properties") or {})
    for branch in _branches(node):
        names |= _fields(branch, root)
    return names


def _types(node, root) -> set | None:
    """The JSON types `node` allows; None when the schema does not say."""
    node = _deref(node, root)
    if not isinstance(node, dict):
        return None
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    if "const" in node:
        return {_kind(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_kind(value) for value in node["enum"]}
    either = [*(node.get("anyOf") or []), *(node.get("oneOf") or [])]
    if not either:
        return None
    kinds = [_types(branch, root) for branch in either]
    return None if None in kinds else set().union(*kinds)


def _takes(types, kind) -> bool:
    return types is None or kind in types or (kind == "integer" and "number" in types)


def _can_be(node, value, root) -> bool:
    node = _deref(node, root)
    if not _takes(_types(node, root), _kind(value)):
        return False
    if not isinstance(node, dict):
        return True
    if "const" in node and not _same(value, node["const"]):
        return False
    values = node.get("enum")
    return not isinstance(values, list) or any(_same(value, v) for v in values)


def _element_schema(node, root) -> dict:
    node = _deref(node, root)
    if not isinstance(node, dict):
        return {}
    schemas = [*(node.get("prefixItems") or [])]
    if isinstance(node.get("items"), dict):
        schemas.append(node["items"])
    schemas += [
        _element_schema(b, root) for b in _branches(node) if "array" in (_types(b, root) or ())
    ]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas} if schemas else {}


def _fits(where, tool, shown, condition, node, always, root):
    """Refuse what `condition` cannot match on the field `shown` whose schema is `node`."""
    types = _types(node, root)
    field_is = f"the schema says {' or '.join(sorted(types))}" if types else ""
    default = condition.get(DEFAULT, ABSENT) if isinstance(condition, dict) else ABSENT
    if default is not ABSENT and not _can_be(node, default, root):
        raise ValueError(
            f"{where}: default {_json(default)} is not a value the field can be: "
            f"{field_is or 'the schema does not allow it'}" + _choices(node, root)
        )
    for op, operand in _checks(condition):
        values = [operand] if op in ("eq", "ne") else operand if op in MEMBERSHIP else []
        for value in values:
            if not _can_be(node, value, root):
                because = field_is or "the schema does not allow that value"
                raise ValueError(
                    f"{where}: {op} {_json(value)} can never match: {because}"
                    + _choices(node, root)
                )
        if op in ORDERING:
            kind = "string" if isinstance(operand, str) else "number"
            if not (_takes(types, kind) or (kind == "number" and _takes(types, "integer"))):
                raise ValueError(f"{where}: {op} {_json(operand)} compares {kind}s, but {field_is}")
        if op in ("prefix", "regex") and not _takes(types, "string"):
            raise ValueError(f"{where}: {op} needs a string field, but {field_is}")
        if op == "exists" and operand is False and always:
            raise ValueError(f"{where}: exists false can never hold: the schema requires it")
        if op in QUANTIFIERS:
            if not _takes(types, "array"):
                raise ValueError(f"{where}: {op} needs a list field, but {field_is}")
            element = _element_schema(node, root)
            if not _is_pointers(operand):
                _fits(f"{where} {op}", tool, shown, operand, element, False, root)
                continue
            for field, inner in operand.items():
                place = f"{where} {op} {field!r}"
                inner_node, _ = _field(place, tool, field, element, root, within=shown)
                _fits(place, tool, field, inner, inner_node, False, root)


def _choices(node, root) -> str:
    node = _deref(node, root)
    if isinstance(node, dict) and isinstance(node.get("enum"), list):
        return f" (one of {', '.join(_json(v) for v in node['enum'])})"
    return ""
