"""The policy's rule language (alwayson/runtime/conditions.py, docs/reference/policy-rules.md):
what each operator decides, nested fields, lists, absent fields, the regex bounds, and the
refusal of a rule that cannot match its tool's JSON Schema, through check_policy and
AgentConfig.full_clean(). The agent end to end and the admin form are in
tests/claude/test_claude_policy_rules.py."""

import json
import re

import pytest
from django.core.exceptions import ValidationError

from alwayson.runtime.models import AgentConfig
from alwayson.runtime.patterns import MAX_MATCHED, MAX_PATTERN, compiled
from alwayson.runtime.policy import check_policy, check_policy_syntax, decide
from alwayson.runtime.tools import BUILTINS
from tests.support.paths import ROOT
from tests.support.policy_tools import SCHEMA

TOOL = "refund_items"
OFFERED = {TOOL: SCHEMA}


def order(**fields):
    """Arguments of a refund_items call: an order (id 1) and whatever else is given."""
    return {"order": {"id": "1", **fields.pop("order", {})}, **fields}


def verdict(rules, arguments):
    policy = check_policy({TOOL: rules}, OFFERED)
    return decide(policy, TOOL, arguments, default="ask")


# --- each operator, in an allow, an ask and a deny rule ----------------------------------------

# (field, condition, arguments on which it holds, arguments on which it fails)
OPERATORS = [
    (
        "eq bare",
        "/order/currency",
        "EUR",
        order(order={"currency": "EUR"}),
        order(order={"currency": "USD"}),
    ),
    ("eq", "/count", {"eq": 3}, order(count=3), order(count=4)),
    (
        "eq number",
        "/order/amount",
        {"eq": 3},
        order(order={"amount": 3.0}),
        order(order={"amount": 3.5}),
    ),
    (
        "ne",
        "/order/currency",
        {"ne": "USD"},
        order(order={"currency": "EUR"}),
        order(order={"currency": "USD"}),
    ),
    (
        "lt",
        "/order/amount",
        {"lt": 50},
        order(order={"amount": 49.99}),
        order(order={"amount": 50}),
    ),
    (
        "lte",
        "/order/amount",
        {"lte": 50},
        order(order={"amount": 50}),
        order(order={"amount": 50.01}),
    ),
    (
        "gt",
        "/order/amount",
        {"gt": 500},
        order(order={"amount": 500.5}),
        order(order={"amount": 500}),
    ),
    (
        "gte",
        "/order/amount",
        {"gte": 500},
        order(order={"amount": 500}),
        order(order={"amount": 499}),
    ),
    ("lt string", "/email", {"lt": "m"}, order(email="a@x.org"), order(email="z@x.org")),
    ("between", "/count", {"gte": 2, "lte": 4}, order(count=4), order(count=5)),
    ("in", "/order/id", {"in": ["1", "2"]}, order(), order(order={"id": "3"})),
    ("not_in", "/order/id", {"not_in": ["2", "3"]}, order(), order(order={"id": "3"})),
    (
        "prefix",
        "/email",
        {"prefix": "ops-"},
        order(email="ops-7@x.org"),
        order(email="x-ops-7@x.org"),
    ),
    (
        "regex is anchored at both ends",
        "/email",
        {"regex": r"[a-z0-9.]+@example\.com"},
        order(email="ann.lee@example.com"),
        order(email="ann@example.com.attacker.net"),
    ),
    (
        "regex alternatives",
        "/email",
        {"regex": r".*@(example|corp)\.com"},
        order(email="a@corp.com"),
        order(email="a@corp.co"),
    ),
    ("exists", "/email", {"exists": True}, order(email="a@x.org"), order()),
    ("exists false", "/email", {"exists": False}, order(), order(email="a@x.org")),
    ("bare name", "count", 3, order(count=3), order(count=2)),
    ("a name with a dot", "a.b", "x", order(**{"a.b": "x"}), order(**{"a.b": "y"})),
    (
        "escaped pointer",
        "/metadata/a~1b~0c",
        "v",
        order(metadata={"a/b~c": "v"}),
        order(metadata={"a/b~c": "w"}),
    ),
    (
        "array index",
        "/items/1/sku",
        "B",
        order(items=[{"sku": "A"}, {"sku": "B"}]),
        order(items=[{"sku": "B"}, {"sku": "A"}]),
    ),
    (
        "any",
        "/items",
        {"any": {"/amount": {"gt": 500}}},
        order(items=[{"sku": "A", "amount": 5}, {"sku": "B", "amount": 501}]),
        order(items=[{"sku": "A", "amount": 5}, {"sku": "B", "amount": 500}]),
    ),
    (
        "all",
        "/items",
        {"all": {"/sku": {"prefix": "BOOK-"}}},
        order(items=[{"sku": "BOOK-1"}, {"sku": "BOOK-2"}]),
        order(items=[{"sku": "BOOK-1"}, {"sku": "DVD-2"}]),
    ),
    (
        "any of strings",
        "/tags",
        {"any": {"in": ["fraud", "chargeback"]}},
        order(tags=["vip", "fraud"]),
        order(tags=["vip"]),
    ),
    (
        "all of strings",
        "/tags",
        {"all": {"regex": "[a-z]+"}},
        order(tags=["vip", "new"]),
        order(tags=["vip", "N3W"]),
    ),
]


@pytest.mark.parametrize(
    ("field", "condition", "holds", "fails"),
    [pytest.param(*case[1:], id=case[0]) for case in OPERATORS],
)
@pytest.mark.parametrize(
    ("then", "otherwise"), [("allow", "deny"), ("ask", "allow"), ("deny", "allow")]
)
def test_each_operator_decides_in_an_allow_an_ask_and_a_deny_rule(
    field, condition, holds, fails, then, otherwise
):
    rules = [{"when": {field: condition}, "then": then}, {"then": otherwise}]
    held = verdict(rules, holds)
    assert (held.verdict, held.because) == (then, f"policy for {TOOL}, rule 1: {then}")
    assert verdict(rules, fails).verdict == otherwise


def test_every_condition_of_a_rule_must_hold():
    rules = [
        {"when": {"/order/currency": "EUR", "/order/amount": {"lt": 50}}, "then": "allow"},
        {"then": "deny"},
    ]
    assert verdict(rules, order(order={"currency": "EUR", "amount": 10})).verdict == "allow"
    assert verdict(rules, order(order={"currency": "USD", "amount": 10})).verdict == "deny"
    assert verdict(rules, order(order={"currency": "EUR", "amount": 90})).verdict == "deny"


def test_existing_top_level_rules_decide_as_before():
    rules = [
        {"when": {"count": {"lt": 5}}, "then": "allow"},
        {"when": {"email": {"in": ["a@x.org"]}}, "then": "deny"},
        {"then": "ask"},
    ]
    assert verdict(rules, order(count=4)).verdict == "allow"
    assert verdict(rules, order(count=5, email="a@x.org")).verdict == "deny"
    assert verdict(rules, order(count=5, email="b@x.org")).verdict == "ask"


# --- absent fields: never a silent allow --------------------------------------------------------


def test_an_allow_rule_on_an_absent_field_does_not_hold():
    rules = [{"when": {"/order/amount": {"lt": 50}}, "then": "allow"}]
    decision = verdict(rules, order())
    assert decision.verdict == "ask" and "no rule matched" in decision.because


def test_a_deny_rule_on_an_absent_field_makes_a_later_allow_ask():
    rules = [{"when": {"/order/amount": {"gt": 500}}, "then": "deny"}, {"then": "allow"}]
    decision = verdict(rules, order())
    assert decision.verdict == "ask"
    assert decision.because == (
        f"policy for {TOOL}, rule 2: allow, but rule 1 (deny) could not be judged: "
        "/order/amount is absent (ask)"
    )


def test_an_ask_rule_on_an_absent_field_asks_even_when_no_later_rule_holds():
    rules = [
        {"when": {"/email": {"prefix": "vip-"}}, "then": "ask"},
        {"when": {"/count": {"gt": 1}}, "then": "allow"},
    ]
    decision = verdict(rules, order(count=1))
    assert decision.verdict == "ask"
    assert "rule 1 (ask) could not be judged: /email is absent" in decision.because


def test_a_later_deny_still_denies_after_a_rule_that_could_not_be_judged():
    rules = [
        {"when": {"/order/amount": {"gt": 500}}, "then": "ask"},
        {"when": {"/order/id": {"prefix": "13"}}, "then": "deny"},
        {"then": "allow"},
    ]
    assert verdict(rules, order(order={"id": "1313"})).verdict == "deny"


def test_a_condition_that_fails_settles_the_rule_whatever_else_is_absent():
    rules = [
        {"when": {"/order/currency": "USD", "/order/amount": {"gt": 500}}, "then": "deny"},
        {"then": "allow"},
    ]
    decision = verdict(rules, order(order={"currency": "EUR"}))
    assert (decision.verdict, decision.because) == ("allow", f"policy for {TOOL}, rule 2: allow")


def test_exists_says_what_an_absent_field_means():
    rules = [
        {"when": {"/order/amount": {"exists": False}}, "then": "allow"},
        {"when": {"/order/amount": {"gt": 500}}, "then": "deny"},
        {"then": "allow"},
    ]
    assert verdict(rules, order()).verdict == "allow"
    assert verdict(rules, order(order={"amount": 900})).verdict == "deny"
    assert verdict(rules, order(order={"amount": 9})).verdict == "allow"


def test_default_is_the_value_an_absent_field_is_judged_as():
    rules = [
        {"when": {"/express": {"eq": True, "default": False}}, "then": "ask"},
        {"then": "allow"},
    ]
    assert verdict(rules, order()).verdict == "allow"
    assert verdict(rules, order(express=True)).verdict == "ask"
    assert verdict(rules, order(express=False)).verdict == "allow"
    over = [
        {"when": {"/items": {"any": {"/amount": {"gt": 500, "default": 0}}}}, "then": "deny"},
        {"when": {"/order/amount": {"gt": 100, "default": 1000}}, "then": "ask"},
        {"then": "allow"},
    ]
    assert verdict(over, order(order={"amount": 5}, items=[{"sku": "A"}])).verdict == "allow"
    assert verdict(over, order(items=[{"sku": "A"}])).verdict == "ask"
    assert verdict(over, order(items=[{"sku": "A"}, {"sku": "B", "amount": 501}])).verdict == "deny"


@pytest.mark.parametrize(
    ("field", "arguments", "why"),
    [
        ("/count", order(count=True), "/count is a boolean; lt 5 compares numbers"),  # not 1
        ("/count", order(count="3"), "/count is a string; lt 5 compares numbers"),
        ("/count", order(count=None), "/count is null; lt 5 compares numbers"),
        ("/count", order(count=[1]), "/count is an array; lt 5 compares numbers"),
        ("/order/amount", {"order": "1"}, "/order/amount is absent"),  # runs into a string
        ("/order/amount", {"order": ["1"]}, "/order/amount is absent"),  # no index in a list
    ],
)
def test_a_value_of_the_wrong_type_cannot_be_judged(field, arguments, why):
    rules = [{"when": {field: {"lt": 5}}, "then": "deny"}, {"then": "allow"}]
    # Arguments the schema would refuse: decide() alone, as the agent never calls it on them.
    decision = decide({TOOL: rules}, TOOL, arguments, "ask")
    assert (
        decision.verdict == "ask"
        and f"rule 1 (deny) could not be judged: {why}" in decision.because
    )


def test_a_dotted_name_is_an_argument_s_name_not_a_path():
    rules = [{"when": {"a.b": "x"}, "then": "allow"}, {"then": "deny"}]
    assert decide({TOOL: rules}, TOOL, order(**{"a.b": "x"}), "ask").verdict == "allow"
    assert decide({TOOL: rules}, TOOL, {"a": {"b": "x"}}, "ask").verdict == "deny"


def test_equality_is_json_equality():
    rules = [{"when": {"/count": {"in": [1]}}, "then": "deny"}, {"then": "allow"}]
    assert decide({TOOL: rules}, TOOL, order(count=True), "ask").verdict == "allow"
    assert decide({TOOL: rules}, TOOL, order(count=1.0), "ask").verdict == "deny"
    express = [{"when": {"/express": True}, "then": "ask"}, {"then": "allow"}]
    assert decide({TOOL: express}, TOOL, order(express=1), "ask").verdict == "allow"
    assert decide({TOOL: express}, TOOL, order(express=True), "ask").verdict == "ask"


def test_an_index_past_the_end_of_a_list_is_absent():
    rules = [{"when": {"/items/2/sku": "X"}, "then": "deny"}, {"then": "allow"}]
    decision = verdict(rules, order(items=[{"sku": "X"}]))
    assert decision.verdict == "ask" and "/items/2/sku is absent" in decision.because


# --- lists --------------------------------------------------------------------------------------

DENY_ANY_OVER_500 = [
    {"when": {"/items": {"any": {"/amount": {"gt": 500}}}}, "then": "deny"},
    {"then": "allow"},
]


@pytest.mark.parametrize("position", [0, 1, 4])
def test_a_deny_on_any_element_catches_one_item_over_the_limit_wherever_it_is(position):
    items = [{"sku": f"S{i}", "amount": 10} for i in range(5)]
    items[position]["amount"] = 501
    assert verdict(DENY_ANY_OVER_500, order(items=items)).verdict == "deny"


def test_a_deny_on_any_element_is_not_fooled_by_an_element_it_cannot_judge():
    items = [{"sku": "A", "amount": 10}, {"sku": "B"}, {"sku": "C", "amount": 900}]
    assert verdict(DENY_ANY_OVER_500, order(items=items)).verdict == "deny"
    decision = verdict(DENY_ANY_OVER_500, order(items=items[:2]))
    assert decision.verdict == "ask"
    assert "rule 1 (deny) could not be judged: /items/1/amount is absent" in decision.because


def test_any_on_an_empty_list_does_not_hold():
    assert verdict(DENY_ANY_OVER_500, order(items=[])).verdict == "allow"


def test_any_tests_its_conditions_on_one_element():
    rules = [
        {
            "when": {"/items": {"any": {"/sku": {"prefix": "GIFT-"}, "/amount": {"gt": 100}}}},
            "then": "deny",
        },
        {"then": "allow"},
    ]
    apart = [{"sku": "GIFT-1", "amount": 5}, {"sku": "BOOK-1", "amount": 200}]
    assert verdict(rules, order(items=apart)).verdict == "allow"
    together = [{"sku": "BOOK-1", "amount": 5}, {"sku": "GIFT-1", "amount": 200}]
    assert verdict(rules, order(items=together)).verdict == "deny"


ALLOW_ALL_UNDER_50 = [
    {"when": {"/items": {"all": {"/amount": {"lt": 50}}}}, "then": "allow"},
    {"then": "ask"},
]


def test_an_allow_on_every_element_lets_nothing_over_the_limit_through():
    small = [{"sku": "A", "amount": 10}, {"sku": "B", "amount": 49}]
    assert verdict(ALLOW_ALL_UNDER_50, order(items=small)).verdict == "allow"
    one_large = [*small, {"sku": "C", "amount": 50}]
    assert verdict(ALLOW_ALL_UNDER_50, order(items=one_large)).verdict == "ask"
    one_unknown = [*small, {"sku": "C"}]
    assert verdict(ALLOW_ALL_UNDER_50, order(items=one_unknown)).verdict == "ask"


def test_all_on_an_empty_list_cannot_be_judged():
    assert verdict(ALLOW_ALL_UNDER_50, order(items=[])).verdict == "ask"
    deny_all_gifts = [
        {"when": {"/items": {"all": {"/sku": {"prefix": "GIFT-"}}}}, "then": "deny"},
        {"then": "allow"},
    ]
    decision = verdict(deny_all_gifts, order(items=[]))
    assert decision.verdict == "ask" and "/items is an empty list" in decision.because


def test_lists_nest():
    nested = [{"when": {"/grid": {"any": {"any": {"gt": 5}}}}, "then": "deny"}, {"then": "allow"}]
    assert decide({"t": nested}, "t", {"grid": [[1, 2], [3, 9]]}, "ask").verdict == "deny"
    assert decide({"t": nested}, "t", {"grid": [[1, 2], [3, 4]]}, "ask").verdict == "allow"
    assert decide({"t": nested}, "t", {"grid": [[1], "x"]}, "ask").verdict == "ask"


# --- the regex's bounds -------------------------------------------------------------------------


def test_a_regex_is_compiled_once():
    pattern = r"once-[0-9]+"
    rules = [{"when": {"/email": {"regex": pattern}}, "then": "deny"}, {"then": "allow"}]
    before = compiled.cache_info()
    for n in range(5):
        assert verdict(rules, order(email=f"once-{n}")).verdict == "deny"
    after = compiled.cache_info()
    assert after.misses - before.misses == 1 and after.hits - before.hits >= 4


def test_a_string_too_long_for_a_regex_is_not_judged():
    rules = [{"when": {"/email": {"regex": ".*secret.*"}}, "then": "deny"}, {"then": "allow"}]
    assert verdict(rules, order(email="a" * MAX_MATCHED + "secret")).verdict == "ask"
    assert verdict(rules, order(email="a" * (MAX_MATCHED - 6) + "secret")).verdict == "deny"
    assert verdict(rules, order(email="a" * MAX_MATCHED)).verdict == "allow"


@pytest.mark.parametrize(
    "pattern",
    [
        r"[a-z0-9._-]+@example\.com",
        r"(eu|us|uk)-[0-9]{3,12}",
        r".*(password|secret|api.?key).*",
        r"(?i)refund-\d+",
        r"(ab)+c{2,5}",
        r"x" * MAX_PATTERN,
    ],
)
def test_a_bounded_regex_is_accepted(pattern):
    assert check_policy_syntax({TOOL: [{"when": {"/email": {"regex": pattern}}, "then": "deny"}]})


@pytest.mark.parametrize(
    ("pattern", "error"),
    [
        (r"(a+)+$", "repeats a part that itself repeats or alternates"),
        (r"(\w+\s?)*", "repeats a part that itself repeats or alternates"),
        (r"(ab|a)*c", "repeats a part that itself repeats or alternates"),
        (r"(a?){20}", "repeats a part that itself repeats or alternates"),
        (r".*a.*a.*c", "could backtrack through about 1e+09 paths"),
        (r"a{0,900}b{0,900}c{0,900}", "could backtrack"),
        ("x" * (MAX_PATTERN + 1), f"a pattern is at most {MAX_PATTERN}"),
        (r"(unclosed", "does not compile: missing )"),
        (r"a{2,1}", "does not compile"),
    ],
)
def test_a_regex_that_could_run_away_or_does_not_compile_is_refused(pattern, error):
    policy = {TOOL: [{"when": {"/email": {"regex": pattern}}, "then": "deny"}]}
    with pytest.raises(ValueError) as raised:
        check_policy_syntax(policy)
    assert str(raised.value).startswith(f"policy['{TOOL}'] rule 1 when['/email']: ")
    assert error in str(raised.value)


# --- malformed rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "error"),
    [
        ({"/email": {"prefix": 5}}, "when['/email']: prefix needs a non-empty string, not 5"),
        ({"/email": {"prefix": ""}}, "prefix needs a non-empty string"),
        ({"/email": {"regex": ["a"]}}, "regex needs a pattern (a string), not ['a']"),
        ({"/email": {"exists": "yes"}}, "exists needs true or false, not 'yes'"),
        (
            {"/items": {"any": {"amount": {"gt": 5}}}},
            "'amount' is neither an operator nor a JSON Pointer; to test a field of each "
            "element, write '/amount'",
        ),
        ({"/items": {"all": {}}}, "when['/items'] all names no operator"),
        (
            {"/items": {"any": {"/amount": 5, "gt": 3}}},
            "when['/items'] any: '/amount' is a JSON Pointer beside operators",
        ),
        (
            {"/items": {"any": {"/amount": {"above": 5}}}},
            "when['/items'] any['/amount']: unknown operator 'above'",
        ),
        ({"/order/~2": 1}, "a ~ is written ~0 and a / inside a name ~1"),
        ({"/email": {"default": "x"}}, "when['/email'] names no operator"),
        ({"/email": {"exists": True, "default": "x"}}, "so exists cannot hold"),
        ({"": 1}, "a field is an argument's name or a JSON Pointer such as /order/amount, not ''"),
        (
            {"/email": {"matches": "x"}},
            "unknown operator 'matches'; use eq, ne, lt, lte, gt, gte, in, not_in, prefix, "
            "regex, exists, any, all (and default, the value an absent field is judged as)",
        ),
    ],
)
def test_a_malformed_condition_is_refused_naming_the_rule_and_the_field(when, error):
    with pytest.raises(ValueError) as raised:
        check_policy_syntax({TOOL: [{"then": "allow"}, {"when": when, "then": "deny"}]})
    assert str(raised.value).startswith(f"policy['{TOOL}'] rule 2 ")
    assert error in str(raised.value)


# --- rules that cannot match the tool's schema ------------------------------------------------

SCHEMA_REFUSALS = [
    (
        {"/order/amout": {"gt": 5}},
        "tests '/order/amout', which refund_items does not take: /order has no field 'amout'; "
        "its fields: amount, currency, id",
    ),
    (
        {"order.amount": {"gt": 5}},
        "tests 'order.amount', which refund_items does not take; its arguments: a.b, count, "
        "email, express, items, metadata, order, tags; for the nested field write '/order/amount'",
    ),
    (
        {"/items/amount": {"gt": 5}},
        "tests '/items/amount', which refund_items does not take: /items is a list; name an "
        "element by its index (/items/0) or test its elements with any or all",
    ),
    (
        {"/count": {"prefix": "1"}},
        "tests '/count': prefix needs a string field, but the schema says integer",
    ),
    (
        {"/count": {"regex": "[0-9]+"}},
        "tests '/count': regex needs a string field, but the schema says integer",
    ),
    (
        {"/order/amount": {"regex": "5.*"}},
        "tests '/order/amount': regex needs a string field, but the schema says number",
    ),
    (
        {"/count": {"lt": "5"}},
        "tests '/count': lt \"5\" compares strings, but the schema says integer",
    ),
    ({"/email": {"gte": 5}}, "tests '/email': gte 5 compares numbers, but the schema says string"),
    ({"/count": 1.5}, "tests '/count': eq 1.5 can never match: the schema says integer"),
    (
        {"/express": {"ne": "yes"}},
        "tests '/express': ne \"yes\" can never match: the schema says boolean",
    ),
    (
        {"/order/currency": {"in": ["EUR", "usd"]}},
        "tests '/order/currency': in \"usd\" can never match: the schema says string "
        '(one of "EUR", "USD")',
    ),
    (
        {"/email": {"any": "x"}},
        "tests '/email': any needs a list field, but the schema says string",
    ),
    (
        {"/items": {"any": {"/amout": {"gt": 500}}}},
        "tests '/items' any '/amout', which refund_items does not take: an element of "
        "'/items' has no field 'amout'; its fields: amount, sku",
    ),
    (
        {"/items": {"all": {"/sku": {"gt": 5}}}},
        "tests '/items' all '/sku': gt 5 compares numbers, but the schema says string",
    ),
    ({"/tags": {"any": {"prefix": 5}}}, "prefix needs a non-empty string, not 5"),
    ({"/tags": {"all": 7}}, "tests '/tags' all: eq 7 can never match: the schema says string"),
    (
        {"/order": {"exists": False}},
        "tests '/order': exists false can never hold: the schema requires it",
    ),
    (
        {"/order/amount": {"gt": 5, "default": "none"}},
        "tests '/order/amount': default \"none\" is not a value the field can be: the schema "
        "says number",
    ),
    (
        {"/metadata/note": {"gt": 1}},
        "tests '/metadata/note': gt 1 compares numbers, but the schema says string",
    ),
]


@pytest.mark.parametrize(("when", "error"), SCHEMA_REFUSALS)
def test_a_rule_that_cannot_match_the_schema_is_refused_naming_the_rule_and_the_field(when, error):
    with pytest.raises(ValueError) as raised:
        check_policy(
            {TOOL: [{"then": "deny"}, {"then": "allow"}, {"when": when, "then": "ask"}]}, OFFERED
        )
    assert error in str(raised.value)
    assert str(raised.value).startswith(f"policy['{TOOL}'] rule 3 ")


def test_a_rule_the_schema_can_match_is_accepted():
    rules = [
        {"when": {"/items": {"any": {"/amount": {"gt": 500}}}}, "then": "deny"},
        {"when": {"/items/0/sku": {"prefix": "GIFT-"}}, "then": "ask"},
        {
            "when": {"/order/currency": {"in": ["EUR"]}, "/order/amount": {"lt": 50}},
            "then": "allow",
        },
        {
            "when": {"/email": {"regex": r".*@example\.com"}, "/order/id": {"exists": True}},
            "then": "allow",
        },
        {
            "when": {"/metadata/source": "web", "a.b": "x", "/tags": {"all": {"ne": "fraud"}}},
            "then": "allow",
        },
        {
            "when": {"/email": {"exists": False}, "/express": False, "count": {"gte": 1}},
            "then": "allow",
        },
        {"then": "ask"},
    ]
    assert check_policy({TOOL: rules}, OFFERED) == {TOOL: rules}


def test_where_the_schema_does_not_say_the_rule_stands():
    loose = {
        "type": "object",
        "properties": {
            "anything": {},
            "either": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]
            },
        },
    }
    rules = [
        {"when": {"/anything": {"prefix": "x"}, "/either": {"prefix": "y"}}, "then": "deny"},
        {"when": {"/either": {"any": {"gt": 5}}}, "then": "deny"},
        {"then": "allow"},
    ]
    assert check_policy({"loose": rules}, {"loose": loose})
    with pytest.raises(
        ValueError,
        match="tests '/either' any: gt \"5\" compares strings, but the schema says integer",
    ):
        check_policy(
            {"loose": [{"when": {"/either": {"any": {"gt": "5"}}}, "then": "deny"}]},
            {"loose": loose},
        )
    with pytest.raises(ValueError, match="tests '/anything/deeper', which loose does not take"):
        check_policy(
            {"loose": [{"when": {"/anything/deeper": 1}, "then": "deny"}]}, {"loose": loose}
        )


# --- the same refusals through AgentConfig.full_clean() ------------------------------------------


@pytest.fixture
def policy_tools(settings):
    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools", "tests.support.policy_tools"]


@pytest.mark.django_db
@pytest.mark.parametrize(("when", "error"), SCHEMA_REFUSALS[:6])
def test_full_clean_refuses_a_rule_that_cannot_match_and_nothing_is_stored(
    make_inbox, policy_tools, when, error
):
    config = AgentConfig(
        inbox=make_inbox(),
        agent="alwayson.claude.agent",
        policy={TOOL: [{"when": when, "then": "deny"}, {"then": "allow"}]},
    )
    with pytest.raises(ValidationError) as raised:
        config.full_clean()
    [message] = raised.value.message_dict["policy"]
    assert message.startswith(f"policy['{TOOL}'] rule 1 ") and error in message
    assert not AgentConfig.objects.exists()


@pytest.mark.django_db
def test_full_clean_accepts_and_stores_a_policy_with_the_new_operators(make_inbox, policy_tools):
    policy = {
        TOOL: [
            {"when": {"/items": {"any": {"/amount": {"gt": 500}}}}, "then": "deny"},
            {"when": {"/email": {"regex": r".*@example\.com"}}, "then": "allow"},
            {"then": "ask"},
        ]
    }
    config = AgentConfig(inbox=make_inbox(), agent="alwayson.claude.agent", policy=policy)
    config.full_clean()
    config.save()
    assert AgentConfig.objects.get().policy == policy


# --- the reference's examples -------------------------------------------------------------------


def reference_examples():
    """Each JSON block of docs/reference/policy-rules.md as a policy: a whole policy, a tool's
    entries ("tool": [...]) or one rule."""
    text = (ROOT / "docs" / "reference" / "policy-rules.md").read_text(encoding="utf-8")
    for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        block = block.strip()
        value = json.loads(block if block.startswith("{") else "{" + block + "}")
        yield {"example": [value]} if "then" in value else value


def test_the_reference_examples_are_well_formed_and_decide_as_it_says():
    examples = list(reference_examples())
    assert len(examples) >= 6
    for policy in examples:
        check_policy_syntax(policy)
    [messages] = [p["send_message"] for p in examples if "send_message" in p and len(p) == 1]
    offered = {name: tool.input_schema for name, tool in BUILTINS.items()}
    check_policy({"send_message": messages}, offered)
    assert decide({"send_message": messages}, "send_message", {"text": "hi"}, "ask").verdict == (
        "allow"
    )
    urgent = {"text": "hi", "urgent": True}
    assert decide({"send_message": messages}, "send_message", urgent, "ask").verdict == "ask"
    secret = {"text": "Your API key is sk-1"}
    assert decide({"send_message": messages}, "send_message", secret, "ask").verdict == "ask"
