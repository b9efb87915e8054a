"""A Claude agent on the official `anthropic` SDK: ALWAYSON_AGENT = "alwayson.claude.agent".

`tool` registers an application tool, `ToolError` is how a tool reports a failure to the
model (alwayson/runtime/tools.py: every agent's tools are declared the same way, and the
runtime's policy decides on them).
"""

from alwayson.runtime.tools import ToolCall, ToolError, tool

__all__ = ["ToolCall", "ToolError", "agent", "tool"]


def __getattr__(name):
    # The agent is read at its first use, not at import: Django imports this package while
    # it loads the apps, before the models the runner imports can be.
    if name == "agent":
        from .runner import agent

        return agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
