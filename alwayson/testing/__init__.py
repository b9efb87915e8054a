"""alwayson's test kit, for the test suites of the people who write agents.

In the top-level conftest.py (with pytest-django):

    pytest_plugins = ["alwayson.testing"]

and a test gets the `harness` fixture (inboxes, deliveries, the worker, scheduler and
dispatcher run until idle, time travel, answers, and what happened) and `scripted_model` (a
loopback Messages API for the Claude agent). Without pytest: `with Harness() as harness:`
inside a test's database transaction, and `with ScriptedModel() as model:`.
docs/how-to/testing-agents.md is the guide.

Importing this package imports no model: it is safe to name before Django is set up.
PYTEST_DONT_REWRITE: nothing here asserts, and a test module may import this package (for
`message`, `tool_use`) before its `pytest_plugins` line names it.
"""

pytest_plugins = ["alwayson.testing.fixtures"]

_EXPORTS = {
    "Harness": "harness",
    "AgentInbox": "harness",
    "AgentError": "harness",
    "NotIdle": "harness",
    "Message": "harness",
    "Delivery": "harness",
    "SetTimer": "harness",
    "ToolCallSeen": "harness",
    "Clock": "clock",
    "ScriptedModel": "model",
    "Reply": "model",
    "message": "model",
    "tool_use": "model",
    "memory": "model",
    "MemoryFileSeen": "harness",
    "usage": "model",
    "error": "model",
    "rate_limited": "model",
    "overloaded": "model",
    "bad_request": "model",
    "malformed": "model",
    "answered_200": "model",
    "slow": "model",
    "Evals": "evals",
    "check": "evals",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    # Read at first use: the harness imports the apps' models, which exist only once Django
    # is set up, and pytest imports a plugin before that.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
