"""A tool with nested arguments, for the policy rules' tests (ALWAYSON_CLAUDE_TOOLS lists this
module beside tests.support.claude_tools). It records its calls in CALLS.

SCHEMA is also what the rules are checked against in tests/runtime/test_policy_rules.py.
"""

from alwayson.claude import tool

CALLS = []

SCHEMA = {
    "type": "object",
    "properties": {
        "order": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "amount": {"type": "number"},
                "currency": {"enum": ["EUR", "USD"]},
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {"$ref": "#/$defs/item"},
        },
        "email": {"type": "string"},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "express": {"type": "boolean"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "a.b": {"type": "string"},  # a name with a dot: why `order.amount` is not a path
    },
    "required": ["order"],
    "additionalProperties": False,
    "$defs": {
        "item": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["sku"],
        }
    },
}


@tool(input_schema=SCHEMA, action="refund order {order[id]}")
def refund_items(call, order, **rest):
    """Refund some items of an order."""
    CALLS.append({"order": order, **rest})
    return f"refunded order {order['id']}"
