"""The application's tools: Python functions with a JSON Schema input, registered by `@tool`
(docs/how-to/claude-agent.md, "Tools"; a tool that asks a person a question declares
`question=Question(...)`: docs/how-to/approvals.md).

    from alwayson.claude import tool, ToolError

    @tool(
        input_schema={
            "type": "object",
            "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["order", "amount"],
        },
        action="refund order {order} ({amount} EUR)",
    )
    def refund(call, order, amount):
        "Refund an order, in full or in part."
        payments.refund(order, idempotency_key=call.idempotency_key)
        return f"refunded {amount} EUR on order {order}"

The modules named by ALWAYSON_CLAUDE_TOOLS are imported when a Claude agent needs its tools.
A tool receives a `ToolCall` first (its `idempotency_key` is the same on every retry of the
same call) and the model's arguments, already checked against the schema, as keywords.
`ToolError` gives the model an error result; any other exception fails the run, which is
retried with backoff, the idempotency key making the repeat safe.
"""

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings

# The Messages API's rule for tool names.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# An MCP server's tools reach the model as mcp__<server>__<tool>: application tools may not
# take the prefix, and a server's name has no underscore, so no two tools ever share a name.
MCP_PREFIX = "mcp__"
MCP_SERVER_NAME = re.compile(r"[a-zA-Z0-9-]{1,24}")


class ToolError(Exception):
    """Raised by a tool: the model gets the message as an error result and carries on."""


@dataclass(frozen=True)
class Question:
    """A tool's call asks a person for a value (a choice or free text) instead of a yes.

    `choices` are the answers offered: a tuple of strings, or the name of the argument (an
    array of strings) in which the model lists them. With `free_text` a person may also
    write an answer of their own, at most `max_length` characters.
    """

    choices: tuple[str, ...] | str = ()
    free_text: bool = True
    max_length: int = 2000

    def check(self, tool_name, schema):
        where = f"tool {tool_name!r}: question"
        if isinstance(self.choices, str):
            listed = (schema.get("properties") or {}).get(self.choices)
            if not isinstance(listed, dict) or listed.get("type") != "array":
                raise ValueError(
                    f"{where} choices names {self.choices!r}, which must be an array argument"
                )
        elif not all(isinstance(choice, str) and choice for choice in self.choices):
            raise ValueError(f"{where} choices must be non-empty strings, not {self.choices!r}")
        elif not self.choices and not self.free_text:
            raise ValueError(f"{where} offers no choices and no free text: nothing to answer")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int):
            raise ValueError(f"{where} max_length must be an int, not {self.max_length!r}")
        if not 1 <= self.max_length <= 10_000:
            raise ValueError(f"{where} max_length must be 1 to 10000, not {self.max_length!r}")

    def asked(self, arguments) -> dict:
        """What the approval keeps of it (approvals checks a reply against this): the
        choices of this call and whether free text is taken."""
        choices = self.choices
        if isinstance(choices, str):
            listed = arguments.get(choices)
            choices = (
                [c for c in listed if isinstance(c, str) and c] if isinstance(listed, list) else []
            )
        # A call whose model listed no choices still gets an answer: free text.
        free_text = self.free_text or not choices
        return {"choices": list(choices), "free_text": free_text, "max_length": self.max_length}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict
    function: Callable
    module: str
    action: str = ""  # the approval's wording, formatted with the arguments
    question: Question | None = None  # a call asks a person for a value, not for a yes

    def spec(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    def check_input(self, arguments) -> str | None:
        """The first schema violation of `arguments`, in words; None when they fit."""
        from jsonschema import Draft202012Validator  # see check_schema

        error = next(iter(Draft202012Validator(self.input_schema).iter_errors(arguments)), None)
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message


@dataclass(frozen=True)
class ToolCall:
    """What a tool knows about its call."""

    run: object  # the Run (alwayson.runtime.run.Run)
    name: str
    arguments: dict
    tool_use_id: str
    idempotency_key: str
    approved: bool  # a person approved this call on the approval page
    reply: str | None = None  # a question's answer, as the person gave it

    @property
    def inbox(self):
        return self.run.inbox


# The built-ins, executed by the agent itself through the Run's verbs.
SEND_MESSAGE = Tool(
    name="send_message",
    description=(
        "Send a message to the owner of this inbox. This is the only way anything you write "
        "reaches them; when there is nothing worth telling, send nothing. Messages are held "
        "and merged, at most one send per hour; urgent ones go out at once."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 4000},
            "urgent": {
                "type": "boolean",
                "description": "Only for what the owner must see now.",
            },
        },
        "required": ["text"],
        "additionalProperties": False,
    },
    function=None,
    module=__name__,
)
SCHEDULE = Tool(
    name="schedule",
    description=(
        "Wake yourself up later: after delay_seconds, or on a cron schedule (five fields, "
        "minute hour day month weekday) read in a time zone. The timer comes back to you as a "
        "timer event carrying your note. Scheduling the same key again replaces that timer."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "key": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "note": {"type": "string", "maxLength": 2000, "description": "What to do then."},
            "delay_seconds": {"type": "integer", "minimum": 1, "maximum": 366 * 86400},
            "cron": {"type": "string", "description": "e.g. 0 9 * * 1-5"},
            "timezone": {"type": "string", "description": "IANA name, e.g. Europe/Berlin"},
        },
        "required": ["key", "note"],
        "additionalProperties": False,
    },
    function=None,
    module=__name__,
)
BUILTINS = {SEND_MESSAGE.name: SEND_MESSAGE, SCHEDULE.name: SCHEDULE}

_registry: dict[str, Tool] = {}


def tool(
    function=None, *, input_schema: dict, name=None, description=None, action="", question=None
):
    """Register a function as a tool the model may call (see the module's docstring)."""

    def register(fn):
        tool_name = name or fn.__name__
        if not TOOL_NAME.fullmatch(tool_name):
            raise ValueError(f"tool name {tool_name!r}: letters, digits, _ and - (1 to 64)")
        if tool_name in BUILTINS:
            raise ValueError(f"tool name {tool_name!r} is a built-in tool's")
        if tool_name.startswith(MCP_PREFIX):
            raise ValueError(f"tool name {tool_name!r}: {MCP_PREFIX} is for MCP servers' tools")
        check_schema(tool_name, input_schema)
        if question is not None:
            if not isinstance(question, Question):
                raise ValueError(
                    f"tool {tool_name!r}: question must be a Question, not {question!r}"
                )
            question.check(tool_name, input_schema)
        text = description or inspect.getdoc(fn)
        if not text:
            raise ValueError(f"tool {tool_name!r} needs a description (or a docstring)")
        registered = Tool(tool_name, text, input_schema, fn, fn.__module__, action, question)
        existing = _registry.get(tool_name)
        if existing and existing.module != registered.module:
            raise ValueError(f"tool {tool_name!r} is already registered by {existing.module}")
        _registry[tool_name] = registered
        return fn

    return register(function) if function is not None else register


def check_schema(tool_name, schema):
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError(f"tool {tool_name!r}: input_schema must be a JSON Schema of an object")
    # Imported here, not with the module: jsonschema (and referencing) are a tenth of every
    # manage.py command's start-up, and most never check a schema.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"tool {tool_name!r}: invalid input_schema: {exc.message}") from None


def application_tools() -> dict[str, Tool]:
    """The tools of the ALWAYSON_CLAUDE_TOOLS modules, importing them the first time."""
    modules = []
    for path in settings.ALWAYSON_CLAUDE_TOOLS:
        try:
            modules.append(import_module(path).__name__)
        except ImportError as exc:
            raise ValueError(f"ALWAYSON_CLAUDE_TOOLS: cannot import {path!r}: {exc}") from None
    return {name: t for name, t in sorted(_registry.items()) if t.module in modules}


def check_tool_names(names) -> list | None:
    """None (every application tool) or a list of registered tool names."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError('tools must be a JSON list of tool names, such as ["refund"], or blank')
    known = application_tools()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown tool(s) {', '.join(unknown)}; registered by ALWAYSON_CLAUDE_TOOLS: "
            f"{', '.join(known) or 'none'}"
        )
    return names


def offered_tools(names) -> dict[str, Tool]:
    """The tools an agent offers: the built-ins and the chosen application tools."""
    chosen = application_tools()
    if names is not None:
        chosen = {name: chosen[name] for name in check_tool_names(names)}
    return {**BUILTINS, **chosen}


def mcp_tool_name(server: str, name: str) -> str:
    return f"{MCP_PREFIX}{server}__{name}"


def mcp_server_of(tool_name: str) -> str | None:
    """The server an MCP tool's name names; None for any other tool."""
    if not tool_name.startswith(MCP_PREFIX):
        return None
    return tool_name[len(MCP_PREFIX) :].partition("__")[0]


MCP_SERVER_FIELDS = frozenset({"url", "service", "path", "timeout", "approve_new"})


def check_mcp_server_settings(servers) -> dict:
    """ALWAYSON_MCP_SERVERS, checked: {name: {"url": ...} or {"service": an egress service,
    "path": ...}, with an optional "timeout" (seconds) and "approve_new"}."""
    if not isinstance(servers, dict):
        raise ValueError("expected a JSON object of MCP servers by name")
    for name, entry in servers.items():
        if not isinstance(name, str) or not MCP_SERVER_NAME.fullmatch(name):
            raise ValueError(f"server name {name!r}: letters, digits and - (1 to 24)")
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: expected an object, not {type(entry).__name__}")
        unknown = set(entry) - MCP_SERVER_FIELDS
        if unknown:
            raise ValueError(f"{name}: unknown field(s) {sorted(unknown)}")
        if ("url" in entry) == ("service" in entry):
            raise ValueError(
                f"{name}: give url (no credential) or service (an ALWAYSON_EGRESS_SERVICES "
                "name, whose credential the gateway adds), not both or neither"
            )
        if "url" in entry and not (
            isinstance(entry["url"], str) and entry["url"].startswith(("http://", "https://"))
        ):
            raise ValueError(f"{name}.url must be an http(s) URL, not {entry['url']!r}")
        for field in ("service", "path"):
            if field in entry and not (isinstance(entry[field], str) and entry[field]):
                raise ValueError(f"{name}.{field} must be a non-empty string")
        if "path" in entry and not entry["path"].startswith("/"):
            raise ValueError(f"{name}.path must start with /, not {entry['path']!r}")
        timeout = entry.get("timeout", 30)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"{name}.timeout must be a positive number of seconds")
        if not isinstance(entry.get("approve_new", False), bool):
            raise ValueError(f"{name}.approve_new must be true or false")
    return servers


def check_mcp_servers(names) -> list | None:
    """None (every server of ALWAYSON_MCP_SERVERS) or a list of its server names."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError('mcp_servers must be a JSON list of server names, such as ["tracker"]')
    known = settings.ALWAYSON_MCP_SERVERS
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown MCP server(s) {', '.join(unknown)}; ALWAYSON_MCP_SERVERS names: "
            f"{', '.join(sorted(known)) or 'none'}"
        )
    return names


def mcp_servers_of(names) -> list[str]:
    """The MCP servers an agent connects: the chosen ones, or every configured one."""
    return sorted(settings.ALWAYSON_MCP_SERVERS) if names is None else check_mcp_servers(names)
