"""A Claude agent on the official `anthropic` SDK: ALWAYSON_AGENT = "alwayson.claude.agent".

`tool` registers an application tool, `ToolError` is how a tool reports a failure to the
model (alwayson/claude/tools.py). Imported lazily: the settings read `policy` from this
package before Django's apps are ready.
"""

__all__ = ["ToolCall", "ToolError", "agent", "tool"]


def __getattr__(name):
    if name == "agent":
        from .runner import agent

        return agent
    if name in ("tool", "ToolError", "ToolCall"):
        from . import tools

        return getattr(tools, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
