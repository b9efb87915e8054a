"""The permission policy: each tool call is allowed, asked or denied, optionally by argument.

    {
        "send_message": "allow",
        "refund": [
            {"when": {"amount": {"lt": 50}}, "then": "allow"},
            {"when": {"order": {"in": ["1", "2"]}}, "then": "deny"},
            {"when": {"/items": {"any": {"/sku": {"prefix": "GIFT-"}}}}, "then": "deny"},
            {"when": {"amount": {"gt": 500}}, "then": "ask", "approvers": 2},
            {"then": "ask"}
        ],
        "close_account": {"then": "ask", "approvers": 2},
        "delete_account": "deny"
    }

A tool's entry is a decision, one rule, or a list of rules tried in order; the first whose
conditions all hold decides (conditions.py has the language; docs/reference/policy-rules.md
the reference). What the policy did not foresee never gets through: a condition that cannot
be judged never allows (an allow after it becomes an ask), a list in which no rule holds
asks, and application tools the policy does not name ask (the built-ins are allowed). A
rule that asks may require `"approvers": 2` (docs/how-to/claude-agent.md, "The policy").
"""

from dataclasses import dataclass

from .conditions import check_when, judge
from .schemas import check_against

ALLOW, ASK, DENY = "allow", "ask", "deny"
DECISIONS = (ALLOW, ASK, DENY)


@dataclass(frozen=True)
class Decision:
    verdict: str  # allow, ask or deny
    because: str  # which entry decided, for the model and the log
    approvers: int = 1  # for ask: how many different people must approve


def _rules(entry) -> list:
    """A tool's entry as its list of rules (one rule object is a list of one)."""
    return [entry] if isinstance(entry, dict) else entry


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
    check_when(where, rule.get("when", {}))


def check_policy(policy, offered: dict) -> dict:
    """Syntax, that every tool it names exists, and that every condition can match its tool's
    JSON Schema input (schemas.check_against). `offered` maps tool names to those schemas
    (built-ins included)."""
    check_policy_syntax(policy)
    for tool, entry in policy.items():
        if tool not in offered:
            raise ValueError(
                f"policy names the unknown tool {tool!r}; tools: {', '.join(sorted(offered))}"
            )
        for n, rule in enumerate(_rules(entry) if not isinstance(entry, str) else [], 1):
            check_against(
                f"policy[{tool!r}] rule {n}", tool, rule.get("when", {}), offered[tool] or {}
            )
    return policy


def decide(policy: dict, tool: str, arguments: dict, default: str) -> Decision:
    """The verdict for one call of `tool` with `arguments`."""
    entry = policy.get(tool)
    if entry is None:
        return Decision(default, f"{tool} is not in the policy (default: {default})")
    if isinstance(entry, str):
        return Decision(entry, f"policy for {tool}: {entry}")
    # The first ask or deny rule that could not be judged: no allow after it, and an ask it
    # turns that allow into needs as many approvers as that rule would have.
    unjudged, unjudged_approvers = "", 1
    for n, rule in enumerate(_rules(entry), 1):
        then = rule["then"]
        approvers = rule.get("approvers", 1)
        held, why = judge(rule.get("when", {}), arguments)
        if held is None and then != ALLOW and not unjudged:
            unjudged = f"rule {n} ({then}) could not be judged: {why}"
            unjudged_approvers = approvers
        if not held:
            continue
        if unjudged and then == ALLOW:
            return Decision(
                ASK, f"policy for {tool}, rule {n}: allow, but {unjudged} (ask)", unjudged_approvers
            )
        two = " (two approvers)" if approvers == 2 else ""
        return Decision(then, f"policy for {tool}, rule {n}: {then}{two}", approvers)
    if unjudged:
        return Decision(
            ASK,
            f"policy for {tool}: {unjudged}, and no later rule denies (ask)",
            unjudged_approvers,
        )
    return Decision(ASK, f"policy for {tool}: no rule matched (ask)")
