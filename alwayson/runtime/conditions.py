"""The language of a policy rule's `when`: which field of a call's arguments, and what it
must be. The reference, with examples, is docs/reference/policy-rules.md.

    {"currency": "EUR"}                                  a top-level argument, by its name
    {"/order/amount": {"gt": 500}}                       a nested field: a JSON Pointer
    {"/email": {"regex": "[a-z.]+@example\\.com"}}       the whole string must match
    {"/items": {"any": {"/amount": {"gt": 500}}}}        some element of a list
    {"/items": {"all": {"/sku": {"prefix": "BOOK-"}}}}   every element (and there is one)

A field is a JSON Pointer (RFC 6901: `/order/amount`, `/items/0`; `~1` stands for a `/` and
`~0` for a `~` inside a name) or a top-level argument's exact name. A dotted `order.amount`
is not a path: an argument's name may contain dots, so schemas.check_against() refuses it,
naming the pointer to write.

Judging is three-valued: a condition holds, fails, or cannot be judged (the field is absent,
its value is of a type the operator does not take, a string is too long for a regex, `all`
meets an empty list). The policy (policy.decide) never lets a call through on a condition it
could not judge.
"""

import operator

from .json_values import ABSENT, as_json, described, is_number, lookup, path, same
from .patterns import MAX_MATCHED, compiled

ORDERING = {"lt": operator.lt, "lte": operator.le, "gt": operator.gt, "gte": operator.ge}
MEMBERSHIP = ("in", "not_in")
QUANTIFIERS = ("any", "all")
OPERATORS = ("eq", "ne", *ORDERING, *MEMBERSHIP, "prefix", "regex", "exists", *QUANTIFIERS)
DEFAULT = "default"  # beside the operators: the value an absent field is judged as


def is_pointers(condition) -> bool:
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
    if op in ORDERING and not (is_number(operand) or isinstance(operand, str)):
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
    if not is_pointers(condition):
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


# --- judging a call -------------------------------------------------------------------------


def judge(when: dict, document, at: str = "") -> tuple[bool | None, str]:
    """Whether every condition of `when` holds on `document` (a call's arguments, or one
    element of a list at `at`): True, False, or None when one could not be judged and none
    failed, with the reason for None."""
    return _every(
        _holds(condition, lookup(document, path(field, "when")), _shown(at, field))
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
    return _every(_apply(op, operand, value, shown) for op, operand in operations(condition))


def operations(condition):
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
        return same(value, operand) == (op == "eq"), ""
    if op in MEMBERSHIP:
        return any(same(value, item) for item in operand) == (op == "in"), ""
    if op in ORDERING:
        if (is_number(value) and is_number(operand)) or (
            isinstance(value, str) and isinstance(operand, str)
        ):
            return ORDERING[op](value, operand), ""
        kind = "strings" if isinstance(operand, str) else "numbers"
        return None, f"{shown} is {described(value)}; {op} {as_json(operand)} compares {kind}"
    if op in ("prefix", "regex") and not isinstance(value, str):
        return None, f"{shown} is {described(value)}, not a string"
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
            return None, f"{shown} is {described(value)}, not a list"
        if op == "all" and not value:
            return None, f"{shown} is an empty list, so no element shows what all of them are"
        outcomes = (_element(operand, item, f"{shown}/{i}") for i, item in enumerate(value))
        return (_some if op == "any" else _every)(outcomes)
    return None, f"unknown operator {op!r}"  # a policy stored without its check


def _element(condition, item, shown):
    if is_pointers(condition):
        return judge(condition, item, at=shown)
    return _holds(condition, item, shown)
