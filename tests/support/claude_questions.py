"""A question tool for the Claude agent tests: the person's reply is the tool's result.
Added to ALWAYSON_CLAUDE_TOOLS by the tests that ask questions."""

from alwayson.runtime.tools import Question, tool

from .claude_tools import CALLS


@tool(
    input_schema={
        "type": "object",
        "properties": {
            "question": {"type": "string"},
            "options": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["question"],
    },
    action="{question}",
    question=Question(choices="options"),
)
def ask_owner(call, question, options=()):
    """Ask the owner a question and wait for their answer."""
    CALLS.append(("ask_owner", {"question": question}, call.idempotency_key, call.reply))
    return call.reply


@tool(
    input_schema={
        "type": "object",
        "properties": {"order": {"type": "string"}},
        "required": ["order"],
    },
    action="choose a carrier for order {order}",
    question=Question(choices=("DHL", "UPS"), free_text=False),
)
def choose_carrier(call, order):
    """Ask which carrier ships an order; only the listed carriers will do."""
    CALLS.append(("choose_carrier", {"order": order}, call.idempotency_key, call.reply))
    return f"order {order} ships with {call.reply}"
