"""Application tools for the Claude agent tests
(ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools"]).

Each records its calls in CALLS (name, arguments, idempotency key, approved), so a test sees
what ran and under which key; `refund` also goes through the stand-in payments ledger, which
refuses a key it has seen.
"""

from alwayson.claude import ToolError, tool
from alwayson.demo import payments

CALLS = []
# Set to make the next refund "kill the worker" right after the payment went through.
CRASH_AFTER_REFUND = []
# What happens elsewhere while lookup_order runs (the owner sends a chat message): each
# callable is called, and removed, by the next lookup.
WHILE_LOOKING_UP = []


class Crash(BaseException):
    """The worker process dies: nothing after this point runs."""


REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
    },
    "required": ["order", "amount"],
    "additionalProperties": False,
}


@tool(input_schema=REFUND_SCHEMA, action="refund order {order} ({amount} EUR)")
def refund(call, order, amount):
    """Refund an order, in full or in part, through the payments provider."""
    CALLS.append(
        ("refund", {"order": order, "amount": amount}, call.idempotency_key, call.approved)
    )
    fresh = payments.refund(order, idempotency_key=call.idempotency_key)
    if CRASH_AFTER_REFUND:
        CRASH_AFTER_REFUND.pop()
        raise Crash
    return {"order": order, "refunded": amount, "first_time": fresh}


@tool(
    input_schema={
        "type": "object",
        "properties": {"order": {"type": "string"}},
        "required": ["order"],
    }
)
def lookup_order(call, order):
    """Look up an order's status."""
    CALLS.append(("lookup_order", {"order": order}, call.idempotency_key, call.approved))
    while WHILE_LOOKING_UP:
        WHILE_LOOKING_UP.pop(0)()
    if order == "404":
        raise ToolError(f"there is no order {order}")
    if order == "steal-the-lease":  # another worker takes the inbox over mid-run
        from inbox.models import Lease

        Lease.objects.filter(inbox=call.inbox).update(holder="another-worker")
    return f"order {order}: delivered on 2026-02-27"


@tool(
    input_schema={
        "type": "object",
        "properties": {"account": {"type": "string"}},
        "required": ["account"],
    }
)
def delete_account(call, account):
    """Delete a customer account for good."""
    CALLS.append(("delete_account", {"account": account}, call.idempotency_key, call.approved))
    return f"deleted {account}"
