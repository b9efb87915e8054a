"""The permission policy: each tool call is allowed, asked or denied, optionally by argument.

    {
        "send_message": "allow",
        "refund": [
            {"when": {"amount": {"lt": 50}}, "then": "allow"},
            {"when": {"order": {"in": ["1", "2"]}}, "then": "deny"},
            {"when": {"amount": {"gt": 500}}, "then": "ask", "approvers": 2},
            {"then": "ask"}
        ],
        "close_account": {"then": "ask", "approvers": 2},
        "delete_account": "deny"
    }

A tool's entry is a decision or a list of rules tried in order; the first whose conditions
all hold decides. A condition compares one argument: a bare value means equality, an object
names operators (eq, ne, lt, lte, gt, gte, in, not_in). A condition that cannot be evaluated
(the argument is missing, or a number is compared with a string) does not hold, and a list
in which no rule holds asks: a policy that did not foresee a call never lets it through.
Tools the policy does not name: the built-ins are allowed, application tools ask.

A rule that asks may require `"approvers": 2`: two different people must approve the call
(the approvals' two-person rule), also when a person edits its arguments into that rule. An
entry may be one rule object instead of a list, for a rule that covers every call of a tool.

Pure Python: the Claude app's ready() checks ALWAYSON_CLAUDE_POLICY with it at start-up.
"""

from dataclasses import dataclass

ALLOW, ASK, DENY = "allow", "ask", "deny"
DECISIONS = (ALLOW, ASK, DENY)
OPERATORS = {
    "eq": lambda value, operand: value == operand,
    "ne": lambda value, operand: value != operand,
    "lt": lambda value, operand: value < operand,
    "lte": lambda value, operand: value <= operand,
    "gt": lambda value, operand: value > operand,
    "gte": lambda value, operand: value >= operand,
    "in": lambda value, operand: value in operand,
    "not_in": lambda value, operand: value not in operand,
}
ORDERING = {"lt", "lte", "gt", "gte"}
MEMBERSHIP = {"in", "not_in"}


@dataclass(frozen=True)
class Decision:
    verdict: str  # allow, ask or deny
    because: str  # which entry decided, for the model and the log
    approvers: int = 1  # for ask: how many different people must approve


def _rules(entry) -> list:
    """A tool's entry as its list of rules (one rule object is a list of one)."""
    return [entry] if isinstance(entry, dict) else entry


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_policy_syntax(policy) -> dict:
    """The policy if it is well formed; ValueError naming the place otherwise."""
    if not isinstance(policy, dict):
        raise ValueError(f"the policy must be a JSON object of tool names, not {policy!r}")
    for tool, entry in policy.items():
        if not isinstance(tool, str) or not tool:
            raise ValueError(f"policy: tool names must be non-empty strings, not {tool!r}")
        if isinstance(entry, str):
            _check_decision(f"policy[{tool!r}]", entry)
            continue
        if not isinstance(entry, list | dict) or not entry:
            raise ValueError(
                f"policy[{tool!r}] must be one of {', '.join(DECISIONS)}, a rule or a non-empty "
                f"list of rules, not {entry!r}"
            )
        for n, rule in enumerate(_rules(entry), 1):
            _check_rule(f"policy[{tool!r}] rule {n}", rule)
    return policy


def _check_decision(where, value):
    if value not in DECISIONS:
        raise ValueError(f"{where} must be one of {', '.join(DECISIONS)}, not {value!r}")


def _check_rule(where, rule):
    if not isinstance(rule, dict) or "then" not in rule:
        raise ValueError(f'{where} must be an object with "then" (and optional "when")')
    unknown = set(rule) - {"when", "then", "approvers"}
    if unknown:
        raise ValueError(
            f"{where} has unknown keys {sorted(unknown)}; use when, then and approvers"
        )
    _check_decision(f"{where} then", rule["then"])
    if "approvers" in rule:
        approvers = rule["approvers"]
        if isinstance(approvers, bool) or approvers not in (1, 2):
            raise ValueError(f"{where} approvers must be 1 or 2, not {approvers!r}")
        if rule["then"] != ASK:
            raise ValueError(f'{where} approvers goes with "then": "ask", not {rule["then"]!r}')
    when = rule.get("when", {})
    if not isinstance(when, dict):
        raise ValueError(f"{where} when must be an object of argument conditions")
    for argument, condition in when.items():
        if isinstance(condition, dict):
            if not condition:
                raise ValueError(f"{where} when[{argument!r}] names no operator")
            for op, operand in condition.items():
                _check_operator(f"{where} when[{argument!r}]", op, operand)


def _check_operator(where, op, operand):
    if op not in OPERATORS:
        raise ValueError(f"{where}: unknown operator {op!r}; use {', '.join(OPERATORS)}")
    if op in ORDERING and not (_number(operand) or isinstance(operand, str)):
        raise ValueError(f"{where}: {op} needs a number or a string, not {operand!r}")
    if op in MEMBERSHIP and not isinstance(operand, list):
        raise ValueError(f"{where}: {op} needs a list, not {operand!r}")


def check_policy(policy, offered: dict) -> dict:
    """Syntax, and that every tool and argument it names exists. `offered` maps tool names to
    their JSON Schema input (built-ins included)."""
    check_policy_syntax(policy)
    for tool, entry in policy.items():
        if tool not in offered:
            raise ValueError(
                f"policy names the unknown tool {tool!r}; tools: {', '.join(sorted(offered))}"
            )
        known = set((offered[tool] or {}).get("properties") or {})
        for n, rule in enumerate(_rules(entry) if not isinstance(entry, str) else [], 1):
            for argument in rule.get("when", {}):
                if argument not in known:
                    raise ValueError(
                        f"policy[{tool!r}] rule {n} tests {argument!r}, which {tool} does not "
                        f"take; its arguments: {', '.join(sorted(known)) or 'none'}"
                    )
    return policy


def _holds(condition, value) -> bool:
    checks = condition.items() if isinstance(condition, dict) else [("eq", condition)]
    for op, operand in checks:
        try:
            if not OPERATORS[op](value, operand):
                return False
        except TypeError:
            return False
    return True


def decide(policy: dict, tool: str, arguments: dict, default: str) -> Decision:
    """The verdict for one call of `tool` with `arguments`."""
    entry = policy.get(tool)
    if entry is None:
        return Decision(default, f"{tool} is not in the policy (default: {default})")
    if isinstance(entry, str):
        return Decision(entry, f"policy for {tool}: {entry}")
    missing = object()
    for n, rule in enumerate(_rules(entry), 1):
        when = rule.get("when", {})
        if all(
            arguments.get(name, missing) is not missing and _holds(condition, arguments[name])
            for name, condition in when.items()
        ):
            approvers = rule.get("approvers", 1)
            two = " (two approvers)" if approvers == 2 else ""
            return Decision(
                rule["then"], f"policy for {tool}, rule {n}: {rule['then']}{two}", approvers
            )
    return Decision(ASK, f"policy for {tool}: no rule matched (ask)")
