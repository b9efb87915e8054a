"""Step 5 of the tutorial (docs/tutorial/first-agent.md): the Claude agent with one tool.

ALWAYSON_AGENT=alwayson.claude.agent, ALWAYSON_CLAUDE_TOOLS=refunds, and the policy
below (ALWAYSON_CLAUDE_POLICY, or an inbox's agent configuration).
"""

# --8<-- [start:tool]
from alwayson.claude import ToolError, tool

POLICY = {"refund_order": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]}


@tool(
    input_schema={
        "type": "object",
        "properties": {
            "order": {"type": "string"},
            "amount": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["order", "amount"],
        "additionalProperties": False,
    },
    action="refund order {order} ({amount} EUR)",
)
def refund_order(call, order, amount):
    """Refund an order, in full or in part."""
    if amount > 1000:
        raise ToolError("refunds over 1000 EUR go through the bank")
    # Your payments provider, with idempotency_key=call.idempotency_key.
    return {"order": order, "refunded": amount}


# --8<-- [end:tool]
